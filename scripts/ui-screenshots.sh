#!/usr/bin/env bash
# Screenshots of the Prefect UI for what an on-call engineer looks at: a build-validate-publish
# run of the tiny profile while its build streams progress, then its page and its two artifacts
# (the summary and the validation table); a scrub that found a rotted blob (Failed); the heal
# that repaired it from a node's copy (its summary); the automations `buildctl alerts install`
# made; the event feed.
#
#   scripts/ui-screenshots.sh [OUT_DIR]        (default: docs/ui)
#
# Starts its own `prefect server` on a free port (PREFECT_API_URL exported first, so the UI talks
# to it), runs the flows against it, and points headless Chromium at the pages. Needs chromium
# (Debian: apt-get install chromium; or CHROMIUM=/path/to/chrome). Run it after `make install`.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/ui}
CHROMIUM=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)}
[ -n "$CHROMIUM" ] || { echo "error: no chromium; install it (apt-get install chromium) or set CHROMIUM" >&2; exit 2; }
PY=${PY:-.venv/bin/python}
WORK=$(mktemp -d)
PORT=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export PREFECT_API_URL=http://127.0.0.1:$PORT/api PREFECT_HOME=$WORK/prefect PREFECT_SERVER_ANALYTICS_ENABLED=false
export BUILDCTL_STORE=file://$WORK/store
mkdir -p "$OUT"
$PY -m prefect server start --host 127.0.0.1 --port "$PORT" > "$WORK/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true; rm -rf "$WORK"' EXIT
for _ in $(seq 90); do curl -sf "$PREFECT_API_URL/health" >/dev/null && break; sleep 1; done
UI=http://127.0.0.1:$PORT
post() {  # PATH JSON: the API's answer
  curl -sf -X POST -H 'Content-Type: application/json' -d "$2" "$PREFECT_API_URL/$1"
}
latest_run() {  # FLOW-NAME [STATE-TYPE]: the id of its newest run (in that state), or nothing
  local state=""
  [ -z "${2:-}" ] || state=", \"flow_runs\": {\"state\": {\"type\": {\"any_\": [\"$2\"]}}}"
  post flow_runs/filter "{\"limit\": 1, \"sort\": \"START_TIME_DESC\", \"flows\": {\"name\": {\"any_\": [\"$1\"]}}$state}" \
    | $PY -c 'import json,sys; r=json.load(sys.stdin); print(r[0]["id"] if r else "")'
}
shot() {  # NAME URL [HEIGHT]: let the single-page app fetch and render for 15 s of virtual time
  "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$WORK/chrome" --hide-scrollbars \
    --window-size=1400,${3:-1000} --virtual-time-budget=15000 --screenshot="$OUT/$1.png" "$2" > /dev/null 2>&1
  echo "wrote $OUT/$1.png"
}
artifact() {  # RUN SUFFIX: the id of the run's artifact whose key ends with SUFFIX
  post artifacts/filter "{\"flow_runs\": {\"id\": {\"any_\": [\"$1\"]}}}" \
    | $PY -c 'import json,sys; print(next(a["id"] for a in json.load(sys.stdin) if (a["key"] or "").endswith(sys.argv[1])))' "$2"
}

echo "== a build-validate-publish run against the server on port $PORT (about two minutes)"
$PY -m buildctl.flows.local tiny-llama-cpu --promote-to staging --out "$WORK/flow.json" > "$WORK/flow.log" 2>&1 &
FLOW=$!
RUN=
for _ in $(seq 600); do  # the running build, once its log's lines stream into the run's logs
  RUN=$(latest_run build-validate-publish RUNNING)
  [ -n "$RUN" ] && post logs/filter "{\"logs\": {\"flow_run_id\": {\"any_\": [\"$RUN\"]}}, \"limit\": 200}" \
    | grep -q "build log:" && break
  sleep 1
done
sleep 10  # a few more of its lines
[ -n "$RUN" ] && shot build-running "$UI/runs/flow-run/$RUN" 1900
wait $FLOW || { tail -20 "$WORK/flow.log"; exit 1; }
RUN=$(latest_run build-validate-publish)
shot run "$UI/runs/flow-run/$RUN"
shot summary "$UI/artifacts/artifact/$(artifact "$RUN" -summary)"
shot validation "$UI/artifacts/artifact/$(artifact "$RUN" -validation)"

echo "== a node installs the artifact; then one of its blobs rots in the store"
$PY -m buildctl pull --profile tiny-llama-cpu --channel staging --dest "$WORK/node" > /dev/null
ARTIFACT=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["artifact_id"])' "$WORK/flow.json")
$PY - "$ARTIFACT" <<'PY'
import os, sys
from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.layout import blob_key
from buildctl.artifact_store.read import get_manifest
store = open_store(os.environ["BUILDCTL_STORE"])
path = os.path.join(store.root, blob_key(get_manifest(store, sys.argv[1]).files[0].digest))
data = bytearray(open(path, "rb").read())
data[len(data) // 2] ^= 0xFF
os.chmod(path, 0o644)
open(path, "wb").write(bytes(data))
PY
echo "== scrub-store finds it (its run fails), heal-artifact repairs it from the node's copy"
$PY -c 'from buildctl.flows.scrub_store import scrub_store; scrub_store(return_state=True)' > "$WORK/scrub.log" 2>&1
shot scrub-failed "$UI/runs/flow-run/$(latest_run scrub-store)"
$PY -c 'import sys; from buildctl.flows.heal_artifact import heal_artifact; heal_artifact(sys.argv[1], repair_from=sys.argv[2])' \
  "$ARTIFACT" "$WORK/node/current" > "$WORK/heal.log" 2>&1 || { tail -20 "$WORK/heal.log"; exit 1; }
HEAL=$(latest_run heal-artifact)
shot heal-summary "$UI/artifacts/artifact/$(artifact "$HEAL" "heal-${ARTIFACT:9:16}")"

echo "== the alerts"
$PY -m buildctl alerts install --webhook-url http://127.0.0.1:9/buildctl-alerts > /dev/null
shot automations "$UI/automations"
shot events "$UI/events"
