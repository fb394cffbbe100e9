#!/usr/bin/env bash
# The main job on the embedded defaults. Each step is a real buildctl command.
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO_DIR=${BUILDCTL_DEMO_DIR:-.demo}
mkdir -p "$DEMO_DIR"
export BUILDCTL_STORE=${BUILDCTL_STORE:-file://$PWD/$DEMO_DIR/store}
PROFILE=build_profiles/tiny-llama-cpu.yaml

echo "== 1. make the tiny model (cached after the first run)"
buildctl model make-tiny "$DEMO_DIR/model-copy-$$" && rm -rf "$DEMO_DIR/model-copy-$$"

echo "== 2. fingerprint this host"
buildctl fingerprint

echo "== 3+4. build the aoti engine, checksum and publish it (a cache hit on the second run)"
ARTIFACT=$(buildctl build "$PROFILE")
buildctl verify "$ARTIFACT" --deep
buildctl show "$ARTIFACT"
