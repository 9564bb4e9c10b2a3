#!/usr/bin/env bash
# Regenerates docs/ops.md from the op and kernel registries plus the ONNX node test results
# (kiln_node_tests --list-ops). Usage: scripts/gen_ops_doc.sh [BUILD_DIR] (default build).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
runner="$build/tests/conformance/kiln_node_tests"
if [ ! -x "$runner" ]; then
  echo "gen_ops_doc: $runner is missing; build it first (ninja -C $build kiln_node_tests)" >&2
  exit 1
fi
bash scripts/fetch_onnx_tests.sh "$build/onnx-tests"
# The CUDA columns come from the last GPU run's per-op results (scripts/gpu.sh writes ops_cuda.tsv;
# docs/ops_cuda.tsv is its copy in the repository).
cuda=()
[ -f docs/ops_cuda.tsv ] && cuda=(--cuda-results=docs/ops_cuda.tsv)
"$runner" --data="$build/onnx-tests/data" --manifest=tests/conformance/exclusions.txt \
  --list-ops=docs/ops.md "${cuda[@]}" >/dev/null
echo "gen_ops_doc: wrote docs/ops.md"
