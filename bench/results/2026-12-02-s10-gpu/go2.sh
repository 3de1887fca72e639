#!/bin/bash
# s10 call 2 (main + GELU epilogue, flash2, tuner delay, cnn16, cint8, detect merged): the CUDA tests, the FP16
# rows and FP32 resnet50 b1, INT8 resnet50 (ONNX Runtime's Q/DQ file and a calibrated build) at b32, memcheck of
# the new tests, then torch.compile max-autotune of resnet50 FP16 at batch 32 (the rest of the call).
set -u
L=/tmp/logs; mkdir -p $L; trap "cp /tmp/kb/*.build.txt $L/ 2>/dev/null; tar -C /tmp -czf $OUT/logs.tgz logs" EXIT
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
d=$(mktemp -d); tar -C $d -xJf .gpu-s10/b.tar.xz
export LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
K=$d/bin/kiln; T=$d/bin/kiln_unit_tests
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=16
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv > $L/env.txt 2>&1
timeout 90 $T --gtest_filter='Cuda*:SplitRun*:CompareTolerances*:Target*:EngineTactics*:LayoutNhwc*:StorageDtypes*' > $L/unit_tests.txt 2>&1
echo "unit tests exit $? at $(el) s"; grep -E "^\[  FAILED  \]|^\[  PASSED  \]|SKIPPED \] [0-9]" $L/unit_tests.txt | head -14
grep -E "^(ran|declined)|fused" $L/unit_tests.txt | sort | uniq -c | sort -rn | head -5
timeout 130 python3 bench/gpu/bench.py --kiln $K --repo $PWD --out $L/bench.json --work /tmp/kb --models bert_encoder,resnet50 \
  --batches 1,32 --precisions fp16 --compile-mode none --iters 100 > $L/bench.txt 2>&1
echo "bench.py exit $? at $(el) s"; grep -v Warning $L/bench.txt | grep -E "^(bert|resnet)" | tail -4
for e in bert_encoder_b32_fp16 resnet50_b32_fp16 bert_encoder_b1_fp16; do grep -hE "GELU|kernels:" /tmp/kb/$e.build.txt | cut -c1-400; done
timeout 30 $K build /tmp/kb/resnet50.onnx --device cuda --shapes input:1x3x224x224 -o /tmp/kb/r50_b1_fp32.kiln > $L/r50_b1_fp32.build.txt 2>&1
timeout 10 $K bench /tmp/kb/r50_b1_fp32.kiln --no-data-transfers --use-cuda-graph --duration 2 2>&1 | grep -E "Latency" | sed "s/^/fp32 b1: /"
Q=.gpu-s10/resnet50.ort-int8-qdq.onnx
timeout 60 $K build $Q --device cuda --shapes input:32x3x224x224 -o /tmp/kb/r50q_b32.kiln > $L/r50q_b32.build.txt 2>&1; echo "qdq build exit $?"
grep -E "kernels:|host|warning" $L/r50q_b32.build.txt | head -4 | cut -c1-400
timeout 15 $K bench /tmp/kb/r50q_b32.kiln --no-data-transfers --use-cuda-graph --duration 2 2>&1 | grep -E "Latency|rror" | sed "s/^/int8 qdq b32: /"
timeout 15 $K bench /tmp/kb/resnet50_b32_fp16.kiln --no-data-transfers --use-cuda-graph --duration 2 2>&1 | grep -E "Latency" | sed "s/^/fp16 b32 again: /"
timeout 30 ncu --clock-control none --metrics gpu__time_duration.sum --csv -c 300 $K bench /tmp/kb/r50q_b32.kiln --no-data-transfers \
    --iterations 1 --warmup 0 --duration 0 > $L/ncu_r50q_b32.csv 2>/dev/null
timeout 30 ncu --clock-control none --metrics gpu__time_duration.sum --csv -c 300 $K bench /tmp/kb/bert_encoder_b32_fp16.kiln --no-data-transfers \
    --iterations 1 --warmup 0 --duration 0 > $L/ncu_bert_b32.csv 2>/dev/null
timeout 30 ncu --clock-control none --metrics gpu__time_duration.sum --csv -c 300 $K bench /tmp/kb/resnet50_b32_fp16.kiln --no-data-transfers \
    --iterations 1 --warmup 0 --duration 0 > $L/ncu_r50_b32.csv 2>/dev/null
echo "ncu at $(el) s"
timeout 50 $K compare $Q --engine /tmp/kb/r50q_b32.kiln --shapes input:32x3x224x224 --threads 16 > $L/r50q_compare.txt 2>&1; echo "qdq compare exit $?"; tail -4 $L/r50q_compare.txt | cut -c1-300
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $T --gtest_filter='CudaInt8Tactics.*:CudaCnnTactics.Nhwc*:CudaAttention.Fused*:SplitRun.Cuda*:CudaReduced.FusedMatMulGelu*' > $L/memcheck.txt 2>&1
echo "memcheck exit $? at $(el) s"; grep -E "ERROR SUMMARY" $L/memcheck.txt | tail -2
left=$(( 575 - $(el) ))
timeout $left python3 bench/gpu/bench.py --kiln $K --repo $PWD --out $L/bench_compile_r50_b32.json --work /tmp/kb --models resnet50 \
  --batches 32 --precisions fp16 --compile-precisions fp16 --compile-mode max-autotune --iters 100 > $L/bench_compile_r50_b32.txt 2>&1
echo "bench.py compile resnet50 b32 exit $? at $(el) s (limit $left)"; grep -v Warning $L/bench_compile_r50_b32.txt | grep -E "^resnet50 \|" | tail -2
echo "done at $(el) s"
