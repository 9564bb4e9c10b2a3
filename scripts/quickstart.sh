#!/usr/bin/env bash
# Installs dependencies, builds kiln, generates the bundled demo model (a small CNN classifier
# with a dynamic batch, references from ONNX Runtime), then builds an engine for batch 1..16 and
# runs it at two batch sizes, printing its IO, output shapes and agreement with the reference.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache keys on paths relative to the checkout, so a fresh clone (CI) reuses an earlier build's
# objects, and the Python package's build (build-python-*, one level down like build/) reuses the
# C++ build's.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_TESTS=ON >/dev/null
cmake --build build -j"$(nproc)" --target kiln_quickstart
python3 scripts/make_demo_model.py models/generated/demo_cnn
./build/examples/kiln_quickstart models/generated/demo_cnn
