#!/usr/bin/env bash
# The onnx_node_tests CTest test: makes the ONNX test corpus (from the installed onnx), runs
# kiln_node_tests with the exclusion manifest, prints its table and final line, and fails below
# the pass threshold.
# Usage: run.sh KILN_NODE_TESTS CORPUS_DIR MIN_PASS
set -euo pipefail
runner="$1"
corpus="$2"
min_pass="$3"
here="$(cd "$(dirname "$0")" && pwd)"
bash "$here/../../scripts/fetch_onnx_tests.sh" "$corpus"
# The output is also kept in $corpus/summary.txt: CTest hides a passing test's output, and
# scripts/test.sh prints the summary from there so CI shows the count.
set +e
"$runner" --data="$corpus/data" --manifest="$here/exclusions.txt" --min-pass="$min_pass" \
  >"$corpus/output.txt" 2>&1
rc=$?
set -e
cat "$corpus/output.txt"
grep -E "^(light|pytorch-converted|pytorch-operator|simple): |^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$" \
  "$corpus/output.txt" >"$corpus/summary.txt" || true
exit $rc
