#!/usr/bin/env bash
# The benchmark, run on the GPU host from the repository root after scripts/gpu.sh built build-gpu.
# Exports ResNet-50, MobileNetV3-Large, ViT-B/16 and BERT-base (seq 128) with seeded random weights
# (bench/perf_models.py), builds kiln engines for batch 1..64 (opt 64) in TF32 and FP16, times them
# with device-resident IO in CUDA graphs (kiln bench --useCudaGraph --noDataTransfers), then
# PyTorch FP16 on the same models in the same run (bench/torch_peer.py: eager and torch.compile),
# and writes docs/performance.md (bench/perf_report.py). Medians over KILN_BENCH_ITERS runs (200).
# KILN_PERF_MODELS and KILN_PERF_TORCH_MODES narrow the run (KILN_PERF_TORCH=0 times kiln alone);
# logs go to $OUT, else build-gpu/perf.
# KILN_PERF_NCU=1 also profiles each FP16 engine at batch 64 under ncu (kernel times, no clock
# control) and writes where the time goes to profile.MODEL.txt (bench/ncu_summary.py).
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-build-gpu/perf}
mkdir -p "$LOG"
BUILD=${KILN_GPU_BUILD_DIR:-build-gpu}
KILN=$BUILD/tools/kiln/kiln
ITERS=${KILN_BENCH_ITERS:-200}
MODELS=${KILN_PERF_MODELS:-resnet50 mobilenet_v3_large vit_b_16 bert_base_s128}
DIR=$BUILD/perf-models
[ -x "$KILN" ] || { echo "gpu_perf: $KILN is missing: run scripts/gpu.sh first" >&2; exit 1; }
nvidia-smi -L 2>&1 | tee "$LOG/perf.log"
python3 -c "import torch; print(f'torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}')" \
  >"$LOG/versions.txt" 2>/dev/null || echo "torch not importable" >"$LOG/versions.txt"
python3 bench/perf_models.py export "$DIR" $MODELS >>"$LOG/perf.log" 2>&1 || { tail -20 "$LOG/perf.log"; exit 1; }

: >"$LOG/kiln_builds.jsonl"
for m in $MODELS; do
  read -r input shape < <(python3 -c "import json;j=json.load(open('$DIR/$m.json'));print(j['input'],'x'.join(map(str,j['shape'])))")
  for prec in fp16 tf32; do
    engine=$DIR/$m.$prec.kiln
    cache=$DIR/$m.$prec.timing-cache
    rm -f "$cache"
    flags=(--onnx="$DIR/$m.onnx" --device=cuda --minShapes="$input:1x$shape" --optShapes="$input:64x$shape"
           --maxShapes="$input:64x$shape" --timingCacheFile="$cache")
    [ $prec = fp16 ] && flags+=(--fp16)
    # Built twice: the first build times the tactics and writes the timing cache, the second reads
    # it; the report gives both build times and whether the two engine files are byte-identical.
    t0=$(date +%s.%N)
    if ! "$KILN" build "${flags[@]}" --saveEngine="$engine" >"$LOG/build.$m.$prec.log" 2>&1; then
      echo "kiln build $m $prec FAILED: $(tail -3 "$LOG/build.$m.$prec.log")" | tee -a "$LOG/perf.log"; continue
    fi
    secs=$(python3 -c "import time;print(round(time.time()-$t0,1))")
    t0=$(date +%s.%N)
    "$KILN" build "${flags[@]}" --saveEngine="$engine.cached" >"$LOG/build.$m.$prec.cached.log" 2>&1
    cached_secs=$(python3 -c "import time;print(round(time.time()-$t0,1))")
    identical=false
    cmp -s "$engine" "$engine.cached" && identical=true
    act=$("$KILN" inspect "$engine" 2>/dev/null | grep -m1 -i "activation memory" | sed 's/^ *//')
    echo "{\"model\": \"$m\", \"prec\": \"$prec\", \"build_s\": $secs, \"cached_build_s\": $cached_secs, \"identical\": $identical, \"activation\": \"$act\"}" >>"$LOG/kiln_builds.jsonl"
    echo "kiln $m $prec: built in $secs s, again with the timing cache in $cached_secs s, engines identical: $identical" | tee -a "$LOG/perf.log"
    for b in 1 64; do
      "$KILN" bench --loadEngine="$engine" --shapes="$input:${b}x$shape" --useCudaGraph --noDataTransfers \
        --iterations="$ITERS" --warmUp=500 --exportTimes="$LOG/kiln.$m.$prec.b$b.json" >"$LOG/bench.$m.$prec.b$b.log" 2>&1 \
        || echo "kiln bench $m $prec b$b FAILED: $(tail -3 "$LOG/bench.$m.$prec.b$b.log")" | tee -a "$LOG/perf.log"
      echo "kiln $m $prec batch $b: $(grep -m1 'latency (ms)' "$LOG/bench.$m.$prec.b$b.log")" | tee -a "$LOG/perf.log"
    done
    if [ "${KILN_PERF_NCU:-0}" = 1 ] && [ $prec = fp16 ] && command -v ncu >/dev/null; then
      # bench runs the engine twice here: one check run, then the one timed iteration.
      timeout 240 ncu --clock-control none --metrics gpu__time_duration.sum --csv "$KILN" bench \
        --loadEngine="$engine" --shapes="$input:64x$shape" --noDataTransfers --iterations=1 --warmUp=0 \
        >"$LOG/ncu.$m.csv" 2>"$LOG/ncu.$m.err" &&
        python3 bench/ncu_summary.py "$LOG/ncu.$m.csv" 2 20 >"$LOG/profile.$m.txt" 2>&1
      head -12 "$LOG/profile.$m.txt" 2>/dev/null | sed "s/^/profile $m fp16 b64: /" | tee -a "$LOG/perf.log"
    fi
  done
done

: >"$LOG/torch.jsonl"
if [ "${KILN_PERF_TORCH:-1}" = 0 ]; then
  echo "PyTorch peer skipped: KILN_PERF_TORCH=0" | tee -a "$LOG/perf.log"
elif python3 -c "import torch, torchvision, transformers" 2>/dev/null; then
  for m in $MODELS; do
    for spec in "1:eager reduce-overhead" "64:eager default max-autotune"; do
      b=${spec%%:*}; modes=${spec#*:}
      [ -n "${KILN_PERF_TORCH_MODES:-}" ] && modes=$KILN_PERF_TORCH_MODES
      python3 bench/torch_peer.py "$ITERS" "$b" "$m" $modes 2>>"$LOG/torch.err" | tee -a "$LOG/torch.jsonl"
    done
  done
else
  echo "PyTorch peer skipped: torch, torchvision or transformers not importable" | tee -a "$LOG/perf.log"
fi
python3 bench/perf_report.py "$LOG" docs/performance.md "scripts/gpu_perf.sh" | tee -a "$LOG/perf.log"
cp docs/performance.md "$LOG/performance.md"
