#!/bin/bash
# s9 final call: CUDA tests (+ flash attention), memcheck of the new tests, bench/gpu/bench.py without and with torch.compile (max-autotune, fp16 rows).
set -u
here=$(cd "$(dirname "$0")" && pwd)
L=/tmp/logs; mkdir -p $L; trap "tar -C /tmp -czf $OUT/logs.tgz logs" EXIT
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
d=$(mktemp -d); tar -C $d -xJf $here/b.tar.xz
export LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
K=$d/bin/kiln; T=$d/bin/kiln_unit_tests
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv; python3 -c "import torch; print('torch', torch.__version__)"; } > $L/env.txt 2>&1
timeout 100 $T --gtest_filter='Cuda*:LayoutNhwc*:StorageDtypes*:NumericsGuard*:Target*:Tuner*:TensorLocation*:EngineTactics*:Workspace*:DeviceBuffers*:FusionPipeline*:FuseAttention*' > $L/unit_tests.txt 2>&1
echo "unit tests exit $? at $(el) s"; grep -E "^\[  FAILED  \]|^\[  PASSED  \]|SKIPPED \] [0-9]" $L/unit_tests.txt | head -12
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $T --gtest_filter="${MEMCHECK:-CudaAttention*:CudaFlash*}" > $L/memcheck.txt 2>&1
echo "memcheck exit $? at $(el) s"; grep -E "ERROR SUMMARY|PASSED|FAILED" $L/memcheck.txt | tail -3
timeout 150 python3 bench/gpu/bench.py --kiln $K --repo $PWD --out $L/bench.json --work /tmp/kb --models bert_encoder,resnet50 \
  --batches 1,32 --precisions fp32,fp16 --compile-mode none --iters 100 > $L/bench.txt 2>&1
echo "bench.py exit $? at $(el) s"; grep -v Warning $L/bench.txt | grep -v "torch.onnx.export" | tail -11
for b in 1 32; do
  timeout 60 $K build /tmp/kb/resnet50.onnx --device cuda --channels-last on --shapes input:${b}x3x224x224 -o /tmp/kb/r50_cl_b$b.kiln > $L/build_cl_fp32_b$b.txt 2>&1
  timeout 20 $K bench /tmp/kb/r50_cl_b$b.kiln --no-data-transfers --use-cuda-graph --duration 2 2>&1 | grep -E "Latency" | sed "s/^/fp32 channels-last on b$b: /"
  timeout 20 $K bench /tmp/kb/resnet50_b${b}_fp32.kiln --no-data-transfers --use-cuda-graph --duration 2 2>&1 | grep -E "Latency" | sed "s/^/fp32 default b$b: /"
done
for b in 1 32; do timeout 10 $K inspect /tmp/kb/bert_encoder_b${b}_fp16.kiln 2>&1 | grep -E "attention_" | head -2 | sed "s/^/bert b$b fp16: /"; done
echo "A/B done at $(el) s"
for m in resnet50 bert_encoder; do
  left=$(( 545 - $(el) )); [ $left -gt 60 ] || { echo "no time for $m compile"; continue; }
  [ $m = resnet50 ] && t=$(( left * 55 / 100 )) || t=$(( left - 10 ))
  timeout $t python3 bench/gpu/bench.py --kiln $K --repo $PWD --out $L/bench_compile_$m.json --work /tmp/kb --models $m \
    --batches 1,32 --precisions fp16 --compile-precisions fp16 --compile-mode max-autotune --iters 100 > $L/bench_compile_$m.txt 2>&1
  echo "bench.py compile $m exit $? at $(el) s"; grep -v Warning $L/bench_compile_$m.txt | grep -E "^$m \|" | tail -3
done
cp /tmp/kb/*.build.txt $L/ 2>/dev/null
echo "done at $(el) s"
