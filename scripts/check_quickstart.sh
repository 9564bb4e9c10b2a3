#!/usr/bin/env bash
# Checks what `bash scripts/quickstart.sh` printed (the README's first command): the engine's IO
# table, a line per test set (batch 2 and 5) with the exact output shape, and PASS against ONNX
# Runtime on each. Usage: check_quickstart.sh LOG
set -euo pipefail
log="$1"
fail() { echo "check_quickstart: $1 (see $log)" >&2; exit 1; }
grep -Eq '^engine: 2 IO tensors, 1 profile\(s\)' "$log" || fail "no engine summary line"
grep -Eq '^  input +image +float32 +\[batch, 3, 32, 32\]$' "$log" || fail "the IO table lacks input image [batch, 3, 32, 32]"
grep -Eq '^  output +probs +float32 +\[batch, 10\]$' "$log" || fail "the IO table lacks output probs [batch, 10]"
for b in 2 5; do
  grep -Eq "^batch $b +input \($b, 3, 32, 32\) -> probs \($b, 10\); vs ONNX Runtime \(FP32\): max abs err [0-9.e+-]+ +PASS$" "$log" \
    || fail "no PASS line for batch $b with output shape ($b, 10)"
done
if grep -q FAIL "$log"; then fail "a FAIL line"; fi
echo "check_quickstart: ok (IO table, batch 2 and 5 PASS)"
