#!/bin/bash
# Times kiln's own CUDA kernels on one-op models (bench/gpu/kernels.py) on a GPU machine:
#   bench/gpu/kernels.sh KILN_BINARY MODEL_DIR [--fp16|--bf16|--fp32]
# Per model: kiln bench with --strict-tactics (every layer on a CUDA kernel), compute alone
# (--no-data-transfers), the per-layer table (--dump-profile).
set -u
kiln=${1:?kiln binary}
dir=${2:?model dir}
prec=${3:---fp16}
for m in "$dir"/*.onnx; do
  echo "== $(basename "$m" .onnx) $prec"
  "$kiln" bench "$m" --device cuda "$prec" --strict-tactics --no-data-transfers --random-inputs \
    --duration 1 --dump-profile 2>&1 | grep -vE '^\s*$' | tail -25
done
