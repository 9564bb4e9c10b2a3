#!/usr/bin/env bash
# The runtime without the builder (issue 37): tools/run_engine's kiln_run_engine links no builder or
# frontend code, and runs an engine the kiln CLI built. CTest runs it in three steps:
#   setup WORK KILN_CLI SOURCE_DIR   the demo model (scripts/make_demo_model.py, with ONNX Runtime's
#                                    outputs), its engine from `kiln build`, the reference outputs
#                                    of `kiln run` on batch 5 (outside the opt shape)
#   links RUNNER LINKS_FILE          nothing of builder/ or frontend/ (nor protobuf) among the
#                                    runner's symbols or in its link closure (LINKS_FILE)
#   run RUNNER WORK                  the runner's outputs: bitwise those of `kiln run`, and within
#                                    1e-5 of ONNX Runtime's
set -euo pipefail
step=$1
shift

case "$step" in
  setup)
    work=$1 cli=$2 src=$3
    rm -rf "$work"
    mkdir -p "$work"
    python3 "$src/scripts/make_demo_model.py" "$work/demo" >/dev/null
    KILN_PROGRESS=0 "$cli" build --onnx="$work/demo/model.onnx" --saveEngine="$work/demo.kiln" \
      --minShapes=image:1x3x32x32 --optShapes=image:4x3x32x32 --maxShapes=image:16x3x32x32 >/dev/null
    python3 - "$work" <<'PY'
import sys
import numpy as np
import onnx
from onnx import numpy_helper
work = sys.argv[1]
for name in ("input_0", "output_0"):
    t = onnx.load_tensor(f"{work}/demo/test_data_set_1/{name}.pb")
    np.save(f"{work}/{name}.npy", numpy_helper.to_array(t))
PY
    mkdir -p "$work/ref"
    KILN_PROGRESS=0 "$cli" run --loadEngine="$work/demo.kiln" --loadInputs="image:$work/input_0.npy" \
      --exportOutput="$work/ref" >/dev/null
    test -s "$work/ref/probs.npy"
    echo "setup: demo.kiln built by the kiln CLI; reference outputs in $work/ref"
    ;;
  links)
    runner=$1 links=$2
    symbols=$(nm -C "$runner")
    # The check must be able to fail: the runner's own runtime symbols are there to be seen.
    for want in 'kiln::Engine::deserialize' 'kiln::ExecutionContext::run'; do
      if ! grep -qF "$want" <<<"$symbols"; then
        echo "FAIL: nm shows no $want in $runner (stripped, or not the runner?)"
        exit 1
      fi
    done
    banned='kiln::builder::|kiln::Builder|kiln::BuilderConfig|kiln::OptimizationProfile|kiln::TimingCache|(^|[^[:alnum:]_])onnx::|google::protobuf'
    if found=$(grep -E "$banned" <<<"$symbols"); then
      echo "FAIL: $runner holds builder or frontend code; its symbols include:"
      head -20 <<<"$found"
      exit 1
    fi
    grep -qx 'kiln_runtime' "$links" || { echo "FAIL: $links does not list kiln_runtime"; exit 1; }
    if found=$(grep -E -x 'kiln_builder|kiln_frontend_onnx|kiln_onnx_proto|.*[Pp]rotobuf.*' "$links"); then
      echo "FAIL: the runner links $(tr '\n' ' ' <<<"$found")(its link closure: $links)"
      exit 1
    fi
    echo "links: $(grep -c . <<<"$symbols") symbols, none of builder/ or frontend/; links $(tr '\n' ' ' <<<"$(grep '^kiln' "$links")")"
    ;;
  run)
    runner=$1 work=$2
    rm -rf "$work/out"
    mkdir -p "$work/out"
    "$runner" "$work/demo.kiln" "image=$work/input_0.npy" --out="$work/out"
    cmp "$work/out/probs.npy" "$work/ref/probs.npy"
    python3 - "$work" <<'PY'
import sys
import numpy as np
work = sys.argv[1]
got, want = np.load(f"{work}/out/probs.npy"), np.load(f"{work}/output_0.npy")
assert got.shape == want.shape == (5, 10), (got.shape, want.shape)
err = float(np.max(np.abs(got - want)))
assert err <= 1e-5, f"max |runner - onnxruntime| = {err}"
print(f"run: outputs bitwise equal to kiln run's; max |runner - onnxruntime| = {err:.3g}")
PY
    ;;
  *)
    echo "usage: run_engine_test.sh setup|links|run ..." >&2
    exit 2
    ;;
esac
