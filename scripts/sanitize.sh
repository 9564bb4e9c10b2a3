#!/usr/bin/env bash
# Sanitizers (issue 13), run by .ci/run after scripts/test.sh: the CPU test suite built with ASan and
# UBSan (a subset: docs/testing.md says which and why), each fuzz target for a while on
# its committed corpus, and the stress test's CPU case under TSan. Any sanitizer report, fuzz
# finding or test failure fails the script. KILN_FUZZ_RUNS (default 20000 inputs per target, from
# a fixed seed, so a given tree fuzzes the same inputs every time and CI cannot turn red by chance)
# and KILN_TSAN_STRESS_SECONDS (default 30) scale it.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache keys on paths relative to the checkout; with debug info it also hashes the build folder
# unless told not to, which would make every fresh clone (CI) miss.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR=1
bash scripts/setup.sh
jobs="$(nproc)"
fuzz_runs="${KILN_FUZZ_RUNS:-20000}"
stress_seconds="${KILN_TSAN_STRESS_SECONDS:-30}"
# The first report ends the process with a failing status; leaks are reports too.
# An allocation ASan cannot serve returns null, as malloc does: kiln answers that with kOutOfMemory.
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=1:strict_string_checks=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
fuzz_targets=(onnx_build_fuzz engine_load_fuzz dim_parse_fuzz tensor_file_fuzz cli_flags_fuzz)

echo "sanitize: ASan+UBSan build (CMake preset asan: clang, CPU only, -O1)"
cmake --preset asan >/dev/null
cmake --build build-asan -j"$jobs" --target kiln_tests kiln_cli "${fuzz_targets[@]}"
# The whole suite less the tests that only repeat, much slower under ASan, what the subset covers:
# the six shared models end to end (SharedModel, Seed*, FeatureReferences), the op harness's
# coverage rerun (OpCoverage), the ONNX node tests and the stress test (TSan runs it below).
ctest --test-dir build-asan --output-on-failure -j"$jobs" \
  -E '^(onnx_node_tests|Devices/Stress\..*|.*SharedModel.*|Seed.*|FeatureReferences\..*|OpCoverage\..*)$'

# Each target on its corpus; new inputs go to a scratch folder, so the committed corpus is unchanged.
for t in "${fuzz_targets[@]}"; do
  echo "sanitize: $t, its corpus and then ${fuzz_runs} inputs from seed 1"
  mkdir -p "build-asan/fuzz-new/$t"
  log="build-asan/fuzz-$t.log"
  status=0
  "build-asan/tests/fuzz/$t" "build-asan/fuzz-new/$t" "tests/fuzz/corpus/$t" -seed=1 -runs="$fuzz_runs" \
    -timeout=30 -rss_limit_mb=2048 -malloc_limit_mb=2048 -artifact_prefix="build-asan/fuzz-" \
    -print_final_stats=1 >"$log" 2>&1 || status=$?
  grep -a -E 'stat::number_of_executed_units|Done [0-9]+ runs' "$log" || true
  if [ "$status" -ne 0 ]; then
    grep -a -A40 -E '==[0-9]+==ERROR|runtime error|deadly signal' "$log" | head -80 || true
    echo "sanitize: $t found a problem (exit $status; input saved as build-asan/fuzz-*, log $log)"
    exit 1
  fi
done

echo "sanitize: TSan build (CMake preset tsan) and the stress test's CPU case for ${stress_seconds}s"
cmake --preset tsan >/dev/null
cmake --build build-tsan -j"$jobs" --target kiln_stress_test
# TSan in clang 14 cannot map its shadow memory with the kernel's larger ASLR ranges; run without.
KILN_STRESS_SECONDS="$stress_seconds" setarch "$(uname -m)" -R build-tsan/tests/kiln_stress_test \
  --gtest_filter='Devices/Stress.*/cpu' --gtest_brief=0 | tee build-tsan/stress.log
if grep -q '\[  SKIPPED \]' build-tsan/stress.log; then
  echo "sanitize: the stress test skipped (see above): nothing ran under TSan"
fi
echo "sanitize: ok"
