#!/usr/bin/python3
"""One-node ONNX models of the long-tail ops at the shapes the issue-11 models run them at, timed
with `kiln bench --dump-profile` (which kernel ran, and how long the layer took).

  scripts/longtail_ops.py [--kiln build/kiln] [--threads 2] [--only Resize,Pad] [--out DIR]

Prints one line per case: the case, the kernel of its layer (a tactic or "reference") and the
median latency of the whole one-node model. Use it before and after a kernel change, side by side
in one run on a loaded machine (two kiln binaries: --kiln A,B)."""
import argparse
import os
import re
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def model(name, node_specs, inputs, outputs, inits=(), opset=17):
    nodes = [helper.make_node(op, ins, outs, **attrs) for op, ins, outs, attrs in node_specs]
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                          [numpy_helper.from_array(v, n) for n, v in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def i64(*v):
    return np.array(v, dtype=np.int64)


def f32(*v):
    return np.array(v, dtype=np.float32)


def cases():
    c = {}
    # LR-ASPP head: bilinear upsampling to the input's size; FPN / U-Net style nearest x2.
    c["Resize_linear_21x28to224"] = model("r", [("Resize", ["x", "", "s"], ["y"], dict(mode="linear"))],
                                          [("x", F, [1, 21, 28, 28])], [("y", F, None)],
                                          [("s", f32(1, 1, 8, 8))])
    c["Resize_linear_128x14to28_ac"] = model(
        "r", [("Resize", ["x", "", "", "sz"], ["y"], dict(mode="linear", coordinate_transformation_mode="align_corners"))],
        [("x", F, [1, 128, 14, 14])], [("y", F, None)], [("sz", i64(1, 128, 28, 28))])
    c["Resize_nearest_64x56to112"] = model("r", [("Resize", ["x", "", "s"], ["y"], dict(mode="nearest"))],
                                           [("x", F, [1, 64, 56, 56])], [("y", F, None)],
                                           [("s", f32(1, 1, 2, 2))])
    # Swin: window padding, window partition, shifts (torch.roll: Slice + Concat)
    c["Pad_const_1x56x56x96"] = model("p", [("Pad", ["x", "p"], ["y"], {})], [("x", F, [1, 56, 56, 96])],
                                      [("y", F, None)], [("p", i64(0, 0, 0, 0, 0, 7, 7, 0))])
    c["Pad_reflect_1x64x112x112"] = model("p", [("Pad", ["x", "p"], ["y"], dict(mode="reflect"))],
                                          [("x", F, [1, 64, 112, 112])], [("y", F, None)],
                                          [("p", i64(0, 0, 1, 1, 0, 0, 1, 1))])
    c["Transpose_swin_window"] = model("t", [("Transpose", ["x"], ["y"], dict(perm=[0, 1, 3, 2, 4, 5]))],
                                       [("x", F, [1, 8, 7, 8, 7, 96])], [("y", F, None)])
    c["Transpose_heads_1x128x12x64"] = model("t", [("Transpose", ["x"], ["y"], dict(perm=[0, 2, 1, 3]))],
                                             [("x", F, [1, 128, 12, 64])], [("y", F, None)])
    c["Transpose_keyT_1x12x128x64"] = model("t", [("Transpose", ["x"], ["y"], dict(perm=[0, 1, 3, 2]))],
                                            [("x", F, [1, 12, 128, 64])], [("y", F, None)])
    c["Transpose_nchw2nhwc_96x56"] = model("t", [("Transpose", ["x"], ["y"], dict(perm=[0, 2, 3, 1]))],
                                           [("x", F, [1, 96, 56, 56])], [("y", F, None)])
    c["Slice_roll_1x56x56x96"] = model("s", [("Slice", ["x", "st", "en", "ax"], ["y"], {})],
                                       [("x", F, [1, 56, 56, 96])], [("y", F, None)],
                                       [("st", i64(3)), ("en", i64(56)), ("ax", i64(1))])
    c["Concat_roll_1x56x56x96"] = model("c", [("Concat", ["a", "b"], ["y"], dict(axis=2))],
                                        [("a", F, [1, 56, 53, 96]), ("b", F, [1, 56, 3, 96])], [("y", F, None)])
    c["Split_qkv_1x128x2304"] = model("s", [("Split", ["x"], ["q", "k", "v"], dict(axis=2, num_outputs=3))],
                                      [("x", F, [1, 128, 2304])],
                                      [("q", F, None), ("k", F, None), ("v", F, None)], opset=18)
    c["Gather_cls_1x197x768"] = model("g", [("Gather", ["x", "i"], ["y"], dict(axis=1))],
                                      [("x", F, [1, 197, 768])], [("y", F, None)], [("i", np.array(0, np.int64))])
    c["Gather_embed_30522x768"] = model("g", [("Gather", ["w", "i"], ["y"], dict(axis=0))], [("i", I64, [1, 128])],
                                        [("y", F, None)],
                                        [("w", np.random.rand(30522, 768).astype(np.float32))])
    c["Expand_mask_1x12x128x128"] = model("e", [("Expand", ["x", "s"], ["y"], {})], [("x", F, [1, 1, 128, 128])],
                                          [("y", F, None)], [("s", i64(1, 12, 128, 128))])
    c["Tile_2x3_64x56x56"] = model("t", [("Tile", ["x", "r"], ["y"], {})], [("x", F, [1, 64, 56, 56])],
                                   [("y", F, None)], [("r", i64(1, 2, 1, 3))])
    # GPT-2 causal mask, T5, comparisons
    c["Where_mask_1x12x128x128"] = model("w", [("Where", ["c", "x", "m"], ["y"], {})],
                                         [("c", B, [1, 1, 128, 128]), ("x", F, [1, 12, 128, 128])],
                                         [("y", F, None)], [("m", f32(-3.4e38))])
    c["Less_1x12x128x128"] = model("l", [("Less", ["a", "b"], ["y"], {})],
                                   [("a", F, [1, 12, 128, 128]), ("b", F, [1, 1, 1, 128])], [("y", B, None)])
    c["Equal_i64_1x128x128"] = model("l", [("Equal", ["a", "b"], ["y"], {})],
                                     [("a", I64, [1, 128, 128]), ("b", I64, [1, 1, 128])], [("y", B, None)])
    c["IsNaN_1x128x512"] = model("n", [("IsNaN", ["x"], ["y"], {})], [("x", F, [1, 128, 512])], [("y", B, None)])
    c["Not_1x12x128x128"] = model("n", [("Not", ["x"], ["y"], {})], [("x", B, [1, 12, 128, 128])], [("y", B, None)])
    c["And_1x12x128x128"] = model("n", [("And", ["a", "b"], ["y"], {})],
                                  [("a", B, [1, 12, 128, 128]), ("b", B, [1, 1, 128, 128])], [("y", B, None)])
    c["Mish_1x64x112x112"] = model("m", [("Mish", ["x"], ["y"], {})], [("x", F, [1, 64, 112, 112])],
                                   [("y", F, None)], opset=18)
    c["Cast_i64_to_f_1x12x128x128"] = model("c", [("Cast", ["x"], ["y"], dict(to=F))],
                                            [("x", I64, [1, 12, 128, 128])], [("y", F, None)])
    # reductions: T5 RMSNorm, MobileNetV3 squeeze-excite, others
    c["ReduceMean_last_1x128x512"] = model("r", [("ReduceMean", ["x"], ["y"], dict(axes=[-1]))],
                                           [("x", F, [1, 128, 512])], [("y", F, None)])
    c["ReduceMean_hw_1x576x14x14"] = model("r", [("ReduceMean", ["x"], ["y"], dict(axes=[2, 3]))],
                                           [("x", F, [1, 576, 14, 14])], [("y", F, None)])
    c["ReduceSum_c_1x64x56x56"] = model("r", [("ReduceSum", ["x", "a"], ["y"], {})], [("x", F, [1, 64, 56, 56])],
                                        [("y", F, None)], [("a", i64(1))])
    c["ReduceMax_last_1x12x128x128"] = model("r", [("ReduceMax", ["x"], ["y"], dict(axes=[-1]))],
                                             [("x", F, [1, 12, 128, 128])], [("y", F, None)])
    c["ReduceL2_last_1x128x768"] = model("r", [("ReduceL2", ["x"], ["y"], dict(axes=[-1]))],
                                         [("x", F, [1, 128, 768])], [("y", F, None)])
    c["Softmax_axis1_1x21x224x224"] = model("s", [("Softmax", ["x"], ["y"], dict(axis=1))],
                                            [("x", F, [1, 21, 224, 224])], [("y", F, None)])
    c["MatMul_4d_1x12x128x64"] = model("m", [("MatMul", ["a", "b"], ["y"], {})],
                                       [("a", F, [1, 12, 128, 64]), ("b", F, [1, 12, 64, 128])], [("y", F, None)])
    c["MatMul_bcast_1x12x128x64_w"] = model("m", [("MatMul", ["a", "b"], ["y"], {})], [("a", F, [1, 12, 128, 64])],
                                            [("y", F, None)], [("b", np.random.rand(12, 64, 64).astype(np.float32))])
    c["InstanceNorm_1x64x56x56"] = model("n", [("InstanceNormalization", ["x", "s", "b"], ["y"], {})],
                                         [("x", F, [1, 64, 56, 56])], [("y", F, None)],
                                         [("s", np.ones(64, np.float32)), ("b", np.zeros(64, np.float32))])
    c["GroupNorm_1x64x56x56_g32"] = model("n", [("GroupNormalization", ["x", "s", "b"], ["y"], dict(num_groups=32))],
                                          [("x", F, [1, 64, 56, 56])], [("y", F, None)],
                                          [("s", np.ones(32, np.float32)), ("b", np.zeros(32, np.float32))], opset=18)
    c["Dropout_eval_1x56x56x96"] = model("d", [("Dropout", ["x", "r", "t"], ["y"], {})], [("x", F, [1, 56, 56, 96])],
                                         [("y", F, None)], [("r", f32(0.1)[0:1].reshape([])),
                                                            ("t", np.array(False))])
    c["Pad_zero_1x128x28x28"] = model("p", [("Pad", ["x", "p"], ["y"], {})], [("x", F, [1, 128, 28, 28])],
                                      [("y", F, None)], [("p", i64(0, 0, 0, 0, 0, 0, 0, 0))])
    c["CumSum_1x128x768"] = model("c", [("CumSum", ["x", "a"], ["y"], {})], [("x", F, [1, 128, 768])],
                                  [("y", F, None)], [("a", np.array(1, np.int64))])
    return c


def bench(kiln, path, threads):
    r = subprocess.run([kiln, "bench", path, "--dump-profile", "--threads", str(threads), "--duration", "1",
                        "--warmup-ms", "100"], capture_output=True, text=True)
    out = r.stdout + r.stderr
    if r.returncode != 0:
        return "error", float("nan"), out.strip().splitlines()[-1] if out.strip() else "?"
    med = re.search(r"median[ =:]+([0-9.]+) *ms", out)
    return out, float(med.group(1)) if med else float("nan"), ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="build/kiln", help="kiln binaries, comma-separated")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="")
    ap.add_argument("--out", default="/tmp/longtail_models")
    ap.add_argument("--raw", action="store_true", help="print the bench output")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    only = [s for s in a.only.split(",") if s]
    kilns = a.kiln.split(",")
    print("%-30s " % "case" + " ".join("%-28s %9s" % ("kernel", "median ms") for _ in kilns))
    for name, m in cases().items():
        if only and not any(name.startswith(o) for o in only):
            continue
        path = os.path.join(a.out, name + ".onnx")
        onnx.save(m, path)
        row = "%-30s " % name
        for k in kilns:
            out, med, err = bench(k, path, a.threads)
            if a.raw:
                print(out)
            kern = "?"
            found = re.findall(r"\b(reference|[a-z0-9_]+_(?:kiln|onednn)[a-z0-9_]*)\b", out)
            if found:
                kern = found[-1]
            row += "%-28s %9.3f " % (kern if not err else "ERR " + err[:22], med)
        print(row, flush=True)


if __name__ == "__main__":
    main()
