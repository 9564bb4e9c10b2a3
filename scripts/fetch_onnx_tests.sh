#!/usr/bin/env bash
# Builds the ONNX backend test corpus from the installed onnx package (the version pinned in
# requirements.txt), offline, in 20-60 s: the node tests (1884 with onnx 1.23.1) and simple are
# written by onnx's own generator (onnx.backend.test.cmd_tools) with numpy seeded, so the same onnx
# gives the same bytes; light, pytorch-converted and pytorch-operator are copied from the package.
# DEST/data/ONNX_VERSION records the onnx version it came from; another installed version
# regenerates it. Usage: scripts/fetch_onnx_tests.sh [DEST] (default build/onnx-tests).
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-build/onnx-tests}"
data_dir="$dest/data"
marker="$data_dir/ONNX_VERSION"
onnx_version="$(python3 -c 'import onnx; print(onnx.__version__)')"
if [ -f "$marker" ] && [ "$(cat "$marker")" = "$onnx_version" ]; then
  echo "fetch_onnx_tests: $data_dir already holds onnx $onnx_version's tests"
  exit 0
fi
echo "fetch_onnx_tests: generating the tests of the installed onnx $onnx_version (about a minute)"
mkdir -p "$dest"
tmp="$dest/data.tmp.$$"
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT
# onnx >= 1.23 wheels no longer ship node/ test data: the node cases live in Python
# (onnx.backend.test.case.node) and BackendTest builds them in memory. The generate-data command
# writes only the model cases (simple, real), so its writer is given the node cases as well.
# Seeding numpy makes the random inputs of the node cases the same on every run.
python3 -m onnx.backend.test.cmd_tools generate-data -o "$tmp" >/dev/null
python3 - "$tmp" <<'PY'
import argparse, os, shutil, sys, warnings
import numpy as np
import onnx
from onnx.backend.test import cmd_tools
from onnx.backend.test.loader import load_node_model_tests

out = sys.argv[1]
np.random.seed(0)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the cases' own divide-by-zero and overflow warnings
    cases = load_node_model_tests()
cmd_tools.model_test.collect_testcases = lambda: cases
cmd_tools.generate_data(argparse.Namespace(output=out))
shipped = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
for s in ("light", "pytorch-converted", "pytorch-operator"):
    shutil.copytree(os.path.join(shipped, s), os.path.join(out, s))
PY
for s in node pytorch-converted pytorch-operator simple light; do
  n=$(find "$tmp/$s" -mindepth 1 -maxdepth 1 \( -type d -o -name '*.onnx' \) 2>/dev/null | wc -l)
  echo "fetch_onnx_tests: $s: $n tests"
done
echo "$onnx_version" >"$tmp/ONNX_VERSION"
rm -rf "$data_dir" "$dest/wheel"  # wheel/: the onnx 1.22.0 download of this script's former self
mv "$tmp" "$data_dir"
trap - EXIT
