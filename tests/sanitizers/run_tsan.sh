#!/usr/bin/env bash
# Builds the unit tests with ThreadSanitizer and runs the concurrency tests: several
# ExecutionContexts of one engine running at once must not race.
set -euo pipefail
src=$1 build=$2
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DKILN_SANITIZE=thread -DKILN_SUITE_ARCHIVE=/nonexistent \
  -DKILN_UNITY=ON >/dev/null
ninja -C "$build" kiln_tsan_tests >/dev/null
# One OpenMP thread per context: libgomp is not TSan-instrumented, so its barriers would read as races.
# What is under test is contexts racing each other, not the intra-op team.
export OMP_NUM_THREADS=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
exec "$build/tests/kiln_tsan_tests" --gtest_filter='ExecutionContext.Concurrent*'
