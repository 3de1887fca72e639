#!/usr/bin/env python3
"""Exports a PyTorch model to ONNX with a saved input and PyTorch's own output.

usage: export_torch_model.py NAME OUTDIR [--opset N]
NAME: resnet18 | resnet50 | mobilenet_v2 | transformer_encoder
Writes OUTDIR/NAME.onnx, OUTDIR/NAME_inputs.npz (by ONNX input name) and OUTDIR/NAME_expected.npz
(by ONNX output name). Weights are random with a fixed seed: parity, not accuracy, is the point.
"""
import argparse
import os

import numpy as np
import torch


def build(name):
    torch.manual_seed(0)
    if name in ("resnet18", "resnet50", "mobilenet_v2"):
        import torchvision
        model = getattr(torchvision.models, name)(weights=None)
        # Random-init BatchNorm statistics so that folding and normalization are really exercised.
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
        x = torch.rand(1, 3, 224, 224)
        return model, (x,), ["input"], ["logits"], {"input": {0: "batch"}, "logits": {0: "batch"}}, 13
    if name == "transformer_encoder":
        layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0,
                                                 batch_first=True)
        model = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        x = torch.randn(2, 16, 64)
        return model, (x,), ["tokens"], ["hidden"], {"tokens": {0: "batch", 1: "seq"}, "hidden": {0: "batch", 1: "seq"}}, 17
    raise SystemExit(f"unknown model {name}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("outdir")
    ap.add_argument("--opset", type=int, default=None)
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    model, inputs, in_names, out_names, dyn, opset = build(args.name)
    model.eval()
    with torch.no_grad():
        expected = model(*inputs)
    if isinstance(expected, torch.Tensor):
        expected = (expected,)
    path = os.path.join(args.outdir, args.name + ".onnx")
    torch.onnx.export(model, inputs, path, input_names=in_names, output_names=out_names,
                      dynamic_axes=dyn, opset_version=args.opset or opset)
    np.savez(os.path.join(args.outdir, args.name + "_inputs.npz"),
             **{n: t.numpy() for n, t in zip(in_names, inputs)})
    np.savez(os.path.join(args.outdir, args.name + "_expected.npz"),
             **{n: t.numpy() for n, t in zip(out_names, expected)})
    print(f"exported {path} (opset {args.opset or opset})")


if __name__ == "__main__":
    main()
