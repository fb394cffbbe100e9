#!/usr/bin/env bash
# GPU acceptance runbook for the trtllm backend: the steps nobody has run on real hardware yet.
#
# On a GPU node, inside NVIDIA's TensorRT-LLM release container at the pinned version
# (nvcr.io/nvidia/tensorrt-llm/release:1.2.1), with buildctl installed (pip install -e '.[vllm]'
# from a checkout; vLLM provides the GPU reference):
#
#   scripts/gpu-acceptance.sh [--out DIR]
#
# It builds the tiny Llama with the real trtllm-build at TP1 (and TP2 when 2 GPUs exist),
# validates each engine against GPU vLLM, promotes it to a local staging channel, pulls it (verify
# + TensorRT preflight + atomic swap) and generates from the installed copy, then prints a report
# (also written to DIR/report.md). Exit 0 only when every step passed.
#
#   scripts/gpu-acceptance.sh --dry-run [--out DIR]
#
# runs the same steps against the contract fakes (tests/support/fakes, tests/support/fixtures/trtllm), on any
# machine: CI runs it so the runbook cannot rot. The dry run skips validation (the fake runtime's
# toy model is not the tiny Llama vLLM would serve) and promotes with --force.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
DRY=0
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --out) OUT=$2; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
OUT=${OUT:-$(mktemp -d -t buildctl-gpu-acceptance-XXXX)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export BUILDCTL_STORE="file://$OUT/store"
export BUILDCTL_PROFILE_DIR="$OUT/profiles"
mkdir -p "$BUILDCTL_PROFILE_DIR"
REPORT="$OUT/report.md"
ROWS=()
FAILED=0

detail() {  # the last line of a step's output, or the id/key in its JSON output
  python - "$1" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
try:
    data = json.loads(text)
    if "gpus" in data:  # a fingerprint
        print(f"{len(data['gpus'])} GPU(s), TensorRT-LLM {data['tensorrt_llm_version']}, TensorRT "
              f"{data['tensorrt_version']}, CUDA {data['cuda_version']}, driver {data['driver_version']}")
    else:
        print(data.get("artifact_id", ""))
except ValueError:
    print((text.strip().splitlines() or [""])[-1].replace("|", "/")[:100])
PY
}

step() {  # step NAME COMMAND...: run and time it; stdout to NAME.log, stderr to NAME.err; one report row
  local name=$1; shift
  local base="$OUT/$(echo "$name" | tr ' ' '-')" t0=$EPOCHREALTIME secs
  if "$@" >"$base.log" 2>"$base.err"; then
    secs=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
    ROWS+=("| $name | ok | $secs | $(detail "$base.log") |")
    return 0
  fi
  secs=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  ROWS+=("| $name | FAILED | $secs | $(tail -1 "$base.err" | tr '|' '/' | cut -c1-100) (log: $base.err) |")
  FAILED=1
  return 1
}

if [ "$DRY" = 1 ]; then
  MODE="DRY RUN against the contract fakes (tests/support/fakes, tests/support/fixtures/trtllm/1.2.1): no GPU, no TensorRT-LLM"
  export BUILDCTL_TRTLLM_BUILD="$REPO/tests/support/fakes/trtllm-build"
  export BUILDCTL_TRTLLM_EXAMPLES="$REPO/tests/support/fakes/trtllm/1.2.1/examples"
  export FAKE_TRTLLM_VERSION=1.2.1
  export PYTHONPATH="$REPO/tests/support/fakes/pymods${PYTHONPATH:+:$PYTHONPATH}"  # fake tensorrt, tensorrt_llm
  python - "$OUT/fingerprint.json" <<'PY'
import json, sys
from pathlib import Path
stack = json.loads(Path("tests/support/fixtures/trtllm/1.2.1/stack.json").read_text())
gpu = {"name": "NVIDIA H100 80GB HBM3", "sm": "9.0", "memory_mib": 81559}
fp = {"gpus": [gpu, gpu], "driver_version": stack["driver"], "cuda_version": stack["cuda"],
      "tensorrt_version": stack["tensorrt"], "tensorrt_llm_version": stack["tensorrt_llm"],
      "torch_version": stack["torch"], "cpu": {"machine": "x86_64", "isa_level": "x86-64-v3"},
      "platform": "linux-x86_64", "glibc_version": "2.35", "compiler_version": "gcc 11.4.0"}
Path(sys.argv[1]).write_text(json.dumps(fp))
PY
  export BUILDCTL_FINGERPRINT_FILE="$OUT/fingerprint.json"
  GPUS=2
else
  MODE="GPU node: real trtllm-build, TensorRT-LLM runtime and GPU vLLM"
  GPUS=$(nvidia-smi --list-gpus 2>/dev/null | wc -l || echo 0)
  if [ "$GPUS" -lt 1 ]; then echo "no GPU found (nvidia-smi --list-gpus); use --dry-run off GPU nodes" >&2; exit 2; fi
fi

step "fingerprint" buildctl --json fingerprint || true

profile() {  # profile TP: the tiny Llama as a trtllm fp16 engine at tensor parallel TP
  cat > "$BUILDCTL_PROFILE_DIR/tiny-llama-trtllm-tp$1.yaml" <<EOF
# Written by scripts/gpu-acceptance.sh: the tiny Llama through the production backend.
name: tiny-llama-trtllm-tp$1
model:
  tiny: {seed: 0, train_steps: 100}
  dtype: float16
engine:
  backend: trtllm
  tp_size: $1
  max_batch_size: 8
  max_input_len: 1024
  max_seq_len: 2048
reference:
  tensor_parallel_size: $1
  dtype: float16
  max_model_len: 2048
validation:
  prompt_sets: [short]
  max_tokens: 16
  top_logprobs: 5
  speed:
    min_throughput_ratio: 0.5
    max_p99_ttft_ratio: 2.0
    concurrency: [1, 4]
    input_len: 64
    output_len: 16
    num_prompts: 100
    repetitions: 6
EOF
  echo "$BUILDCTL_PROFILE_DIR/tiny-llama-trtllm-tp$1.yaml"
}

TPS="1"
[ "$GPUS" -ge 2 ] && TPS="1 2"
for TP in $TPS; do
  P=$(profile "$TP")
  NAME="tiny-llama-trtllm-tp$TP"
  step "build tp$TP" buildctl --json build "$P" || continue
  ID=$(python -c 'import json,sys; print(json.load(open(sys.argv[1]))["artifact_id"])' "$OUT/build-tp$TP.log")
  if [ "$DRY" = 1 ]; then
    ROWS+=("| validate tp$TP | skipped (dry run: the fake runtime's toy model is not what vLLM serves) | - | - |")
    step "promote tp$TP" buildctl promote "$ID" --channel staging --force --reason "gpu-acceptance dry run" || continue
  else
    step "validate tp$TP" buildctl validate "$ID" --profile "$P" || continue
    step "promote tp$TP" buildctl promote "$ID" --channel staging || continue
  fi
  step "pull tp$TP" buildctl pull --profile "$NAME" --channel staging --dest "$OUT/node-tp$TP" || continue
  step "generate tp$TP" buildctl generate "$OUT/node-tp$TP/current" --prompt-ids 1,2,3,4 --max-tokens 8 || true
done

{
  echo "# buildctl GPU acceptance report"
  echo
  echo "- mode: $MODE"
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ), host: $(hostname), GPUs: $GPUS"
  echo "- buildctl $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?'), output: $OUT"
  echo
  echo "| step | result | seconds | detail |"
  echo "|---|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
} > "$REPORT"
cat "$REPORT"
exit "$FAILED"
