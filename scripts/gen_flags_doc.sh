#!/usr/bin/env bash
# Regenerates docs/trtexec_flags.md from the CLI's flag table (tools/kiln/flag_table.cc) through
# `kiln help-flags --markdown`. Usage: scripts/gen_flags_doc.sh [BUILD_DIR] (default build).
# tests/cli_test.cc fails when it differs from the table.
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
echo "gen_flags_doc: wrote docs/trtexec_flags.md"
