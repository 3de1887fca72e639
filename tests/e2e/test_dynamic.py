#!/usr/bin/env python3
"""Dynamic shapes end to end: a small CNN (dynamic batch, H, W) and a TransformerEncoder (dynamic batch,
seq) exported from PyTorch, built with --profile, run over a shape matrix through the engine and compared
with the reference interpreter on the ONNX model; the outside point gives the documented error; inspect
and run report activation memory at seq 16 vs 512.

usage: test_dynamic.py KILN WORKDIR
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import torch

from e2e_util import WORK, check, finish, kiln, make_workdir

HERE = os.path.dirname(os.path.abspath(__file__))
make_workdir()


def export_cnn(path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(16, 10)).eval()
    torch.onnx.export(model, (torch.rand(1, 3, 32, 32),), path, input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch"}},
                      opset_version=13)


def shape_matrix(onnx, engine, name, points, tag):
    rng = np.random.default_rng(0)
    for shape, want_profile in points:
        inp = os.path.join(WORK, f"{tag}_in.npz")
        ref = os.path.join(WORK, f"{tag}_ref.npz")
        np.savez(inp, **{name: rng.standard_normal(shape).astype(np.float32)})
        rc, log = kiln("run", onnx, "--inputs", inp, "--save-outputs", ref)
        if rc != 0:
            check(False, f"{tag} reference run at {shape}: {log}")
            continue
        rc, log = kiln("run", engine, "--inputs", inp, "--expect-outputs", ref, "--atol", "1e-4")
        m = re.search(r"profile (\d+)", log)
        check(rc == 0 and "MATCH" in log and m and int(m.group(1)) == want_profile,
              f"{tag} {shape}: engine matches the reference on profile {want_profile}" + ("" if rc == 0 else ": " + log))


# CNN: dynamic batch and H/W.
cnn = os.path.join(WORK, "cnn.onnx")
export_cnn(cnn)
cnn_engine = os.path.join(WORK, "cnn.kiln")
rc, log = kiln("build", cnn, "-o", cnn_engine, "--profile", "x:1x3x32x32/2x3x64x64/4x3x224x224")
check(rc == 0, "build the CNN with one profile" + ("" if rc == 0 else ": " + log))
shape_matrix(cnn, cnn_engine, "x", [((1, 3, 32, 32), 0), ((2, 3, 64, 64), 0), ((4, 3, 224, 224), 0),
                                    ((3, 3, 97, 150), 0), ((1, 3, 33, 224), 0), ((2, 3, 223, 35), 0)], "cnn")
rc, log = kiln("run", cnn_engine, "--shapes", "x:1x3x225x224")
check(rc == 3 and "input 'x' [batch,3,height,width] has shape [1,3,225,224] outside profile 0 "
      "(min [1,3,32,32] max [4,3,224,224]): dim 2 ('height') = 225 > max 224 — build with a wider --max-shapes"
      in log, "CNN outside the profile (H=225): documented error, exit 3")
rc, log = kiln("build", cnn, "-o", os.path.join(WORK, "bad.kiln"), "--profile", "x:1x1x32x32/1x3x32x32/1x3x32x32")
check(rc == 3 and "dim 1 is fixed to 3" in log, "a profile overriding a fixed dim is refused at build time")

# Transformer encoder: dynamic batch and seq; two profiles (batch 1 with seq 1-512, batch 2-4 with seq 1-128).
subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "scripts", "export_torch_model.py"),
                "transformer_encoder", WORK], check=True, capture_output=True)
tr = os.path.join(WORK, "transformer_encoder.onnx")
tr_engine = os.path.join(WORK, "transformer.kiln")
rc, log = kiln("build", tr, "-o", tr_engine, "--profile", "long=tokens:1x1x64/1x16x64/1x512x64",
               "--profile", "batched=tokens:2x1x64/2x16x64/4x128x64")
check(rc == 0, "build the transformer with two profiles" + ("" if rc == 0 else ": " + log))
shape_matrix(tr, tr_engine, "tokens", [((1, 1, 64), 0), ((1, 16, 64), 0), ((1, 512, 64), 0), ((1, 127, 64), 0),
                                       ((2, 1, 64), 1), ((4, 128, 64), 1), ((3, 127, 64), 1), ((2, 16, 64), 1)],
             "transformer")
rc, log = kiln("run", tr_engine, "--shapes", "tokens:2x129x64")
check(rc == 3 and "outside profile 0 'long' (min [1,1,64] max [1,512,64]): dim 0 ('batch') = 2 > max 1, "
      "profile 1 'batched' (min [2,1,64] max [4,128,64]): dim 1 ('seq') = 129 > max 128" in log,
      "transformer outside both profiles: error lists both ranges")
rc, log = kiln("run", tr_engine, "--shapes", "tokens:1x16x64", "--profile-index", "1")
check(rc == 3 and "profile 1 was forced" in log, "--profile-index forces (and checks) a profile")

# Memory follows the sequence length: inspect (planned) and run (measured).
rc, out = kiln("inspect", tr_engine, "--format", "json")
j = json.loads(out)
mem = j["profiles"][0]["memory"]
check(j["profiles"][0]["inputs"][0]["dims"] == "[batch,seq,64]", "inspect shows the symbolic dims")
check(mem["opt"] * 10 <= mem["max"], f"inspect: planned memory at seq 16 ({mem['opt']} B) <= 10% of seq 512 ({mem['max']} B)")
rc, text = kiln("inspect", tr_engine)
check("profile  0 'long': activation memory min" in text and "[batch,seq,64]" in text, "inspect text lists the profiles")
measured = {}
for seq in (16, 512):
    rc, log = kiln("run", tr_engine, "--shapes", f"tokens:1x{seq}x64")
    m = re.search(r"memory activation (\d+) bytes", log)
    measured[seq] = int(m.group(1)) if m else -1
check(measured[16] > 0 and measured[16] * 10 <= measured[512],
      f"run: measured activation memory at seq 16 ({measured[16]} B) <= 10% of seq 512 ({measured[512]} B)")
print(f"figures: planned seq16 {mem['opt']} B, seq512 {mem['max']} B; measured seq16 {measured[16]} B, "
      f"seq512 {measured[512]} B")

finish()
