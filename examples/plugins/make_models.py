#!/usr/bin/env python3
"""Writes the tiny ONNX models of the plugin examples (Debian's python3-onnx) and holds the numpy
references the tests check kiln's outputs against.

    python3 examples/plugins/make_models.py OUTDIR    # square_plus.onnx, rotary.onnx
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DOMAIN = "my.domain"


def square_plus_ref(x, b):
    return 0.5 * (x + np.sqrt(x.astype(np.float64) ** 2 + b))


def rotary_ref(x, pos, base):
    """LLaMA's rotate-half rotary embedding of x [batch, seq, heads, head_dim] at positions [batch, seq]."""
    d = x.shape[-1]
    inv_freq = base ** (-np.arange(0, d // 2, dtype=np.float64) * 2.0 / d)
    angle = pos.astype(np.float64)[:, :, None, None] * inv_freq  # [batch, seq, 1, d/2]
    x1, x2 = x[..., : d // 2].astype(np.float64), x[..., d // 2:].astype(np.float64)
    return np.concatenate([x1 * np.cos(angle) - x2 * np.sin(angle), x2 * np.cos(angle) + x1 * np.sin(angle)], -1)


def square_plus_model(path, b=1.5, domain=DOMAIN):
    """x [batch, 16] -> MatMul (built-in) -> my.domain::SquarePlus -> y [batch, 8]."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
             helper.make_node("SquarePlus", ["h"], ["y"], name="act", domain=domain, b=b)]
    g = helper.make_graph(nodes, "square_plus", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])
    m.ir_version = 8
    onnx.save(m, path)
    return np.asarray(numpy_helper.to_array(w))


def rotary_model(path, seq=7, heads=3, head_dim=16, base=10000.0, max_positions=256, domain=DOMAIN):
    """q [1, seq, heads, head_dim], pos [1, seq] -> my.domain::RotaryEmbedding -> Transpose (built-in) ->
    y [1, heads, seq, head_dim] (the layout attention consumes)."""
    nodes = [helper.make_node("RotaryEmbedding", ["q", "pos"], ["q_rot"], name="rope", domain=domain,
                              head_dim=head_dim, base=base, max_positions=max_positions),
             helper.make_node("Transpose", ["q_rot"], ["y"], name="to_heads", perm=[0, 2, 1, 3])]
    g = helper.make_graph(nodes, "rotary",
                          [helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, seq, heads, head_dim]),
                           helper.make_tensor_value_info("pos", TensorProto.INT64, [1, seq])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, heads, seq, head_dim])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])
    m.ir_version = 8
    onnx.save(m, path)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    square_plus_model(os.path.join(out, "square_plus.onnx"))
    rotary_model(os.path.join(out, "rotary.onnx"))
    print("wrote", os.path.join(out, "square_plus.onnx"), "and", os.path.join(out, "rotary.onnx"))
