#!/bin/bash
# Session 7's merged tree on the H200: every CUDA unit test, memcheck on the new CUDA tactics, and the
# bench/gpu table (BERT-base seq 128 and resnet50, batch 1 and 32, FP32 with TF32 off and FP16).
set -u
here=$(cd "$(dirname "$0")" && pwd)
L=$OUT/logs; mkdir -p $L
d=$(mktemp -d); tar -C $d -xJf $here/b.tar.xz
export LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
K=$d/bin/kiln; T=$d/bin/kiln_unit_tests
{ nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv; uptime;
  python3 -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"; } > $L/env.txt 2>&1
timeout 100 $T --gtest_filter='Cuda*:StorageDtypes*:NumericsGuard*:Target*:Tuner*:TensorLocation*:EngineTactics*:Workspace*' > $L/unit_tests.txt 2>&1
echo "unit tests exit $?"; grep -E "^\[  (FAILED|PASSED) |tests ran|FAILED  \]" $L/unit_tests.txt | head -20
timeout 70 compute-sanitizer --tool memcheck --error-exitcode 9 $T --gtest_filter='CudaReduced*:CudaGraph*:CudaMoreTactics*:CudaCnnTactics.Pooling:CudaTactics.*' > $L/memcheck.txt 2>&1
echo "memcheck exit $?"; tail -2 $L/memcheck.txt
timeout 200 python3 $here/bench.py --kiln $K --repo $PWD --out $OUT/bench.json --work /tmp/kb --models bert_encoder,resnet50 \
  --batches 1,32 --precisions fp32,fp16 --compile-mode none --iters 50 > $L/bench.txt 2>&1
echo "bench.py exit $?"; grep -v Warning $L/bench.txt | grep -v "torch.onnx.export" | tail -14
cp /tmp/kb/*.build.txt $L/ 2>/dev/null
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
