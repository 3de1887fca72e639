#!/usr/bin/env python3
"""PyTorch -> ONNX -> kiln parity workflow, boundary by boundary, with `kiln compare`.

usage: parity.py KILN WORKDIR      (Debian's /usr/bin/python3 with python3-torch and python3-torchvision)

For torchvision resnet18 and a TransformerEncoder it:
  1. exports the model, saves the framework inputs (inputs.npz) and PyTorch's outputs (framework.npz);
  2. framework vs ONNX reference:  kiln compare M.onnx --ref framework.npz --test onnx --inputs inputs.npz
  3. ONNX reference vs the engine: kiln compare M.onnx --inputs inputs.npz --find-divergence (fusions on)
     and the saved engine file:    kiln compare M.onnx --engine M.kiln --inputs inputs.npz
  4. final labels after identical post-processing (softmax + top-5) on PyTorch's and the engine's logits;
  5. a planted preprocessing mismatch (PyTorch fed BGR, the saved input is RGB) must be reported at the
     framework/ONNX boundary while ONNX vs engine still passes;
  6. a shape matrix over the engine's profile (endpoints and interior) for the transformer.
Exit 0 when every expectation holds.
"""
import os
import subprocess
import sys

import numpy as np
import torch

KILN, WORK = sys.argv[1], sys.argv[2]
os.makedirs(WORK, exist_ok=True)
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def kiln(*args):
    r = subprocess.run([KILN, *map(str, args)], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def result_line(log):
    return next((l for l in log.splitlines() if l.startswith(("RESULT", "kiln: error"))), log[-300:])


def export(name, model, x, in_name, out_name, dyn, opset):
    d = os.path.join(WORK, name)
    os.makedirs(d, exist_ok=True)
    model.eval()
    with torch.no_grad():
        y = model(x)
    path = os.path.join(d, name + ".onnx")
    torch.onnx.export(model, (x,), path, input_names=[in_name], output_names=[out_name], dynamic_axes=dyn,
                      opset_version=opset)
    np.savez(os.path.join(d, "inputs.npz"), **{in_name: x.numpy()})
    np.savez(os.path.join(d, "framework.npz"), **{out_name: y.numpy()})
    return d, path


def boundaries(name, d, path, build_args=()):
    inputs, fw = os.path.join(d, "inputs.npz"), os.path.join(d, "framework.npz")
    # Float32 through different summation orders: 1e-5..1e-4 on O(1) values is expected.
    tol = ["--atol", "1e-4", "--rtol", "1e-3"]
    rc, log = kiln("compare", path, "--ref", fw, "--test", "onnx", "--inputs", inputs, *tol,
                   "--html", os.path.join(d, "framework_vs_onnx.html"))
    check(rc == 0, f"{name}: framework vs ONNX reference: {result_line(log)}")
    rc, log = kiln("compare", path, "--inputs", inputs, "--find-divergence", *tol, *build_args,
                   "--html", os.path.join(d, "onnx_vs_engine.html"), "--save-failure", os.path.join(d, "bundle"))
    check(rc == 0 and "first divergence: none" in log, f"{name}: ONNX reference vs engine (fusions on): {result_line(log)}")
    engine = os.path.join(d, name + ".kiln")
    rc, log = kiln("build", path, "-o", engine, *[a.replace("--build-shapes", "--shapes") for a in build_args])
    check(rc == 0, f"{name}: kiln build")
    rc, log = kiln("compare", path, "--engine", engine, "--inputs", inputs, *tol)
    check(rc == 0, f"{name}: ONNX reference vs {name}.kiln: {result_line(log)}")
    out = os.path.join(d, "engine_out.npz")
    rc, log = kiln("run", engine, "--inputs", inputs, "--save-outputs", out)
    check(rc == 0, f"{name}: kiln run of the engine")
    return engine, out


# ---- resnet18 (image classifier)
import torchvision  # noqa: E402

torch.manual_seed(0)
net = torchvision.models.resnet18(weights=None)
for m in net.modules():
    if isinstance(m, torch.nn.BatchNorm2d):
        m.running_mean.uniform_(-0.1, 0.1)
        m.running_var.uniform_(0.5, 1.5)
rgb = torch.rand(2, 3, 112, 112)  # what the preprocessing produced: RGB, [0, 1]
d, path = export("resnet18", net, rgb, "images", "logits", {"images": {0: "batch"}, "logits": {0: "batch"}}, 13)
engine, engine_out = boundaries("resnet18", d, path)


def labels(logits, k=5):  # identical post-processing on both sides
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.argsort(-p, -1, kind="stable")[:, :k]


fw_logits = np.load(os.path.join(d, "framework.npz"))["logits"]
if os.path.exists(engine_out):
    eng_logits = np.load(engine_out)["logits"]
    check(np.array_equal(labels(fw_logits)[:, 0], labels(eng_logits)[:, 0]),
          f"resnet18: final top-1 labels agree (PyTorch {labels(fw_logits)[:, 0].tolist()}, engine "
          f"{labels(eng_logits)[:, 0].tolist()})")
    check(all(set(a) == set(b) for a, b in zip(labels(fw_logits), labels(eng_logits))), "resnet18: top-5 label sets agree")

# Planted preprocessing mismatch: the framework side ran on BGR, the saved (and deployed) input is RGB.
with torch.no_grad():
    bgr_logits = net(rgb[:, [2, 1, 0]]).numpy()
np.savez(os.path.join(d, "framework_bgr.npz"), logits=bgr_logits)
rc, log = kiln("compare", path, "--ref", os.path.join(d, "framework_bgr.npz"), "--test", "onnx", "--inputs",
               os.path.join(d, "inputs.npz"), "--html", os.path.join(d, "bgr_mismatch.html"))
check(rc == 1 and "boundary:  framework -> onnx-reference" in log,
      "resnet18 RGB/BGR mismatch is reported at the framework/ONNX boundary: " + result_line(log))
print("\n".join(l for l in log.splitlines() if "abs err:" in l or "classifier" in l))
rc, log = kiln("compare", path, "--inputs", os.path.join(d, "inputs.npz"))
check(rc == 0, "... while ONNX reference vs engine on the same input passes (the engine is not at fault)")

# ---- TransformerEncoder (dynamic batch and sequence), with a shape matrix over its profile
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True)
enc = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
tokens = torch.randn(2, 16, 64)
d, path = export("transformer", enc, tokens, "tokens", "hidden",
                 {"tokens": {0: "batch", 1: "seq"}, "hidden": {0: "batch", 1: "seq"}}, 17)
prof = ["--min-shapes", "tokens:1x8x64", "--opt-shapes", "tokens:2x16x64", "--max-shapes", "tokens:4x32x64"]
boundaries("transformer", d, path, prof)
# Shape matrix: profile endpoints (min, max), opt and interior points, against the ONNX reference.
for shape in ("1x8x64", "4x32x64", "2x16x64", "3x20x64", "1x31x64"):
    rc, log = kiln("compare", path, "--shapes", "tokens:" + shape, "--seed", "7", *prof, "--atol", "1e-4")
    check(rc == 0, f"transformer shape {shape}: ONNX reference vs engine: {result_line(log)}")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
