#!/bin/bash
# The CUDA backend's tests and a CLI smoke run on a GPU machine that has only the NVIDIA driver and the
# CUDA runtime libraries (cuBLASLt found by the dynamic loader), from a bundle made on the development
# machine:
#   bench/gpu/smoke.sh pack BUILD_DIR OUT.tar.xz     (here: the kiln binaries + the Debian .so they load)
#   bench/gpu/smoke.sh run BUNDLE.tar.xz LOG_DIR [MODEL.onnx]   (there)
# run: unpacks, runs the CUDA unit tests (GPU parity of every CUDA tactic, whole engines) and the
# device-generic engine/tuner tests, then, with a model, kiln build --device cuda / inspect / bench and
# kiln compare against the reference interpreter. Logs go to LOG_DIR.
set -u
cmd=${1:?pack or run}
if [ "$cmd" = pack ]; then
  build=${2:?build dir}
  out=${3:?bundle}
  stage=$(mktemp -d)
  mkdir -p "$stage/bin" "$stage/lib"
  cp "$build/kiln" "$build/tests/kiln_unit_tests" "$stage/bin/"
  strip "$stage/bin/"*
  # oneDNN and libgomp are Debian's: the GPU machine has neither (../shared/GPU.md).
  for l in $(ldd "$build/tests/kiln_unit_tests" | awk '/=>/ {print $3}' | grep -E 'dnnl|gomp|OpenCL'); do cp -L "$l" "$stage/lib/"; done
  tar -C "$stage" -cJf "$out" bin lib
  rm -rf "$stage"
  ls -la "$out"
  exit 0
fi
bundle=${2:?bundle}
logs=${3:?log dir}
model=${4:-}
mkdir -p "$logs"
dir=$(mktemp -d)
tar -C "$dir" -xJf "$bundle"
export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv 2>&1 | tee "$logs/gpu.txt"
rc=0
timeout 200 "$dir/bin/kiln_unit_tests" --gtest_filter='Cuda*:Target*:Tuner*:TensorLocation*:EngineTactics*:Workspace*' \
  2>&1 | tee "$logs/unit_tests.txt" | tail -40
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
if command -v compute-sanitizer >/dev/null; then
  timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 "$dir/bin/kiln_unit_tests" --gtest_filter='Cuda*' \
    >"$logs/memcheck.txt" 2>&1
  echo "memcheck exit $? (log: memcheck.txt)"; tail -5 "$logs/memcheck.txt"
else
  echo "compute-sanitizer: not on this machine" | tee "$logs/memcheck.txt"
fi
if [ -n "$model" ]; then
  name=$(basename "$model" .onnx)
  (
    set -x
    timeout 120 "$dir/bin/kiln" build "$model" --device cuda -o "$dir/$name.kiln"
    "$dir/bin/kiln" inspect "$dir/$name.kiln"
    timeout 60 "$dir/bin/kiln" bench "$dir/$name.kiln"
    timeout 80 "$dir/bin/kiln" compare "$model" --device cuda
  ) >"$logs/$name.txt" 2>&1
  echo "model $name: exit $? (log: $name.txt)"; grep -E "warning|median|error|max abs|PASS|FAIL" "$logs/$name.txt" | head -30
fi
exit $rc
