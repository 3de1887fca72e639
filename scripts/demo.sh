#!/usr/bin/env bash
# The main job on a demo model, end to end: export torchvision resnet18 from PyTorch (random weights,
# fixed seed) with a saved input and PyTorch's output, import it into kiln, run the reference
# interpreter, and compare kiln's output with PyTorch's.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh kiln
out=build/demo
mkdir -p "$out"
/usr/bin/python3 scripts/export_torch_model.py resnet18 "$out"
build/kiln run "$out/resnet18.onnx" --inputs "$out/resnet18_inputs.npz" --output-dir "$out/outputs" \
  --expect-outputs "$out/resnet18_expected.npz" --rtol 1e-3 --atol 1e-4
