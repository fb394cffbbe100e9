#!/usr/bin/env bash
# The compose stack (docker/compose.yaml): `make stack-up`, `make stack-demo`, `make stack-down`.
#
#   scripts/stack.sh up      build the CPU image if needed (scripts/images.sh cpu), start the stack,
#                            wait until the worker is healthy
#   scripts/stack.sh demo    build -> validate -> publish -> promote to staging as a run on the
#                            stack's Prefect server (started as a user would, on queue default),
#                            then pull staging on the node container and generate from it
#   scripts/stack.sh down    remove the containers, networks and volumes
#
# Environment: STACK_PROJECT (default buildctl), IMAGE_TAG (default dev), STACK_PROFILE
# (default tiny-llama-cpu), STACK_WAIT_S (default 1800: the demo's run on a 2-core machine).
set -euo pipefail
cd "$(dirname "$0")/.."
PROJECT=${STACK_PROJECT:-buildctl}
export BUILDCTL_IMAGE=buildctl-cpu:${IMAGE_TAG:-dev}
PROFILE=${STACK_PROFILE:-tiny-llama-cpu}
if docker compose version >/dev/null 2>&1; then COMPOSE=(docker compose); else COMPOSE=(docker-compose); fi
dc() { "${COMPOSE[@]}" -p "$PROJECT" -f docker/compose.yaml "$@"; }
say() { echo "stack: $*" >&2; }

health() { docker inspect --format '{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$1" 2>/dev/null || echo missing; }

up() {
  docker image inspect "$BUILDCTL_IMAGE" >/dev/null 2>&1 || IMAGE_TAG=${IMAGE_TAG:-dev} scripts/images.sh cpu
  dc up -d
  local worker; worker=$(dc ps -q cpu-worker)
  for _ in $(seq 300); do
    case $(health "$worker") in
      healthy) say "up: Prefect at http://127.0.0.1:4200, the store at http://127.0.0.1:8333 (bucket engines)"; return 0 ;;
      exited|dead|missing) break ;;
    esac
    sleep 1
  done
  dc ps >&2; dc logs --tail 30 >&2
  echo "error: the stack's worker did not become healthy" >&2
  return 1
}

demo() {
  local t0; t0=$(date +%s)
  say "build-validate-publish for $PROFILE, promote to staging: a run on the stack's server (queue default)"
  dc exec -T cpu-worker prefect deployment run build-validate-publish/build-validate-publish \
    --param "profile=$PROFILE" --param promote_to=staging --watch --watch-interval 5 \
    --watch-timeout "${STACK_WAIT_S:-1800}" >&2 \
    || { dc logs --tail 80 cpu-worker >&2
         echo "error: the build run did not complete (the worker's last lines above; the run's logs: the Prefect UI)" >&2
         return 1; }
  say "pull staging on the node (the node role's credentials)"
  dc exec -T node buildctl pull --profile "$PROFILE" --channel staging --dest /home/buildctl/engines \
    --node-id "$(dc exec -T node cat /etc/hostname | tr -d '\r\n')" >&2
  dc exec -T node buildctl --json generate /home/buildctl/engines/current --prompt-ids 1,5,9 --max-tokens 8
  say "done in $(( $(date +%s) - t0 )) s"
}

down() { dc down -v --remove-orphans; }

case "${1:-}" in
  up) up ;;
  demo) demo ;;
  down) down ;;
  *) echo "usage: scripts/stack.sh up|demo|down" >&2; exit 2 ;;
esac
