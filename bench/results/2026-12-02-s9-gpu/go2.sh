#!/bin/bash
# s9 call 2: the merged round-1 tree on the H200: CUDA unit tests, memcheck, racecheck, bench/gpu (no compile), profiles.
set -u
here=$(cd "$(dirname "$0")" && pwd)
L=/tmp/logs; mkdir -p $L; trap "tar -C /tmp -czf $OUT/logs.tgz logs" EXIT
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
d=$(mktemp -d); tar -C $d -xJf $here/b.tar.xz
export LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
K=$d/bin/kiln; T=$d/bin/kiln_unit_tests
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv > $L/env.txt 2>&1
F=${GTEST_CUDA:-'Cuda*:StorageDtypes*:NumericsGuard*:Target*:Tuner*:TensorLocation*:EngineTactics*:Workspace*'}
timeout 120 $T --gtest_filter="$F" > $L/unit_tests.txt 2>&1; echo "unit tests exit $? at $(el) s"
grep -E "^\[  FAILED  \]|^\[  PASSED  \]|tests ran" $L/unit_tests.txt | head -30
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $T --gtest_filter="${MEMCHECK:-Cuda*}" > $L/memcheck.txt 2>&1
echo "memcheck exit $? at $(el) s"; tail -3 $L/memcheck.txt
if [ -n "${RACE:-}" ]; then
  timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 $T --gtest_filter="$RACE" > $L/racecheck.txt 2>&1
  echo "racecheck exit $? at $(el) s"; tail -3 $L/racecheck.txt
fi
timeout 170 python3 bench/gpu/bench.py --kiln $K --repo $PWD --out $L/bench.json --work /tmp/kb --models bert_encoder,resnet50 \
  --batches 1,32 --precisions fp32,fp16 --compile-mode none --iters 50 > $L/bench.txt 2>&1
echo "bench.py exit $? at $(el) s"; grep -v Warning $L/bench.txt | grep -v "torch.onnx.export" | tail -11
timeout 40 bash bench/gpu/kernels.sh $K $here/km --fp16 > $L/kernels_fp16.txt 2>&1; echo "kernels exit $? at $(el) s"
for e in resnet50_b32_fp16 resnet50_b1_fp16 resnet50_b1_fp32 bert_encoder_b32_fp16 bert_encoder_b32_fp32; do
  timeout 25 $K bench /tmp/kb/$e.kiln --no-data-transfers --dump-profile --duration 1 > $L/prof_$e.txt 2>&1
done
cp /tmp/kb/*.build.txt $L/
for n in 1 4; do timeout 20 $K bench /tmp/kb/resnet50_b1_fp16.kiln --streams $n --duration 3 > $L/streams_$n.txt 2>&1; done
grep -h -E "Throughput|aggregate" $L/streams_*.txt
echo "done at $(el) s"
