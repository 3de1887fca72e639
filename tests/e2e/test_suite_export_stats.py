#!/usr/bin/env python3
"""The model suite's export conditioning (bench/suite/export.py, models.py), on tiny torch models:
- detector images drawn for the BatchNorm estimate span [-1, 1), the range kiln compare / bench feed
  (they were drawn in [0, 1): fasterrcnn's activations then compounded to ~3e3 on [-1, 1) inputs);
- a torchvision FrozenBatchNorm2d gets estimated statistics in its buffers and stays frozen;
- _scale_logits brings a layer's output (less its bias) to the asked standard deviation.
No kiln involved: seconds.
"""
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "suite"))
import export  # noqa: E402
import models  # noqa: E402

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


torch.manual_seed(0)
imgs = export.random_like(([torch.zeros(3, 8, 8)],), 2)[0]
lo, hi = min(x.min().item() for x in imgs), max(x.max().item() for x in imgs)
check(len(imgs) == 2 and lo < -0.9 and hi > 0.9 and lo >= -1 and hi < 1,
      f"detector images for the estimate span [-1, 1): {len(imgs)} images in [{lo:.3f}, {hi:.3f}]")

try:
    from torchvision.ops.misc import FrozenBatchNorm2d
except ImportError:
    FrozenBatchNorm2d = None
if FrozenBatchNorm2d is not None:
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), FrozenBatchNorm2d(8), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3),
                            FrozenBatchNorm2d(8))
    x = (torch.rand(1, 3, 32, 32) * 2 - 1,)
    with torch.no_grad():
        before = m(*x).std().item()
    n_bn, n_frozen = export.estimate_batchnorm(m, x)
    with torch.no_grad():
        y = m(*x)
    check(n_bn == 2 and n_frozen == 2, f"2 FrozenBatchNorm2d estimated (counted {n_bn}, frozen {n_frozen})")
    check(isinstance(m[1], FrozenBatchNorm2d) and isinstance(m[4], FrozenBatchNorm2d),
          "the model keeps its FrozenBatchNorm2d modules")
    check(0.8 < y.std().item() < 1.2 and y.mean(dim=(0, 2, 3)).abs().max().item() < 0.2,
          f"output normalized: std {before:.3f} -> {y.std().item():.3f}, max |channel mean| "
          f"{y.mean(dim=(0, 2, 3)).abs().max().item():.3f}")

lin = torch.nn.Linear(16, 5)
net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), lin)
x = torch.randn(64, 4)  # the std is set on the inputs given: checked on the same ones
models._scale_logits(net, (x,), lin, 2.0, keep_bias=False)
with torch.no_grad():
    out = net(x)
check(lin.bias.abs().max().item() == 0 and abs(out.std().item() - 2) < 1e-3,
      f"_scale_logits: output std {out.std().item():.3f} (asked 2), bias zeroed")
conv = torch.nn.Conv2d(4, 3, 1)
bias = conv.bias.detach().clone()
x = torch.randn(2, 4, 8, 8)
models._scale_logits(conv, (x,), conv, 2.0, keep_bias=True)
with torch.no_grad():
    spread = (conv(x) - conv.bias.view(1, -1, 1, 1)).std().item()
check(torch.equal(conv.bias.detach(), bias) and abs(spread - 2) < 1e-3, f"_scale_logits on a conv, bias kept: spread around the bias {spread:.3f} (asked 2)")

print("FAILED: %d" % len(failures) if failures else "all passed")
sys.exit(1 if failures else 0)
