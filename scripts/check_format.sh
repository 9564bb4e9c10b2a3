#!/usr/bin/env bash
# Every C++ and CUDA file git tracks is as clang-format-14 writes it with the repository's
# .clang-format (Google base, 100 columns; STYLE.md). Prints each file that differs and the
# command that formats them, and exits 1 when any does. Run from anywhere; needs clang-format-14
# (scripts/setup.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
tool=${CLANG_FORMAT:-clang-format-14}
if ! command -v "$tool" >/dev/null; then
  echo "check_format: $tool is not installed (bash scripts/setup.sh installs it)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
bad=()
for f in "${files[@]}"; do
  "$tool" --style=file --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check_format: ${#bad[@]} of ${#files[@]} files differ from $tool --style=file:" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "fix with: $tool -i --style=file ${bad[*]}" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
