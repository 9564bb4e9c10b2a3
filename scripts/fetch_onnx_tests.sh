#!/usr/bin/env bash
# Fetches the ONNX backend test corpus: onnx 1.22.0, the last release whose wheel ships
# onnx/backend/test/data on disk (node: 1765 tests; plus pytorch-converted, pytorch-operator,
# simple and light). Usage: scripts/fetch_onnx_tests.sh [DEST] (default build/onnx-tests).
set -euo pipefail
cd "$(dirname "$0")/.."
readonly ONNX_VERSION=1.22.0
dest="${1:-build/onnx-tests}"
wheel_dir="$dest/wheel"
data_dir="$dest/data"
if [ -f "$data_dir/.complete-$ONNX_VERSION" ]; then
  echo "fetch_onnx_tests: $data_dir already holds onnx $ONNX_VERSION's tests"
  exit 0
fi
mkdir -p "$wheel_dir"
if ! ls "$wheel_dir"/onnx-"$ONNX_VERSION"-*.whl >/dev/null 2>&1; then
  echo "fetch_onnx_tests: downloading the onnx $ONNX_VERSION wheel"
  python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    -d "$wheel_dir" "onnx==$ONNX_VERSION"
fi
wheel="$(ls "$wheel_dir"/onnx-"$ONNX_VERSION"-*.whl | head -n 1)"
rm -rf "$data_dir"
mkdir -p "$data_dir"
# The wheel is a zip; python's zipfile avoids depending on unzip being installed.
python3 - "$wheel" "$data_dir" <<'PY'
import sys, zipfile, os
wheel, dest = sys.argv[1], sys.argv[2]
prefix = "onnx/backend/test/data/"
sets = ("node", "pytorch-converted", "pytorch-operator", "simple", "light")
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if not name.startswith(prefix) or name.endswith("/"):
            continue
        rel = name[len(prefix):]
        if rel.split("/", 1)[0] not in sets:
            continue
        out = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(name) as src, open(out, "wb") as dst:
            dst.write(src.read())
PY
for s in node pytorch-converted pytorch-operator simple light; do
  n=$(find "$data_dir/$s" -mindepth 1 -maxdepth 1 \( -type d -o -name '*.onnx' \) 2>/dev/null | wc -l)
  echo "fetch_onnx_tests: $s: $n tests"
done
touch "$data_dir/.complete-$ONNX_VERSION"
