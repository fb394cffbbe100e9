#!/bin/sh
# The stack's node: report this host to the store's inventory, then pull the channel every
# NODE_INTERVAL_S seconds (verify, preflight, atomic swap, keep the previous version). A failed
# pull is reported by buildctl itself (exit code and the store's inventory); the loop goes on.
set -u
: "${NODE_PROFILE:=tiny-llama-cpu}" "${NODE_CHANNEL:=staging}" "${NODE_DEST:=/home/buildctl/engines}" "${NODE_INTERVAL_S:=60}"
buildctl node report --node-id "$(cat /etc/hostname)" --profiles "$NODE_PROFILE" || echo "node report failed (exit $?)" >&2
while :; do
  buildctl pull --profile "$NODE_PROFILE" --channel "$NODE_CHANNEL" --dest "$NODE_DEST" --node-id "$(cat /etc/hostname)" \
    || echo "pull exited $? (nothing on $NODE_CHANNEL yet exits 3)" >&2
  sleep "$NODE_INTERVAL_S"
done
