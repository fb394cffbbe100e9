#!/usr/bin/env bash
# The main job on the embedded defaults. Each step is a real buildctl command.
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO_DIR=${BUILDCTL_DEMO_DIR:-.demo}
mkdir -p "$DEMO_DIR"
PROFILE=build_profiles/tiny-llama-cpu.yaml

echo "== 1. fingerprint this host"
buildctl fingerprint
buildctl fingerprint --json > "$DEMO_DIR/fingerprint.json"

echo "== 2. check the build profiles"
buildctl profile check build_profiles/*.yaml

echo "== 3. the embedded default profile, resolved"
buildctl profile show "$PROFILE" | head -5
