#!/bin/sh
# The images' entrypoint: `buildctl ARGS`, except for the programs a role runs by name.
# A Kubernetes Job from Prefect's worker passes `prefect flow-run execute` as the container's
# args; the compose stack runs `prefect server start`, `weed server ...` and `buildctl worker start`.
case "$1" in
  prefect|weed|python|python3|sh|bash|buildctl) exec "$@" ;;
  *) exec buildctl "$@" ;;
esac
