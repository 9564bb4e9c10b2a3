#!/usr/bin/env bash
# Regenerates docs/trtexec_flags.md from the CLI's flag table (tools/kiln/flag_table.cc) through
# `kiln help-flags --markdown`, and the same table in README.md between its trtexec-flags markers.
# Usage: scripts/gen_flags_doc.sh [BUILD_DIR] (default build). tests/cli_test.cc fails when either
# differs from the table.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
cli="$build/tools/kiln/kiln"
if [ ! -x "$cli" ]; then
  echo "gen_flags_doc: $cli is missing; build it first (cmake --build $build --target kiln_cli)" >&2
  exit 1
fi
"$cli" help-flags --markdown > docs/trtexec_flags.md.tmp
mv docs/trtexec_flags.md.tmp docs/trtexec_flags.md
python3 - <<'PY'
begin, end = "<!-- trtexec-flags:begin", "<!-- trtexec-flags:end -->"
table = [l for l in open("docs/trtexec_flags.md").read().splitlines() if l.startswith("|")]
readme = open("README.md").read().split("\n")
b = next(i for i, l in enumerate(readme) if l.startswith(begin))
e = next(i for i, l in enumerate(readme) if l.startswith(end))
open("README.md", "w").write("\n".join(readme[: b + 1] + table + readme[e:]))
PY
echo "gen_flags_doc: wrote docs/trtexec_flags.md and the table in README.md"
