#!/bin/bash
# s10 call 3 (the tree that landed): the fixed GPU tests, a backtrace of the device split-run crash, then the
# bench/gpu table: FP32 and FP16 rows without torch.compile, BERT FP16 with torch.compile max-autotune, and
# resnet50 INT8 (calibrated) at batch 32.
set -u
L=/tmp/logs; mkdir -p $L; trap "cp /tmp/kb/*.build.txt $L/ 2>/dev/null; tar -C /tmp -czf $OUT/logs.tgz logs" EXIT
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
d=$(mktemp -d); tar -C $d -xJf .gpu-s10/b.tar.xz
export LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
K=$d/bin/kiln; T=$d/bin/kiln_unit_tests
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=16
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv > $L/env.txt 2>&1
timeout 40 $T --gtest_filter='Cuda*:SplitRun*:CompareTolerances*' > $L/unit_tests.txt 2>&1
echo "unit tests exit $? at $(el) s"; grep -E "^\[  FAILED  \]|^\[  PASSED  \]|SKIPPED \] [0-9]" $L/unit_tests.txt | head -12
timeout 200 python3 bench/gpu/bench.py --kiln $K --repo $PWD --out $L/bench.json --work /tmp/kb --models bert_encoder,resnet50 \
  --batches 1,32 --precisions fp32,fp16 --compile-mode none --iters 100 > $L/bench.txt 2>&1
echo "bench.py exit $? at $(el) s"; grep -v Warning $L/bench.txt | grep -E "^(GPU|latency|model|bert|resnet)" | tail -11
timeout 55 python3 bench/gpu/bench.py --kiln $K --repo $PWD --out $L/bench_int8.json --work /tmp/kb --models resnet50 \
  --batches 32 --precisions int8 --compile-mode none --iters 100 > $L/bench_int8.txt 2>&1
echo "bench.py int8 exit $? at $(el) s"; grep -v Warning $L/bench_int8.txt | grep -E "^resnet50 \||kiln_error" | tail -2 | cut -c1-400
timeout 50 python3 bench/gpu/bench.py --kiln $K --repo $PWD --out $L/bench_exact_gelu.json --work /tmp/kb --models bert_encoder \
  --batches 32 --precisions fp16 --compile-mode none --iters 100 --kiln-build-flags=--exact-gelu > $L/bench_exact_gelu.txt 2>&1
echo "bench.py exact gelu exit $? at $(el) s"; grep -v Warning $L/bench_exact_gelu.txt | grep -E "^bert_encoder \|" | tail -1
if command -v gdb > /dev/null; then
  KILN_EXPERIMENTAL_DEVICE_SPLIT=1 timeout 30 gdb -batch -ex run -ex bt --args $T --gtest_filter='SplitRun.Cuda*' > $L/split_gdb.txt 2>&1
  grep -E "^#[0-9]" $L/split_gdb.txt | head -12 | cut -c1-250
else
  echo "no gdb"; KILN_EXPERIMENTAL_DEVICE_SPLIT=1 timeout 40 $T --gtest_filter='SplitRun.Cuda*' > $L/split_run.txt 2>&1; echo "split exit $?"
fi
left=$(( 365 - $(el) ))
timeout $left python3 bench/gpu/bench.py --kiln $K --repo $PWD --out $L/bench_compile_bert.json --work /tmp/kb --models bert_encoder \
  --batches 1,32 --precisions fp16 --compile-precisions fp16 --compile-mode max-autotune --iters 100 > $L/bench_compile_bert.txt 2>&1
echo "bench.py compile bert exit $? at $(el) s (limit $left)"; grep -v Warning $L/bench_compile_bert.txt | grep -E "^bert_encoder \|" | tail -2
echo "done at $(el) s"
