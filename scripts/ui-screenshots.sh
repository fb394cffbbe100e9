#!/usr/bin/env bash
# Screenshots of the Prefect UI for one build-validate-publish run of the tiny profile:
# the run page, its two artifacts (the summary and the validation table) and the event feed.
#
#   scripts/ui-screenshots.sh [OUT_DIR]        (default: docs/ui)
#
# Starts its own `prefect server` on a free port (PREFECT_API_URL exported first, so the UI talks
# to it), runs the flow against it, and points headless Chromium at the pages. Needs chromium
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
echo "== a build-validate-publish run against the server on port $PORT (about a minute)"
$PY -m buildctl.flows.local tiny-llama-cpu --promote-to staging --out "$WORK/flow.json" > "$WORK/flow.log" 2>&1 \
  || { tail -20 "$WORK/flow.log"; exit 1; }
RUN=$(curl -sf -X POST -H 'Content-Type: application/json' -d '{"limit": 1, "sort": "START_TIME_DESC"}' \
      "$PREFECT_API_URL/flow_runs/filter" | $PY -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
UI=http://127.0.0.1:$PORT
shot() {  # NAME URL: let the single-page app fetch and render for 15 s of virtual time
  "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$WORK/chrome" --hide-scrollbars \
    --window-size=1600,1000 --virtual-time-budget=15000 --screenshot="$OUT/$1.png" "$2" > /dev/null 2>&1
  echo "wrote $OUT/$1.png"
}
artifact() {  # the id of this run's artifact whose key ends with $1
  curl -sf -X POST -H 'Content-Type: application/json' -d "{\"flow_runs\": {\"id\": {\"any_\": [\"$RUN\"]}}}" \
    "$PREFECT_API_URL/artifacts/filter" | $PY -c 'import json,sys; print(next(a["id"] for a in json.load(sys.stdin) if (a["key"] or "").endswith(sys.argv[1])))' "$1"
}
shot run "$UI/runs/flow-run/$RUN"
shot summary "$UI/artifacts/artifact/$(artifact -summary)"
shot validation "$UI/artifacts/artifact/$(artifact -validation)"
shot events "$UI/events"
