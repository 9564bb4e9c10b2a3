#!/usr/bin/env bash
# Run on the GPU host from the repository root: builds kiln with the CUDA backend (Release, -j16,
# sm_90 unless KILN_CUDA_ARCH says otherwise), runs the whole test suite and then the CUDA tests,
# compute-sanitizer memcheck on a short CUDA subset, and the ONNX node tests on CUDA. The
# benchmark is scripts/gpu_perf.sh. Models come from KILN_MODELS_DIR
# (default .gpu_models, git-ignored; the shared models are not copied by this script). Logs go
# to $OUT when set, else build-gpu/logs. KILN_GPU_SKIP_BUILD=1 reuses an existing build-gpu;
# KILN_GPU_PARTS picks among "tests memcheck nodes accuracy python" (all five by default), so a
# command stays within a time limit. "python": the Python package with the CUDA backend (the
# extension of this build, the package's sources beside it) runs the Python tests on the GPU:
# torch and CuPy device tensors in and out, streams, kiln.torch on CUDA (python/tests/test_gpu.py,
# test_torch_cuda.py), torchvision's detection models on CUDA against ONNX Runtime
# (test_detection.py; KILN_PY_GPU_TESTS names other files), then the whole Python suite
# (KILN_PY_ALL=0 leaves it out). KILN_GPU_TESTS_ALL=0 runs only the CUDA tests of "tests" (the CPU
# ones run in CI; the whole suite takes ~470 s on the H200 host). "accuracy": the fused transformer engines (BERT-base and GPT-2 with
# real padding masks, ViT-B/16) against ONNX Runtime FP32 with `kiln compare`, in FP16, BF16 and
# strict FP32 (bench/transformer_accuracy.py exports them; torch and transformers needed). (The OOM test is left out of memcheck: its intended cudaMalloc failure counts as an
# API error.)
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-build-gpu/logs}
mkdir -p "$LOG"
export KILN_MODELS_DIR=${KILN_MODELS_DIR:-$PWD/.gpu_models}
# The GPU host has no network: the cuDNN frontend headers travel in .gpu_models/cudnn_frontend/include
# (copy the include/ folder of this machine's nvidia-cudnn-frontend package there) unless pip has them.
if [ -z "${KILN_CUDNN_FRONTEND_INCLUDE_DIR:-}" ] && [ -f .gpu_models/cudnn_frontend/include/cudnn_frontend.h ]; then
  export KILN_CUDNN_FRONTEND_INCLUDE_DIR=$PWD/.gpu_models/cudnn_frontend/include
fi
BUILD=${KILN_GPU_BUILD_DIR:-build-gpu}
status() { printf '%-34s %s\n' "$1" "$2" | tee -a "$LOG/summary.txt"; }
: > "$LOG/summary.txt"

nvidia-smi -L 2>&1 | tee -a "$LOG/summary.txt"
if [ "${KILN_GPU_SKIP_BUILD:-0}" != 1 ]; then
  # The Python extension too (for the "python" part) where this python3 has nanobind.
  PYEXT=OFF; python3 -m nanobind --cmake_dir >/dev/null 2>&1 && PYEXT=ON
  if ! cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_TESTS=ON \
      -DKILN_BUILD_PYTHON=$PYEXT -DPython_EXECUTABLE="$(command -v python3)" \
      -DCMAKE_CUDA_ARCHITECTURES="${KILN_CUDA_ARCH:-90}" >"$LOG/configure.log" 2>&1; then
    status configure "FAILED (see configure.log)"; tail -20 "$LOG/configure.log"; exit 1
  fi
  if ! cmake --build "$BUILD" -j16 >"$LOG/build.log" 2>&1; then
    status build "FAILED (see build.log)"; grep -E "error|FAILED" "$LOG/build.log" | head -20; exit 1
  fi
  status build ok
fi
T=$BUILD/tests/kiln_tests
PARTS=" ${KILN_GPU_PARTS:-tests memcheck nodes accuracy python} "

if [[ $PARTS == *" tests "* ]]; then
if [ "${KILN_GPU_TESTS_ALL:-1}" != 0 ]; then
  "$T" >"$LOG/tests_all.log" 2>&1; rc=$?
  status "kiln_tests (all)" "rc=$rc $(grep -E '^\[  (PASSED|FAILED)  \]' "$LOG/tests_all.log" | tr '\n' ' ')"
fi
"$T" --gtest_filter='*cuda*:*Cuda*' >"$LOG/tests_cuda.log" 2>&1; rc=$?
status "kiln_tests (cuda)" "rc=$rc $(grep -E '^\[  (PASSED|FAILED)  \]' "$LOG/tests_cuda.log" | tr '\n' ' ')"
grep -E '^\[cuda|^\[cpu|FAILED  \]' "$LOG/tests_cuda.log" | tee -a "$LOG/summary.txt"
fi

if [[ $PARTS != *" memcheck "* ]]; then
  :
elif command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 9 "$T" \
    --gtest_filter='All/SharedModel.*/*_cuda:Devices/SeedVitDynamicBatch.*/cuda_graph:CudaErrors.BadInputs*' \
    >"$LOG/memcheck.log" 2>&1; rc=$?
  status "compute-sanitizer memcheck" "rc=$rc $(grep -E 'ERROR SUMMARY' "$LOG/memcheck.log" | tail -1)"
  # Every op-harness case (each runs a one-node CUDA engine against the CPU reference).
  timeout "${KILN_MEMCHECK_OPS_TIMEOUT:-240}" compute-sanitizer --tool memcheck --error-exitcode 9 "$T" \
    --gtest_filter='*Kernel.*:SpatialOps.*:OpCoverage.*' >"$LOG/memcheck_ops.log" 2>&1; rc=$?
  status "memcheck (op harness)" "rc=$rc $(grep -E 'ERROR SUMMARY' "$LOG/memcheck_ops.log" | tail -1)"
  # The stress test on CUDA: 4 contexts (each its own stream) x 4 threads, results bitwise against
  # single-thread runs, under memcheck (KILN_GPU_STRESS_SECONDS, default 60).
  KILN_STRESS_SECONDS=${KILN_GPU_STRESS_SECONDS:-60} KILN_STRESS_CONTEXTS=4 KILN_STRESS_THREADS=4 \
    compute-sanitizer --tool memcheck --error-exitcode 9 "$T" --gtest_filter='Devices/Stress.*/cuda' \
    >"$LOG/stress_cuda.log" 2>&1; rc=$?
  status "stress (cuda, memcheck)" "rc=$rc $(grep -E '^\[ stress \]' "$LOG/stress_cuda.log" | tail -1) $(grep -E 'ERROR SUMMARY' "$LOG/stress_cuda.log" | tail -1)"
else
  status "compute-sanitizer memcheck" "not found"
fi

# The node tests on the GPU: the same corpus and exclusions as the CPU run, every node built for
# CUDA. The corpus is written from the host's onnx package (offline) unless KILN_ONNX_TESTS names one.
CORPUS=${KILN_ONNX_TESTS:-$BUILD/onnx-tests/data}
if [[ $PARTS == *" nodes "* ]] && [ -z "${KILN_ONNX_TESTS:-}" ] && [ ! -d "$CORPUS/node" ]; then
  bash scripts/fetch_onnx_tests.sh "$BUILD/onnx-tests" >"$LOG/fetch_onnx_tests.log" 2>&1
fi
if [[ $PARTS != *" nodes "* ]]; then
  :
elif [ -x "$BUILD/tests/conformance/kiln_node_tests" ] && [ -d "$CORPUS/node" ]; then
  NT="$BUILD/tests/conformance/kiln_node_tests"
  "$NT" --device=cpu --data="$CORPUS" --manifest=tests/conformance/exclusions.txt \
    --json="$LOG/node_tests_cpu.json" >"$LOG/node_tests_cpu.log" 2>&1
  status "node tests (cpu)" "$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$LOG/node_tests_cpu.log")"
  "$NT" --device=cuda --data="$CORPUS" --manifest=tests/conformance/exclusions.txt \
    --manifest=tests/conformance/exclusions_cuda.txt --verbose --json="$LOG/node_tests_cuda.json" \
    --ops-tsv="$LOG/ops_cuda.tsv" >"$LOG/node_tests_cuda.log" 2>&1; rc=$?
  # docs/ops.md's CUDA columns are made from this file (copy it to docs/ops_cuda.tsv, then
  # scripts/gen_ops_doc.sh); its header names the GPU and the date.
  [ -f "$LOG/ops_cuda.tsv" ] && sed -i "1s/\$/ on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date +%F)/" "$LOG/ops_cuda.tsv"
  status "node tests (cuda)" "rc=$rc $(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$LOG/node_tests_cuda.log")"
  # Every test that passes on the CPU and not on CUDA must be in exclusions_cuda.txt.
  python3 scripts/compare_node_runs.py "$LOG/node_tests_cpu.json" "$LOG/node_tests_cuda.json" \
    >"$LOG/node_tests_diff.txt" 2>&1; rc=$?
  status "node tests (cpu vs cuda)" "rc=$rc $(tail -1 "$LOG/node_tests_diff.txt")"
  gzip -f "$LOG/node_tests_cpu.json" "$LOG/node_tests_cuda.json"
else
  status "node tests (cuda)" "skipped: no corpus at $CORPUS (see $LOG/fetch_onnx_tests.log)"
fi

# The fused transformer engines against ONNX Runtime FP32: cosine >= 0.999 per output in FP16 and
# BF16, and strict FP32 (--noTF32) within |a-e| <= 1e-4 + 1e-3*|e| (kiln compare's FP32 defaults),
# on inputs with padded rows; each engine spans a profile around the shape run. `kiln inspect`
# of each FP16 engine shows the fused attention layers and what each replaced.
if [[ $PARTS == *" accuracy "* ]]; then
  ACC=$BUILD/accuracy-models
  if ! python3 bench/transformer_accuracy.py export "$ACC" >"$LOG/accuracy_export.log" 2>&1; then
    status "accuracy (export)" "FAILED: $(tail -1 "$LOG/accuracy_export.log")"
  else
    for m in bert_base_mask gpt2_mask vit_b_16; do
      mapfile -t flags < <(python3 - "$ACC/$m.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
spec = lambda k: ",".join(f"{n}:{'x'.join(map(str, p[k]))}" for n, p in j["profile"].items())
print(f"--minShapes={spec(0)}"); print(f"--optShapes={spec(1)}"); print(f"--maxShapes={spec(2)}")
print("--loadInputs=" + ",".join(f"{n}:{f}" for n, f in j["inputs"].items()))
print("--onnx=" + j["model"])
PY
)
      for prec in fp16 bf16 fp32; do
        case $prec in fp16) pf=--fp16 ;; bf16) pf=--bf16 ;; fp32) pf=--noTF32 ;; esac
        timeout 300 "$BUILD/tools/kiln/kiln" compare --device=cuda $pf "${flags[@]}" \
          >"$LOG/accuracy.$m.$prec.log" 2>&1; rc=$?
        status "accuracy $m $prec" "rc=$rc $(grep -E '^out ' "$LOG/accuracy.$m.$prec.log" | awk '{print "max_abs " $3 " cosine " $7 " " $NF}') $(tail -1 "$LOG/accuracy.$m.$prec.log" | cut -c1-60)"
      done
      "$BUILD/tools/kiln/kiln" build --device=cuda --fp16 "${flags[@]:0:3}" "${flags[4]}" \
        --saveEngine="$ACC/$m.fp16.kiln" >"$LOG/accuracy.$m.build.log" 2>&1 &&
        "$BUILD/tools/kiln/kiln" inspect "$ACC/$m.fp16.kiln" >"$LOG/inspect.$m.fp16.txt" 2>&1
      status "inspect $m fp16" "$(grep -hE '^  by op:|^fused layers' "$LOG/inspect.$m.fp16.txt" 2>/dev/null | cut -c1-220 | tr '\n' ' ')"
    done
  fi
fi

# The Python package built with the CUDA backend, on the GPU: the device-tensor tests first (each
# prints why where it skips), then the whole suite.
if [[ $PARTS == *" python "* ]]; then
  SITE=${TMPDIR:-/tmp}/kiln-gpu-site
  rm -rf "$SITE" && mkdir -p "$SITE" && cp -r python/kiln "$SITE/"
  if ! ls "$BUILD"/python/_kiln*.so >/dev/null 2>&1 ||
      ! cmake --install "$BUILD" --component python --prefix "$SITE" >"$LOG/python_install.log" 2>&1; then
    status "python (cuda)" "FAILED: the extension was not built (nanobind missing?) or did not install"
  else
    # The package's metadata, as pip writes it: torch finds the "kiln" torch.compile backend
    # through its torch_dynamo_backends entry point.
    python3 - "$SITE" <<'PY'
import pathlib, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
info = pathlib.Path(sys.argv[1]) / f"kiln-{project['version']}.dist-info"
info.mkdir()
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: kiln\nVersion: {project['version']}\n")
(info / "entry_points.txt").write_text("".join(
    f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for group, eps in project["entry-points"].items()))
PY
    (cd python/tests && PYTHONPATH="$SITE" KILN_MODELS_DIR="$KILN_MODELS_DIR" python3 -m pytest -q -rs -s \
      -p no:cacheprovider ${KILN_PY_GPU_TESTS:-test_gpu.py test_torch_cuda.py test_detection.py}) >"$LOG/python_gpu.log" 2>&1; rc=$?
    status "python gpu tests" "rc=$rc $(grep -E '(passed|failed|skipped|error)' "$LOG/python_gpu.log" | tail -1)"
    grep -oE "UNet FP16 on CUDA.*|FAILED.*|[A-Za-z]*Error.*" "$LOG/python_gpu.log" | head -20 | tee -a "$LOG/summary.txt"
    if [ "${KILN_PY_ALL:-1}" = 1 ]; then
    (cd python/tests && PYTHONPATH="$SITE" KILN_MODELS_DIR="$KILN_MODELS_DIR" timeout "${KILN_PY_ALL_TIMEOUT:-400}" python3 -m pytest -q -rs \
      -p no:cacheprovider .) >"$LOG/python_all.log" 2>&1; rc=$?
    status "python (all)" "rc=$rc $(grep -E '(passed|failed|skipped|error)' "$LOG/python_all.log" | tail -1)"
    fi
  fi
fi
