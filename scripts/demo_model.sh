#!/usr/bin/env bash
# make demo MODEL=tiny-llama: a served model end to end (build_profiles/models/NAME.yaml).
# Both runtimes go through the main job (scripts/demo.sh: build, publish, validate, promote to
# staging), the preferred one first so that the fallback's validation can record its
# cross-runtime parity with it. Then one node pulls the model (the engine), the engine is
# quarantined (the node moves to the bundle and says why), the quarantine is lifted (the node
# moves back), and `buildctl worth` prices the engine over the bundle. Every step is a real
# buildctl command; the traffic `worth` reads is synthetic, and said to be.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${BUILDCTL_DEMO_MODEL:?set BUILDCTL_DEMO_MODEL (make demo MODEL=NAME)}
DEMO_DIR=${BUILDCTL_DEMO_DIR:-.demo}
mkdir -p "$DEMO_DIR"
DEMO_DIR=$(cd "$DEMO_DIR" && pwd)
export BUILDCTL_STORE=${BUILDCTL_STORE:-file://$DEMO_DIR/store}
NODE="$DEMO_DIR/node-model-$MODEL"
J="$DEMO_DIR/json"
mkdir -p "$J"

RUNTIMES=$(python - "$MODEL" <<'PY'
import sys
from buildctl.core.errors import BuildctlError
from buildctl.core.settings import load_settings
from buildctl.steps.profiles import served_model_by_name
try:
    print(" ".join(served_model_by_name(load_settings(), sys.argv[1]).runtimes))
except BuildctlError as err:
    sys.exit(f"error: {err}")
PY
)
read -r -a RT <<< "$RUNTIMES"
PREFERRED=${RT[0]}
echo "== served model $MODEL: runtimes in order: ${RT[*]}"

for p in "${RT[@]}"; do
  echo
  echo "######## runtime $p: the main job (scripts/demo.sh)"
  BUILDCTL_DEMO_PROFILE=$p BUILDCTL_DEMO_DIR=$DEMO_DIR bash scripts/demo.sh
done

pull_model() {  # pull --model, printing the choice; the JSON report goes to $J/pull-model-$1.json
  buildctl pull --model "$MODEL" --channel staging --dest "$NODE" --json > "$J/pull-model-$1.json"
  python - "$J/pull-model-$1.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
print(f"   {p['model']} runs {p['runtime']} ({p['artifact_id'].split(':')[-1][:12]}, "
      + ("installed" if p["installed"] else "already current") + ("; moved" if p["moved"] else "") + f"): {p['why']}")
PY
}

echo
echo "== $MODEL. a node pulls the served model: the first runtime that fits"
pull_model 1
ENGINE=$(python -c 'import json,sys; print(json.load(open(sys.argv[1]))["artifact_id"])' "$J/pull-model-1.json")

echo "== $MODEL. the engine is quarantined (say a bad build): the node's next pull moves to the fallback"
buildctl quarantine "$ENGINE" --reason "demo: engine taken out of service" > /dev/null
pull_model 2

echo "== $MODEL. the engine is put back (repair from the node's verified copy lifts the quarantine): the node moves back"
buildctl repair "$ENGINE" --from "$NODE/versions/$ENGINE" > /dev/null
pull_model 3

echo "== $MODEL. is the engine worth it? (synthetic traffic: 20,000 requests a day, 200 tokens in and 120 out;"
echo "   2 invalidations a month assumed: the demo's history is minutes long)"
python - "$J/traffic.jsonl" <<'PY'
import json, sys
from datetime import datetime, timedelta, timezone
t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
with open(sys.argv[1], "w") as f:
    for i in range(20_000):  # one day, evenly spread
        f.write(json.dumps({"timestamp": (t0 + timedelta(seconds=i * 86400 / 20_000)).isoformat(),
                            "input_tokens": 200, "output_tokens": 120}) + "\n")
PY
buildctl worth --model "$MODEL" --channel staging --traffic "$J/traffic.jsonl" --invalidations-per-month 2
