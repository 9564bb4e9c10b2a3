#!/usr/bin/env bash
# Installs dependencies, builds kiln with its tests, and runs them. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_TESTS=ON >/dev/null
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)"
# The ONNX node test count (tests/conformance/run.sh keeps it; CTest hides passing output).
if [ -f build/onnx-tests/summary.txt ]; then echo "ONNX backend tests:"; cat build/onnx-tests/summary.txt; fi
# The Python package: `pip install .` rebuilds the library in build-python/ through the same ccache
# (mostly hits), Release, -j$(nproc); without the CUDA backend, which the C++ build above already
# compiled and which the bindings cannot feed yet (they take host memory only).
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" python3 -m pip install -q --no-build-isolation \
  --disable-pip-version-check --root-user-action=ignore -Ccmake.define.KILN_CUDA=OFF ./
python3 -m pytest -q python/tests
