#!/usr/bin/env bash
# Builds kiln_fuzz and the unit tests with AddressSanitizer + UBSan (-O1), runs the unit tests, then
# 50,000 mutated models from the suite,
# in one process (fast; leaks checked at exit). KILN_FUZZ_FORK=1 runs each case in a child so that
# one run lists every crashing case (replay one with kiln_fuzz ... --only N).
# Leaks are checked by LeakSanitizer at exit; allocations above 256 MB fail cleanly (bad_alloc ->
# Status) so that mutated shapes cannot exhaust the machine.
#
# Where clang is installed the same tree is built with clang and KILN_FUZZ=ON, and the libFuzzer
# targets (tests/fuzz/libfuzzer) then run for KILN_LIBFUZZER_SECONDS each (default 20; 6 targets):
# one sanitizer tree for both, to keep CI's time in check (for the same reason its library is a unity
# build: KILN_UNITY in CMakeLists.txt).
set -euo pipefail
src=$1 build=$2 suite=$3
fuzz_opts=()
if command -v clang++ >/dev/null; then
  export CC=clang CXX=clang++
  fuzz_opts=(-DKILN_FUZZ=ON -DKILN_WITH_ONEDNN=OFF)
fi
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DKILN_SANITIZE=address -DKILN_SUITE_ARCHIVE=/nonexistent "${fuzz_opts[@]}" \
  -DKILN_UNITY=ON >/dev/null
ninja -C "$build" kiln_fuzz kiln_unit_tests >/dev/null
# The unit tests under ASan + UBSan (issue 15). This tree has no oneDNN (and, with clang, builds the SIMD
# kernel files unsanitized at -O0: see CMakeLists.txt, KILN_FUZZ): the tests that assert a oneDNN tactic
# takes a layer are left to the main tree, which runs every unit test.
(
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  needs_onednn="Tactics.EveryTacticMatchesTheReferenceKernel:Tactics.CeilModeAverageCountingPadsMatchesReference"
  needs_onednn+=":EngineControlFlow.TopLevelIfKeepsTacticsAndBodiesReadOuterValues"
  needs_onednn+=":ReferenceLayers.LoadedEngineRunsWithoutPreparing:EngineTactics.ChosenRecordedAndMatchingTheReference"
  needs_onednn+=":EngineTactics.RestrictedToNamedTactics:EngineTuning.CandidatesTimedRecordedAndReusedFromTheCache"
  needs_onednn+=":EngineTuning.EngineFileKeepsTheCandidates:EngineTuning.RestrictedTacticsAreTheOnlyCandidates"
  needs_onednn+=":EngineControlFlow.ExecutorRunsTacticsAroundAndInsideControlFlow"
  needs_onednn+=":EngineControlFlow.LoopBodyIsFoldedFusedAndRunsATactic:EngineControlFlow.BodyLayersAreTimedOnTheirOwn"
  needs_onednn+=":EngineTuning.InstructionSetAndLayoutBlockAreInTheKeys"
  "$build/tests/kiln_unit_tests" --gtest_filter="-$needs_onednn" --gtest_brief=1
)
(
  export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:max_allocation_size_mb=256:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  "$build/tests/kiln_fuzz" "$suite" --cases "${KILN_FUZZ_CASES:-50000}" --seed 1 ${KILN_FUZZ_FORK:+--fork 1}
)
if [ ${#fuzz_opts[@]} -gt 0 ]; then
  KILN_SUITE_DIR=$suite "$src/scripts/fuzz.sh" all "${KILN_LIBFUZZER_SECONDS:-20}" "$build"
fi
