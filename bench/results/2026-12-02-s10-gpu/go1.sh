#!/bin/bash
# s10 call 1 (main 28ad7d3, session 9's tree): torch.compile max-autotune of resnet50 FP16 at batch 1 first
# (its compile alone takes minutes), then the CUDA tests, ncu kernel lists of BERT and resnet50 FP16 b32,
# and three FP32 resnet50 b1 builds (how much the tuner's picks move the latency).
set -u
here=$(cd "$(dirname "$0")" && pwd)
L=/tmp/logs; mkdir -p $L; trap "cp /tmp/kb/*.build.txt $L/ 2>/dev/null; tar -C /tmp -czf $OUT/logs.tgz logs" EXIT
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
d=$(mktemp -d); tar -C $d -xJf ${BUNDLE:-.gpu-s10/b.tar.xz}
export LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
K=$d/bin/kiln; T=$d/bin/kiln_unit_tests
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=16
{ nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv; python3 -c "import torch; print('torch', torch.__version__)"; nproc; } > $L/env.txt 2>&1
timeout 400 python3 bench/gpu/bench.py --kiln $K --repo $PWD --out $L/bench_compile_r50_b1.json --work /tmp/kb --models resnet50 \
  --batches 1 --precisions fp16 --compile-precisions fp16 --compile-mode max-autotune --iters 100 > $L/bench_compile_r50_b1.txt 2>&1
echo "bench.py compile resnet50 b1 exit $? at $(el) s"; grep -v Warning $L/bench_compile_r50_b1.txt | grep -E "^resnet50 \||torch_compile" | tail -3 | cut -c1-600
timeout 70 $T --gtest_filter='Cuda*:Target*:EngineTactics*' > $L/unit_tests.txt 2>&1
echo "unit tests exit $? at $(el) s"; grep -E "^\[  FAILED  \]|^\[  PASSED  \]|SKIPPED \] [0-9]" $L/unit_tests.txt | head -12
[ -f /tmp/kb/bert_encoder.onnx ] || timeout 60 python3 -c "
import sys; sys.path.insert(0, 'bench/gpu'); import bench, torch
bench.export(bench.load_exporter('.'), 'bert_encoder', '/tmp/kb', torch)" > $L/export_bert.txt 2>&1
timeout 40 $K build /tmp/kb/bert_encoder.onnx --device cuda --fp16 --shapes input_ids:32x128,attention_mask:32x128 -o /tmp/kb/bert_b32_fp16.kiln > $L/bert_b32_fp16.build.txt 2>&1
timeout 40 $K build /tmp/kb/resnet50.onnx --device cuda --fp16 --shapes input:32x3x224x224 -o /tmp/kb/r50_b32_fp16.kiln > $L/r50_b32_fp16.build.txt 2>&1
for e in bert_b32_fp16 r50_b32_fp16; do
  timeout 15 $K bench /tmp/kb/$e.kiln --no-data-transfers --use-cuda-graph --duration 2 2>&1 | grep -E "Latency" | sed "s/^/$e: /"
  timeout 40 ncu --clock-control none --metrics gpu__time_duration.sum --csv -c 600 $K bench /tmp/kb/$e.kiln --no-data-transfers \
    --iterations 1 --warmup 0 --duration 0 > $L/ncu_$e.csv 2>$L/ncu_$e.err
  echo "ncu $e exit $? at $(el) s"
done
for i in 1 2 3; do
  [ $(el) -lt 555 ] || break
  timeout 25 $K build /tmp/kb/resnet50.onnx --device cuda --shapes input:1x3x224x224 -o /tmp/kb/r50_b1_fp32_$i.kiln > $L/r50_b1_fp32_$i.build.txt 2>&1
  timeout 10 $K bench /tmp/kb/r50_b1_fp32_$i.kiln --no-data-transfers --use-cuda-graph --duration 2 2>&1 | grep -E "Latency" | sed "s/^/fp32 b1 build $i: /"
done
echo "done at $(el) s"
