#!/bin/bash
# s9 call 3: NHWC (s9/cnhwc) + noalloc3 merged: CUDA tests, resnet50 A/B NHWC, kernel lists (ncu) of resnet50 fp16 b32 / fp32 b1 and BERT fp16 b32, torch fp32 b1 kernels.
set -u
here=$(cd "$(dirname "$0")" && pwd)
L=/tmp/logs; mkdir -p $L; trap "tar -C /tmp -czf $OUT/logs.tgz logs" EXIT
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
d=$(mktemp -d); tar -C $d -xJf $here/b.tar.xz
export LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
K=$d/bin/kiln; T=$d/bin/kiln_unit_tests
export PYTHONUNBUFFERED=1
timeout 150 $T --gtest_filter='Cuda*:LayoutNhwc*:StorageDtypes*:EngineTactics*' > $L/unit_tests.txt 2>&1; echo "unit tests exit $? at $(el) s"
grep -E "^\[  FAILED  \]|^\[  PASSED  \]" $L/unit_tests.txt | head -20
timeout 80 compute-sanitizer --tool memcheck --error-exitcode 9 $T --gtest_filter='CudaCnnTactics.*:CudaCnnEngine.*' > $L/memcheck.txt 2>&1
echo "memcheck exit $? at $(el) s"; tail -2 $L/memcheck.txt
timeout 150 python3 bench/gpu/bench.py --kiln $K --repo $PWD --out $L/bench.json --work /tmp/kb --models resnet50,bert_encoder \
  --batches 1,32 --precisions fp16,fp32 --compile-mode none --iters 50 > $L/bench.txt 2>&1
echo "bench.py exit $? at $(el) s"; grep -v Warning $L/bench.txt | grep -v "torch.onnx.export" | tail -10
for b in 1 32; do
  timeout 60 $K build /tmp/kb/resnet50.onnx --device cuda --fp16 --shapes input:${b}x3x224x224 --disable-pass layout_nhwc -o /tmp/kb/r50_nchw_b$b.kiln > $L/build_nchw_b$b.txt 2>&1
  timeout 20 $K bench /tmp/kb/r50_nchw_b$b.kiln --no-data-transfers --use-cuda-graph --duration 2 2>&1 | grep -E "median" | sed "s/^/nchw fp16 b$b: /"
  timeout 20 $K bench /tmp/kb/resnet50_b${b}_fp16.kiln --no-data-transfers --use-cuda-graph --duration 2 2>&1 | grep -E "median" | sed "s/^/nhwc fp16 b$b: /"
done
N="ncu --clock-control none --metrics gpu__time_duration.sum --csv -c 400"
timeout 90 $N $K bench /tmp/kb/resnet50_b32_fp16.kiln --no-data-transfers --iterations 1 --warmup 0 --duration 0 > $L/ncu_r50_b32_fp16.csv 2>&1; echo "ncu1 $? at $(el) s"
timeout 60 $N $K bench /tmp/kb/resnet50_b1_fp32.kiln --no-data-transfers --iterations 1 --warmup 0 --duration 0 > $L/ncu_r50_b1_fp32.csv 2>&1; echo "ncu2 $? at $(el) s"
timeout 60 $N $K bench /tmp/kb/bert_encoder_b32_fp16.kiln --no-data-transfers --iterations 1 --warmup 0 --duration 0 > $L/ncu_bert_b32_fp16.csv 2>&1; echo "ncu3 $? at $(el) s"
cat > /tmp/tp.py <<'PY'
import torch, torchvision
m = torchvision.models.resnet50().cuda().eval()
x = torch.rand(1,3,224,224,device='cuda')
with torch.inference_mode():
    for _ in range(5): m(x)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        m(x); torch.cuda.synchronize()
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=110))
PY
timeout 60 python3 /tmp/tp.py > $L/torch_fp32_b1.txt 2>&1; echo "torch exit $? at $(el) s"
cp /tmp/kb/*.build.txt $L/
