#!/usr/bin/python3
"""One-op ONNX models at BERT-base (batch 32, seq 128) sizes for timing kiln's own CUDA kernels.

  /usr/bin/python3 bench/gpu/kernels.py OUT_DIR     writes OUT_DIR/<name>.onnx (float32 models;
                                                    build them with --fp16 or --bf16 for reduced storage)
bench/gpu/kernels.sh runs `kiln bench` on each. The byte counts printed are what a kernel must move
at least (inputs read once, output written once, in float16): at ~4 TB/s (H200) 1 MB takes ~0.25 us.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

B, H, S, D, E, F = 32, 12, 128, 64, 768, 3072


def model(name, inputs, nodes, inits=(), opset=17):
    g = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a.astype(np.float32), n) for n, a in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    n = helper.make_node
    scores = [B, H, S, S]
    cases = {
        # The attention mask: [B, H, S, S] + [B, 1, 1, S] (the broadcast kernel, 59 us before).
        "add_mask": model("add_mask", [("x", scores), ("m", [B, 1, 1, S])], [n("Add", ["x", "m"], ["y"])]),
        "add_same": model("add_same", [("x", scores), ("z", scores)], [n("Add", ["x", "z"], ["y"])]),
        "add_row": model("add_row", [("x", [B * S, F])], [n("Add", ["x", "b"], ["y"])],
                         [("b", rng.standard_normal(F))]),
        "softmax": model("softmax", [("x", scores)], [n("Softmax", ["x"], ["y"], axis=-1)]),
        # x * 0.5 * (1 + erf(x / sqrt 2)): fuse_gelu makes kiln.Gelu (the unary kernel, 46 us before).
        "gelu": model("gelu", [("x", [B * S, F])], [
            n("Div", ["x", "sqrt2"], ["d"]), n("Erf", ["d"], ["e"]), n("Add", ["e", "one"], ["p"]),
            n("Mul", ["x", "p"], ["q"]), n("Mul", ["q", "half"], ["y"])
        ], [("sqrt2", np.array(np.sqrt(2.0))), ("one", np.array(1.0)), ("half", np.array(0.5))]),
        "layer_norm": model("layer_norm", [("x", [B * S, E])],
                            [n("LayerNormalization", ["x", "g", "be"], ["y"], axis=-1)],
                            [("g", rng.standard_normal(E)), ("be", rng.standard_normal(E))]),
        "transpose_heads": model("transpose_heads", [("x", [B, S, H, D])],
                                 [n("Transpose", ["x"], ["y"], perm=[0, 2, 1, 3])]),
        "transpose_last2": model("transpose_last2", [("x", [B, H, S, D])],
                                 [n("Transpose", ["x"], ["y"], perm=[0, 1, 3, 2])]),
        # A chain fuse_elementwise makes one kiln.FusedElementwise of on CUDA now (4 kernels before).
        "fused_chain": model("fused_chain", [("x", [B * S, F])], [
            n("Add", ["x", "b"], ["a"]), n("Mul", ["a", "s"], ["m"]), n("Tanh", ["m"], ["t"]),
            n("Mul", ["t", "x"], ["y"])
        ], [("b", rng.standard_normal(F)), ("s", rng.standard_normal(F))]),
    }
    for name, m in cases.items():
        onnx.save(m, os.path.join(out, name + ".onnx"))
    sizes = {"add_mask": 2 * B * H * S * S + B * S, "add_same": 3 * B * H * S * S, "add_row": 2 * B * S * F,
             "softmax": 2 * B * H * S * S, "gelu": 2 * B * S * F, "layer_norm": 2 * B * S * E,
             "transpose_heads": 2 * B * S * H * D, "transpose_last2": 2 * B * S * H * D, "fused_chain": 2 * B * S * F}
    for name, elems in sizes.items():
        mb = elems * 2 / 1e6
        print(f"{name}: {mb:.1f} MB moved in float16, ideal ~{mb / 4.0:.1f} us at 4 TB/s")


if __name__ == "__main__":
    main()
