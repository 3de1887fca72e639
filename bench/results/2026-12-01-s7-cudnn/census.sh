#!/bin/bash
# Every exported suite classifier on cuda:0 at batch 1: which kernels, host fallbacks, compare.
# census.sh BIN_DIR MODEL_DIR
bin=$1
md=$2
while read -r name size; do
  [ "$name" = FAILED ] && { echo "export FAILED: $size"; continue; }
  echo "=== $name ($size)"
  timeout 60 "$bin/kiln" build "$md/$name.onnx" --device cuda --shapes "input:1x3x${size}x${size}" -o "/tmp/$name.kiln" 2>&1 |
    grep -E "kernels:|reference kernel|error|warning" | head -12
  timeout 60 "$bin/kiln" compare "$md/$name.onnx" --engine "/tmp/$name.kiln" --random-inputs \
    --shapes "input:1x3x${size}x${size}" 2>&1 | grep -E "PASS|FAIL|abs err|error" | head -4
  timeout 30 "$bin/kiln" bench "/tmp/$name.kiln" --duration 1 2>&1 | grep -E "median" | sed 's/.*median/  median/; s/, percentile(90%).*//'
done <"$md/exported.txt"
