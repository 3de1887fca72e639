#!/usr/bin/env bash
# The main job on a demo model, end to end: export torchvision resnet18 from PyTorch (random weights,
# fixed seed) with a saved input and PyTorch's output; run it in kiln's reference interpreter; build
# an optimized engine (kiln build), show what it became (kiln inspect), run the engine, and compare
# both with PyTorch's output.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh kiln
out=build/demo
mkdir -p "$out"
/usr/bin/python3 scripts/export_torch_model.py resnet18 "$out"
echo "== reference interpreter vs PyTorch"
build/kiln run "$out/resnet18.onnx" --inputs "$out/resnet18_inputs.npz" --output-dir "$out/outputs" \
  --expect-outputs "$out/resnet18_expected.npz" --rtol 1e-3 --atol 1e-4
echo "== kiln build"
build/kiln build "$out/resnet18.onnx" -o "$out/resnet18.kiln" --shapes input:1x3x224x224
echo "== kiln inspect (summary)"
build/kiln inspect "$out/resnet18.kiln" | grep -E "^(engine|source|passes|layers|memory)"
echo "== engine vs PyTorch"
build/kiln run "$out/resnet18.kiln" --inputs "$out/resnet18_inputs.npz" \
  --expect-outputs "$out/resnet18_expected.npz" --rtol 1e-3 --atol 1e-4
