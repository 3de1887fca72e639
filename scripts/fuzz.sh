#!/usr/bin/env bash
# Builds kiln's libFuzzer targets (clang, ASan + UBSan, coverage; CMake option KILN_FUZZ=ON) and runs
# them for a given time each.
#
#   scripts/fuzz.sh TARGET|all SECONDS [BUILD_DIR]
#
# TARGET: onnx_import engine npy tensor_pb timing_cache shapes. BUILD_DIR: default build-fuzz (or
# $KILN_FUZZ_BUILD); tests/fuzz/run_fuzz_sanitized.sh passes its ASan tree, so CI builds one tree.
# Seeds: tests/fuzz/corpus/TARGET (committed, small files), plus the ONNX suite's models and input
# .pb files when $KILN_SUITE_DIR (default build/onnx-backend-tests) has them. New inputs libFuzzer
# finds go to BUILD_DIR/fuzz-corpus/TARGET, crashes to BUILD_DIR/fuzz-crashes/TARGET/ (add a
# crash's input to tests/fuzz/corpus/TARGET once it is fixed). KILN_FUZZ_JOBS=N runs N processes
# per target. Exits non-zero when a target found a crash, leak or sanitizer report.
set -euo pipefail
cd "$(dirname "$0")/.."
all=(onnx_import engine npy tensor_pb timing_cache shapes)
target=${1:?usage: scripts/fuzz.sh TARGET|all SECONDS [BUILD_DIR]}
secs=${2:?usage: scripts/fuzz.sh TARGET|all SECONDS [BUILD_DIR]}
build=${3:-${KILN_FUZZ_BUILD:-build-fuzz}}
suite=${KILN_SUITE_DIR:-build/onnx-backend-tests}
if [ "$target" = all ]; then targets=("${all[@]}"); else targets=("$target"); fi

if [ ! -f "$build/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DKILN_FUZZ=ON -DKILN_WITH_ONEDNN=OFF \
    -DKILN_SUITE_ARCHIVE=/nonexistent >/dev/null
fi
ninja -C "$build" "${targets[@]/#/fuzz_}" >/dev/null

# Seeds from the suite, once per build tree: models for the importer; input .pb files for the .pb
# reader, with the leading byte that picks the proto kind (0: TensorProto).
seeds=$build/fuzz-seeds
if [ -d "$suite/node" ] && [ ! -f "$seeds/.done" ]; then
  mkdir -p "$seeds/onnx_import" "$seeds/tensor_pb"
  i=0
  while IFS= read -r f; do
    cp "$f" "$seeds/onnx_import/$i.onnx"
    i=$((i + 1))
  done < <(find "$suite" -name model.onnx -size -64k | sort)
  i=0
  while IFS= read -r f; do
    { printf '\0'; cat "$f"; } >"$seeds/tensor_pb/$i.pb"
    i=$((i + 1))
  done < <(find "$suite" -path '*test_data_set_0*' -name 'input_*.pb' -size -16k | sort | awk 'NR % 4 == 0')
  touch "$seeds/.done"
fi

# Allocations above 1 GiB fail (bad_alloc, turned into a Status) instead of exhausting the machine;
# kiln's own tensor limit is lower in the targets (fuzz_util.h), so it is what refuses big tensors.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1:max_allocation_size_mb=1024:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
for t in "${targets[@]}"; do
  corpus=$build/fuzz-corpus/$t crashes=$build/fuzz-crashes/$t
  mkdir -p "$corpus" "$crashes"
  dirs=("$corpus" "tests/fuzz/corpus/$t")
  [ -d "$seeds/$t" ] && dirs+=("$seeds/$t")
  log=$build/fuzz-$t.log
  jobs=${KILN_FUZZ_JOBS:-1}
  extra=()
  [ "$jobs" -gt 1 ] && extra=(-fork="$jobs" -ignore_crashes=0)
  rc=0
  "$build/tests/fuzz_$t" -max_total_time="$secs" -timeout=30 -rss_limit_mb=3072 -max_len=1048576 \
    -artifact_prefix="$crashes/" -print_final_stats=1 "${extra[@]}" "${dirs[@]}" >"$log" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | awk '{s += $2} END {print s + 0}')
  [ "$execs" = 0 ] && execs=$(grep -o '#[0-9]*' "$log" | tail -1 | tr -d '#')
  echo "fuzz_$t: rc=$rc executions=${execs:-0} seconds=$secs corpus=$(ls "$corpus" | wc -l) crashes=$(ls "$crashes" | wc -l)"
  if [ "$rc" != 0 ]; then
    status=1
    grep -m1 -A25 'ERROR\|runtime error\|deadly signal' "$log" || tail -30 "$log"
  fi
done
exit $status
