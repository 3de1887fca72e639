#!/bin/bash
# s9 probe: where the FP16/FP32 time goes on the H200 (main a6dcd3c).
set -u
here=$(cd "$(dirname "$0")" && pwd)
L=/tmp/logs; mkdir -p $L; trap "tar -C /tmp -czf $OUT/logs.tgz logs" EXIT; d=$(mktemp -d); tar -C $d -xJf $here/b.tar.xz
export LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
K=$d/bin/kiln
nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.max.sm --format=csv > $L/env.txt 2>&1
export PYTHONUNBUFFERED=1
timeout 200 python3 bench/gpu/bench.py --kiln $K --repo $PWD --out $L/bench.json --work /tmp/kb --models bert_encoder,resnet50 \
  --batches 1,32 --precisions fp32,fp16 --compile-mode none --iters 50 > $L/bench.txt 2>&1
echo "bench.py exit $?"; grep -v Warning $L/bench.txt | grep -v "torch.onnx.export" | tail -12
for e in resnet50_b32_fp16 resnet50_b1_fp16 resnet50_b1_fp32 bert_encoder_b32_fp16 bert_encoder_b32_fp32; do
  timeout 60 $K bench /tmp/kb/$e.kiln --no-data-transfers --dump-profile --duration 1 > $L/prof_$e.txt 2>&1
done
cat /tmp/kb/resnet50_b32_fp16.build.txt > $L/build_r50_b32_fp16.txt
timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --csv -c 600 $K bench /tmp/kb/resnet50_b32_fp16.kiln --no-data-transfers --iterations 1 --warmup 0 --duration 0 > $L/ncu_r50_b32_fp16.csv 2>&1
echo "ncu exit $?"
timeout 100 ncu --clock-control none --metrics gpu__time_duration.sum --csv -c 600 $K bench /tmp/kb/bert_encoder_b32_fp16.kiln --no-data-transfers --iterations 1 --warmup 0 --duration 0 > $L/ncu_bert_b32_fp16.csv 2>&1
echo "ncu2 exit $?"
# torch's own kernels for resnet50 fp16 b32 (eager, channels_last) for comparison
cat > /tmp/tp.py <<'PY'
import torch, torchvision
m = torchvision.models.resnet50().cuda().eval().half().to(memory_format=torch.channels_last)
x = torch.rand(32,3,224,224,device='cuda').half().to(memory_format=torch.channels_last)
torch.backends.cudnn.benchmark=True
with torch.inference_mode():
    for _ in range(5): m(x)
    torch.cuda.synchronize()
    import time
    s=torch.cuda.Event(enable_timing=True); e=torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(20): m(x)
    e.record(); e.synchronize(); print("channels_last fp16 eager b32 ms", s.elapsed_time(e)/20)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        m(x); torch.cuda.synchronize()
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=25))
PY
timeout 100 python3 /tmp/tp.py > $L/torch_cl.txt 2>&1; echo "torch cl exit $?"
cp /tmp/kb/*.build.txt $L/ # $(cd /tmp/kb && ls *.build.txt)
