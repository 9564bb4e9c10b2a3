#!/usr/bin/env bash
# Installs everything kiln needs to build and test on Debian 12: compilers and libraries from
# Debian's packages, pinned Python packages from PyPI (requirements.txt). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
# clang-14 and its sanitizer and libFuzzer runtimes: scripts/sanitize.sh (the asan and tsan presets);
# clang-format-14 and clang-tidy-14: scripts/check_format.sh and scripts/check_tidy.sh.
packages=(cmake ninja-build g++ protobuf-compiler libprotobuf-dev libgtest-dev ccache clang-14
          libclang-rt-14-dev clang-format-14 clang-tidy-14)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ! python3 -m pip --version >/dev/null 2>&1; then missing+=(python3-pip); fi
# scripts/test.sh installs the Python package into a fresh venv, as the README tells users to.
if ! python3 -m venv --help >/dev/null 2>&1; then missing+=(python3-venv); fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# Every package pinned in requirements.txt must be installed at its pinned version.
if ! python3 - >/dev/null 2>&1 <<'PY'
import re
from importlib.metadata import version
for line in open("requirements.txt"):
    m = re.match(r"\s*([A-Za-z0-9_.-]+)==(\S+)", line)
    if m and version(m.group(1)) != m.group(2):
        raise SystemExit(1)
PY
then
  echo "setup: installing pinned Python packages (requirements.txt)"
  python3 -m pip install -q --disable-pip-version-check -r requirements.txt
fi
echo "setup: ok"
