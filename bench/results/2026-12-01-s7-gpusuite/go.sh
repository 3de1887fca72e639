#!/bin/bash
# Device run of s7/gpusuite (one call, <= 4 min): the new CUDA tactics' GPU tests + memcheck, then the
# non-classifier suite models on cuda:0 (bert, gpt2 carried; torchvision ones exported here with random
# weights by bench/suite/export.py): kiln build --device cuda (host-fallback layers), kiln bench, and in the
# background kiln compare vs the reference interpreter and a CPU engine's kiln bench (this host's CPU).
set -u
G=.gpu-gpusuite
L=$OUT
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
d=$(mktemp -d); tar -C $d -xJf $G/b.tar.xz
export LD_LIBRARY_PATH=$d/lib
K=$d/bin/kiln
M=/tmp/models; mkdir -p $M; cp $G/*.onnx $M/
EXP="lraspp_mobilenet_v3_large deeplabv3_mobilenet_v3_large fcn_resnet50 vit_b_32 swin_t ssdlite320_mobilenet_v3_large fasterrcnn_mobilenet_v3_large_320_fpn retinanet_resnet50_fpn"
mkdir -p $L/export
declare -A P
for n in $EXP; do OMP_NUM_THREADS=2 timeout 95 python3 $G/export_ts.py $n $M >$L/export/$n.txt 2>&1 & P[$n]=$!; done
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv >$L/gpu.txt 2>&1
echo "unit tests and memcheck: run 1"

declare -A S=([bert]="input_ids:1x128,token_type_ids:1x128,attention_mask:1x128" [gpt2]="input_ids:1x128"
  [lraspp_mobilenet_v3_large]="input:1x3x320x320" [deeplabv3_mobilenet_v3_large]="input:1x3x320x320"
  [fcn_resnet50]="input:1x3x224x224" [vit_b_32]="input:1x3x224x224" [swin_t]="input:1x3x224x224"
  [ssdlite320_mobilenet_v3_large]="images:3x320x320" [fasterrcnn_mobilenet_v3_large_320_fpn]="images:3x320x320"
  [retinanet_resnet50_fpn]="images:3x320x320")
mkdir -p $L/models
for n in gpt2 $EXP; do
  while [ -n "${P[$n]:-}" ] && kill -0 ${P[$n]} 2>/dev/null && [ $(el) -lt 85 ]; do sleep 2; done
  [ -s $M/$n.onnx ] || { echo "$n: not exported at $(el) s" >>$L/census.txt; continue; }
  [ $(el) -lt 85 ] || { echo "$n: skipped, out of time at $(el) s" >>$L/census.txt; continue; }
  s=${S[$n]}; o=$L/models/$n
  echo "=== $n ($s) at $(el) s" >>$L/census.txt
  timeout 25 $K build $M/$n.onnx --device cuda --shapes $s -o /tmp/$n.kiln >$o.build.txt 2>&1; echo "rc $?" >>$o.build.txt
  grep -E "kernels:|host|reference kernel|error" $o.build.txt | grep -v "^\[kiln build\] layer" | head -8 >>$L/census.txt
  timeout 15 $K bench /tmp/$n.kiln --duration 1 >$o.bench_gpu.txt 2>&1
  grep -E "median" $o.bench_gpu.txt | head -2 >>$L/census.txt
  ( timeout 25 $K compare $M/$n.onnx --engine /tmp/$n.kiln --shapes $s --threads 8 >$o.compare.txt 2>&1; echo "rc $?" >>$o.compare.txt ) &
  ( timeout 25 $K build $M/$n.onnx --shapes $s --threads 4 -o /tmp/$n.cpu.kiln >$o.build_cpu.txt 2>&1 &&
    timeout 8 $K bench /tmp/$n.cpu.kiln --duration 1 --threads 4 >$o.bench_cpu.txt 2>&1 ) &
done
echo "loop done at $(el) s" >>$L/census.txt
while [ -n "$(jobs -rp)" ] && [ $(el) -lt 128 ]; do sleep 1; done
echo "all done at $(el) s" >>$L/census.txt
for n in gpt2 $EXP; do
  o=$L/models/$n
  echo "=== $n" >>$L/summary.txt
  [ -f $o.compare.txt ] && grep -E "RESULT|rc " $o.compare.txt | tail -2 >>$L/summary.txt
  [ -f $o.bench_cpu.txt ] && grep -E "median" $o.bench_cpu.txt | sed 's/^/  cpu /' | head -1 >>$L/summary.txt
  [ -f $o.build_cpu.txt ] && grep -E "error|rc " $o.build_cpu.txt | head -2 >>$L/summary.txt
  [ -f $L/export/$n.txt ] && ! [ -f $o.build.txt ] && tail -4 $L/export/$n.txt >>$L/summary.txt
done
tar -C $L -czf /tmp/logs.tar.gz models export && rm -rf $L/models $L/export && mv /tmp/logs.tar.gz $L/
