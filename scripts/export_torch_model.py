#!/usr/bin/env python3
"""Exports a PyTorch model to ONNX with a saved input and PyTorch's own output.

usage: export_torch_model.py NAME OUTDIR [--opset N]
NAME: resnet18 | resnet50 | mobilenet_v2 | transformer_encoder | bert_encoder
Writes OUTDIR/NAME.onnx, OUTDIR/NAME_inputs.npz (by ONNX input name) and OUTDIR/NAME_expected.npz
(by ONNX output name). Weights are random with a fixed seed: parity, not accuracy, is the point.
"""
import argparse
import os

import numpy as np
import torch


class BertLayer(torch.nn.Module):
    """One post-LN BERT encoder layer written out by hand (no nn.MultiheadAttention), so the export
    shows the patterns kiln fuses: Q/K/V Linear, heads split by reshape/transpose,
    softmax(Q K^T / sqrt(d) + mask) V, output projection, residual + LayerNorm, GELU FFN."""

    def __init__(self, hidden, heads, ffn):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.q = torch.nn.Linear(hidden, hidden)
        self.k = torch.nn.Linear(hidden, hidden)
        self.v = torch.nn.Linear(hidden, hidden)
        self.out = torch.nn.Linear(hidden, hidden)
        self.ln1 = torch.nn.LayerNorm(hidden, eps=1e-12)
        self.ff1 = torch.nn.Linear(hidden, ffn)
        self.ff2 = torch.nn.Linear(ffn, hidden)
        self.ln2 = torch.nn.LayerNorm(hidden, eps=1e-12)

    def split_heads(self, x):
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_dim).transpose(1, 2)  # [B, H, S, D]

    def forward(self, x, mask):
        import math
        q, k, v = self.split_heads(self.q(x)), self.split_heads(self.k(x)), self.split_heads(self.v(x))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim) + mask
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
        b, h, s, d = ctx.shape
        ctx = ctx.transpose(1, 2).reshape(b, s, h * d)
        x = self.ln1(x + self.out(ctx))
        return self.ln2(x + self.ff2(torch.nn.functional.gelu(self.ff1(x))))


class BertEncoder(torch.nn.Module):
    """BERT-base-like: token + position embeddings, embedding LayerNorm, 12 layers, additive mask
    (1 - attention_mask) * -10000 broadcast over heads and query positions."""

    def __init__(self, vocab=1000, hidden=768, heads=12, ffn=3072, layers=12, max_len=512):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, hidden)
        self.pos = torch.nn.Embedding(max_len, hidden)
        self.ln = torch.nn.LayerNorm(hidden, eps=1e-12)
        self.layers = torch.nn.ModuleList([BertLayer(hidden, heads, ffn) for _ in range(layers)])

    def forward(self, input_ids, attention_mask):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = self.ln(self.tok(input_ids) + self.pos(positions))
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, mask)
        return x


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
    if name == "bert_encoder":
        # Opset 13: LayerNormalization and GELU come out decomposed (ReduceMean/Sub/Pow/..., Erf).
        model = BertEncoder()
        ids = torch.randint(0, 1000, (1, 128))
        mask = torch.ones(1, 128, dtype=torch.int64)
        mask[:, 100:] = 0  # padding at the end
        return (model, (ids, mask), ["input_ids", "attention_mask"], ["hidden"],
                {"input_ids": {0: "batch"}, "attention_mask": {0: "batch"}, "hidden": {0: "batch"}}, 13)
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
