#!/usr/bin/env bash
# Installs dependencies, builds kiln with its tests, and runs them. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache keys on paths relative to the checkout, so a fresh clone (CI) reuses an earlier build's
# objects, and the Python package's build (build-python-*, one level down like build/) reuses the
# C++ build's.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_TESTS=ON >/dev/null
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)"
# The ONNX node test count (tests/conformance/run.sh keeps it; CTest hides passing output).
if [ -f build/onnx-tests/summary.txt ]; then echo "ONNX backend tests:"; cat build/onnx-tests/summary.txt; fi
# The Python package as a newcomer installs it (the README's quickest path to the CLI): a fresh
# venv, `pip install .` with pip's default build isolation (pyproject.toml declares every build
# requirement), then the wheel's `kiln` command. It builds in build-python-*/ through the same ccache
# as the C++ build above (mostly hits). Then the pinned test requirements (requirements.txt,
# requirements-torch.txt for kiln.torch, requirements-serve.txt for kiln.serve on Ray) and the
# pytest suite, in that venv.
venv=build/venv
rm -rf "$venv"
python3 -m venv "$venv"
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$venv/bin/pip" install -q --disable-pip-version-check ./
"$venv/bin/kiln" --help >/dev/null
echo "fresh venv: pip install . && kiln --help: ok ($("$venv/bin/kiln" --version))"
"$venv/bin/pip" install -q --disable-pip-version-check -r requirements.txt
# kiln.torch's tests (the package's [torch] extra, pinned): torch, torchvision, onnxscript.
"$venv/bin/pip" install -q --disable-pip-version-check -r requirements-torch.txt
# kiln.serve's Ray Serve tests (the package's [serve] extra, pinned): ray[serve].
"$venv/bin/pip" install -q --disable-pip-version-check -r requirements-serve.txt
"$venv/bin/python" -m pytest -q -rs python/tests
