#!/bin/bash
# The CNN part of the CUDA checks on a GPU machine, from a bundle made by `bench/gpu/smoke.sh pack`:
#   bench/gpu/cnn.sh BUNDLE.tar.xz LOG_DIR MODEL.onnx...
# Runs the CUDA unit tests (every CUDA tactic against the reference, whole engines) and memcheck over
# them, then per model (input "input" [N, 3, 224, 224], dynamic N): engines for cuda:0 at batch 1 and
# 32 (inspect: which kernels, any host fallback), kiln bench of each, and kiln compare of the batch-1
# engine against the reference interpreter. Logs go to LOG_DIR.
set -u
bundle=${1:?bundle}
logs=${2:?log dir}
shift 2
mkdir -p "$logs"
dir=$(mktemp -d)
tar -C "$dir" -xJf "$bundle"
export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv 2>&1 | tee "$logs/gpu.txt"
rc=0
timeout 150 "$dir/bin/kiln_unit_tests" --gtest_filter='Cuda*:Target*:Tuner*:TensorLocation*:EngineTactics*:Workspace*' \
  >"$logs/unit_tests.txt" 2>&1
[ $? = 0 ] || rc=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|tests ran" "$logs/unit_tests.txt" | head -30
if command -v compute-sanitizer >/dev/null; then
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$dir/bin/kiln_unit_tests" \
    --gtest_filter='Cuda*' >"$logs/memcheck.txt" 2>&1
  echo "memcheck exit $? (log: memcheck.txt)"; tail -4 "$logs/memcheck.txt"
fi
for model in "$@"; do
  name=$(basename "$model" .onnx)
  (
    set -x
    for b in 1 32; do
      timeout 150 "$dir/bin/kiln" build "$model" --device cuda --shapes "input:${b}x3x224x224" -o "$dir/$name.b$b.kiln"
      "$dir/bin/kiln" inspect "$dir/$name.b$b.kiln"
      timeout 60 "$dir/bin/kiln" bench "$dir/$name.b$b.kiln" --duration 2
    done
    timeout 60 "$dir/bin/kiln" bench "$dir/$name.b1.kiln" --duration 1 --dump-profile
    timeout 60 "$dir/bin/kiln" bench "$dir/$name.b32.kiln" --duration 1 --dump-profile
    timeout 120 "$dir/bin/kiln" compare "$model" --engine "$dir/$name.b1.kiln" --random-inputs \
      --shapes input:1x3x224x224
  ) >"$logs/$name.txt" 2>&1
  echo "model $name: exit $? (log: $name.txt)"
  grep -E "warning|median|error|max abs|PASS|FAIL|reference" "$logs/$name.txt" | head -20
done
exit $rc
