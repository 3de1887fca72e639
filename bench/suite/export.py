#!/usr/bin/env python3
"""Exports one model of the suite (bench/suite/models.py) to ONNX.

usage: export.py NAME OUTDIR
Writes OUTDIR/NAME.onnx and OUTDIR/NAME.export.json (opset, export path, op counts, seconds). Run in
its own process by suite.py, so that an exporter crash is one failed row, not a failed suite.

BatchNorm statistics: reset, then estimated on random inputs (3 train-mode forwards of the BatchNorm
layers only, momentum=None: a cumulative average), then eval. Without this, random-init statistics
(mean 0, var 1) leave activations that grow or vanish layer after layer, and kernels would be timed on
degenerate data (denormals, all-zero ReLUs). torchvision's FrozenBatchNorm2d (fixed buffers, used by
detection backbones built with pretrained weights) is estimated the same way: swapped for a BatchNorm2d
for the estimate, its statistics written back into the frozen buffers. (torchvision 0.14 builds the
suite's detectors, weights_backbone=None, with plain BatchNorm2d: none is frozen today.)

The estimate must see the inputs the model is run on: random values in [-1, 1), as `kiln compare`,
`kiln bench` and the suite feed. Detector images were once drawn in [0, 1) for the estimate only; on
[-1, 1) inputs each layer of fasterrcnn_mobilenet_v3's backbone then saw a variance up to 10x the
estimated one, the error compounded to activations of ~3e3 at the backbone's end (std ~400 instead of
~1), and FP32 rounding was amplified enough for kiln and ONNX Runtime alike to disagree with the
reference interpreter's detections (bench/results/2026-12-01-s8-frcnn.txt).
"""
import collections
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import BY_NAME  # noqa: E402


def random_like(inputs, batch):
    """Fresh random inputs with the example's structure; images and features in [-1, 1)."""
    out = []
    for t in inputs:
        if isinstance(t, list):
            out.append([torch.rand(x.shape) * 2 - 1 for x in t for _ in range(batch)])  # detectors: images
        elif t.dtype.is_floating_point:
            out.append(torch.rand((batch,) + tuple(t.shape[1:])) * 2 - 1)
        else:
            out.append(t.repeat((batch,) + (1,) * (t.dim() - 1)))
    return tuple(out)


def _swap_frozen_batchnorm(model):
    """Replaces each torchvision FrozenBatchNorm2d by a BatchNorm2d with its affine parameters (frozen:
    requires_grad off); returns [(BatchNorm2d, FrozenBatchNorm2d)] to write the statistics back."""
    try:
        from torchvision.ops.misc import FrozenBatchNorm2d
    except ImportError:
        return []
    pairs = []
    for parent in list(model.modules()):
        for key, child in list(parent.named_children()):
            if isinstance(child, FrozenBatchNorm2d):
                bn = torch.nn.BatchNorm2d(child.weight.numel(), eps=child.eps)
                bn.weight.data.copy_(child.weight)
                bn.bias.data.copy_(child.bias)
                bn.requires_grad_(False)
                setattr(parent, key, bn)
                pairs.append((parent, key, bn, child))
    return pairs


def estimate_batchnorm(model, inputs, passes=3, batch=4):
    frozen = _swap_frozen_batchnorm(model)
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    model.eval()
    if not bns:
        return 0, 0
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
        m.train()
    with torch.no_grad():
        for _ in range(passes):
            model(*random_like(inputs, batch))
    model.eval()
    for parent, key, bn, fbn in frozen:  # back into the frozen buffers: the model keeps torchvision's modules
        fbn.running_mean.copy_(bn.running_mean)
        fbn.running_var.copy_(bn.running_var)
        setattr(parent, key, fbn)
    return len(bns), len(frozen)


def main():
    name, outdir = sys.argv[1], sys.argv[2]
    spec = BY_NAME[name]
    os.makedirs(outdir, exist_ok=True)
    torch.manual_seed(0)
    t0 = time.time()
    model, inputs = spec.make()
    n_bn, n_frozen = estimate_batchnorm(model, inputs, batch=2 if spec.family in ("detection", "segmentation") else 4)
    if hasattr(spec.make, "condition"):  # model-specific init scaling after the estimate (models.py)
        spec.make.condition(model, random_like(inputs, 1))
    t_bn = time.time() - t0
    path = os.path.join(outdir, name + ".onnx")
    tmp = path + ".tmp"
    # Grad mode stays on: under no_grad, torch 1.13's nn.MultiheadAttention (ViT) takes its fused fast
    # path, aten::_native_multi_head_attention, which has no ONNX export.
    torch.onnx.export(model, inputs, tmp, input_names=[i.name for i in spec.inputs], output_names=spec.outputs,
                      dynamic_axes=spec.dynamic, opset_version=spec.opset, do_constant_folding=True)
    import onnx
    m = onnx.load(tmp, load_external_data=False)
    ops = collections.Counter(n.op_type for n in m.graph.node)
    os.replace(tmp, path)
    meta = {"name": name, "opset": spec.opset, "dynamic": bool(spec.dynamic), "batchnorms_estimated": n_bn,
            "frozen_batchnorms_estimated": n_frozen,
            "torch": torch.__version__, "exporter": "torch.onnx.export (TorchScript)", "nodes": len(m.graph.node),
            "ops": dict(ops.most_common()), "bn_estimate_s": round(t_bn, 1), "total_s": round(time.time() - t0, 1),
            "bytes": os.path.getsize(path)}
    with open(os.path.join(outdir, name + ".export.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps({k: meta[k] for k in ("name", "opset", "nodes", "total_s")}))


if __name__ == "__main__":
    main()
