#!/usr/bin/env bash
# clang-tidy-14 with the repository's .clang-tidy over every C++ file of src/ the build compiles
# (build/compile_commands.json; CUDA .cu files are nvcc's and left out). Exits 1 naming each
# finding; `bash scripts/check_tidy.sh FILE...` checks only those files. Needs a configured build
# (scripts/test.sh makes one) and clang-tidy-14 (scripts/setup.sh installs it with clang-14).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KILN_TIDY_BUILD:-build}
if [ ! -f "$build/compile_commands.json" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_TESTS=ON >/dev/null
fi
# The generated protobuf sources must exist for the files that include them.
cmake --build "$build" --target kiln_onnx_proto >/dev/null
if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(python3 - "$build" <<'PY'
import json, os, sys
root = os.getcwd()
seen = sorted({os.path.relpath(os.path.join(e["directory"], e["file"]), root)
               for e in json.load(open(os.path.join(sys.argv[1], "compile_commands.json")))})
print("\n".join(f for f in seen if f.startswith("src/") and f.endswith(".cc")))
PY
)
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
printf '%s\n' "${files[@]}" | xargs -P "$(nproc)" -n 4 clang-tidy-14 -p "$build" --quiet >"$log" 2>&1 || true
if grep -qE "(warning|error): " "$log"; then
  grep -E "(warning|error): " "$log" | grep -v "warnings generated" | sort -u >&2
  echo "check_tidy: findings above (.clang-tidy lists the checks; NOLINT(check): why, where one is meant)" >&2
  exit 1
fi
echo "check_tidy: ${#files[@]} files of src/ clean"
