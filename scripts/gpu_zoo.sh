#!/usr/bin/env bash
# Run on the GPU host after scripts/gpu.sh built build-gpu: the model zoo a new user tries.
# bench/zoo_export.py exports real architectures (torchvision CNNs and ViT/Swin, BERT-base,
# GPT-2; seeded random weights) with a dynamic batch through torch.onnx.export; each is built for
# CUDA with the profile batch 1..16 (opt 4) and compared at batch 4 with ONNX Runtime's CPU FP32
# outputs by `kiln compare`, in strict FP32 (--noTF32) and in FP16 (--fp16, tolerances of FP16).
# Prints one line per model and precision; logs go to $OUT (or build-gpu/logs)/zoo.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-build-gpu/logs}/zoo
mkdir -p "$LOG"
BUILD=${KILN_GPU_BUILD_DIR:-build-gpu}
ZOO=${KILN_ZOO_DIR:-$BUILD/zoo}
KILN=$BUILD/tools/kiln/kiln
[ -x "$KILN" ] || { echo "gpu_zoo: $KILN is missing: run scripts/gpu.sh first" >&2; exit 1; }
python3 bench/zoo_export.py "$ZOO" "$@" | tee "$LOG/export.log"
printf '%-20s %-5s %s\n' model prec result | tee "$LOG/summary.txt"
while read -r name status spec; do
  if [ "$status" != exported ]; then
    printf '%-20s %-5s %s\n' "$name" - "export failed (see export.log)" | tee -a "$LOG/summary.txt"
    continue
  fi
  input=${spec%%:*}
  dims=${spec#*:}
  rest=${dims#1x}
  for prec in fp32 fp16; do
    flags=--noTF32
    [ "$prec" = fp16 ] && flags=--fp16
    "$KILN" compare --onnx="$ZOO/$name.onnx" --device=cuda $flags \
      --minShapes="$input:1x$rest" --optShapes="$input:4x$rest" --maxShapes="$input:16x$rest" \
      --loadInputs="$input:$ZOO/$name.input.npy" >"$LOG/$name.$prec.log" 2>&1
    rc=$?
    if [ $rc -le 1 ] && grep -qE '^(PASS|FAIL):' "$LOG/$name.$prec.log"; then
      # The verdict and the worst output's max_abs and cosine.
      line=$(grep -E '^(PASS|FAIL):' "$LOG/$name.$prec.log" | tail -1)
      worst=$(awk '/^output /{t=1; next} t && NF>=8 {print "max_abs " $3 " cosine " $7; exit}' "$LOG/$name.$prec.log")
      printf '%-20s %-5s %s (%s)\n' "$name" "$prec" "$line" "$worst" | tee -a "$LOG/summary.txt"
    else
      why=$(grep -m1 -iE 'error|no kernel|unsupported|failed' "$LOG/$name.$prec.log" | cut -c1-220)
      printf '%-20s %-5s does not build/run: %s\n' "$name" "$prec" "$why" | tee -a "$LOG/summary.txt"
    fi
  done
done < <(grep -E ' (exported|failed:)' "$LOG/export.log" | sed 's/ failed:.*/ failed/')
