#!/usr/bin/env python3
"""PyTorch -> ONNX -> kiln parity: exports torchvision resnet18, mobilenet_v2 and a TransformerEncoder
with Debian's python3-torch, runs each through kiln's reference interpreter and compares with PyTorch.

usage: test_torch_models.py KILN WORKDIR
"""
import os
import re
import subprocess
import sys

KILN, WORK = sys.argv[1], sys.argv[2]
EXPORT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "export_torch_model.py")
# Float32 through different summation orders: errors of 1e-5..1e-4 are expected on logits of O(1).
TOL = {"rtol": "1e-3", "atol": "1e-4"}
failures = []
for name in ("resnet18", "mobilenet_v2", "transformer_encoder"):
    d = os.path.join(WORK, name)
    subprocess.run([sys.executable, EXPORT, name, d], check=True, capture_output=True)
    r = subprocess.run([KILN, "run", os.path.join(d, name + ".onnx"), "--inputs", os.path.join(d, name + "_inputs.npz"),
                        "--expect-outputs", os.path.join(d, name + "_expected.npz"), "--rtol", TOL["rtol"],
                        "--atol", TOL["atol"]], capture_output=True, text=True)
    m = re.search(r"max abs error ([0-9.e+-]+)", r.stdout)
    err = m.group(1) if m else "?"
    ok = r.returncode == 0
    print(f"{'ok  ' if ok else 'FAIL'} {name}: kiln vs PyTorch max abs error {err} (rtol {TOL['rtol']}, atol {TOL['atol']})")
    if not ok:
        print(r.stdout[-2000:], r.stderr[-2000:])
        failures.append(name)
sys.exit(1 if failures else 0)
