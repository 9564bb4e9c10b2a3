#!/usr/bin/env bash
# Run on the GPU host from the repository root, after scripts/gpu.sh built build-gpu: kiln's
# latency per shared model with device-resident IO (CUDA graph and plain stream), then PyTorch on
# the same architectures in the same run (eager, and torch.compile where it is installed), medians
# after warm-up. Logs go to $OUT when set, else build-gpu/logs.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-build-gpu/logs}
mkdir -p "$LOG"
export KILN_MODELS_DIR=${KILN_MODELS_DIR:-$PWD/.gpu_models}
BUILD=${KILN_GPU_BUILD_DIR:-build-gpu}
ITERS=${KILN_BENCH_ITERS:-100}
nvidia-smi -L 2>&1 | tee "$LOG/bench.log"
if [ -x "$BUILD/bench/gpu_bench" ]; then
  "$BUILD/bench/gpu_bench" "$KILN_MODELS_DIR" "$ITERS" >>"$LOG/bench.log" 2>&1
  if python3 -c "import torch, torchvision" 2>/dev/null; then
    python3 bench/torch_peer.py "$ITERS" >>"$LOG/bench.log" 2>&1
  else
    echo "PyTorch peer skipped: torch/torchvision not importable" >>"$LOG/bench.log"
  fi
  echo "== benchmark (median ms; kiln: device-resident IO, execute() incl. sync; torch: eager + sync)" 
  cat "$LOG/bench.log"
else
  echo "gpu_perf: $BUILD/bench/gpu_bench is missing: run scripts/gpu.sh first" >&2
  exit 1
fi
