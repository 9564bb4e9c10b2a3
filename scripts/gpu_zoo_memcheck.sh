#!/usr/bin/env bash
# Run on the GPU host after scripts/zoo.py exported the zoo (build-gpu/zoo): compute-sanitizer
# memcheck over three zoo models (a CNN, a mobile CNN with squeeze-excitation, a transformer) built
# for CUDA in FP16 and run once at batch 2. Logs go to $OUT (or build-gpu/logs)/zoo_memcheck.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-build-gpu/logs}/zoo_memcheck
mkdir -p "$LOG"
ZOO=${KILN_ZOO_DIR:-build-gpu/zoo}
KILN=${KILN_GPU_BUILD_DIR:-build-gpu}/tools/kiln/kiln
for spec in resnet50:x:2x3x224x224 mobilenet_v3_large:x:2x3x224x224 distilbert:input_ids:2x64; do
  name=${spec%%:*}
  shape=${spec#*:}
  model=$ZOO/$name.dynamo.onnx
  [ -f "$model" ] || { echo "$name: $model is missing (run scripts/zoo.py --phase export)"; continue; }
  compute-sanitizer --tool memcheck --error-exitcode 9 "$KILN" run --onnx="$model" --device=cuda --fp16 \
    --shapes="$shape" >"$LOG/$name.log" 2>&1
  echo "$name memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$LOG/$name.log" | tail -1)"
done
