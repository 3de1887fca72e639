#!/usr/bin/env python3
"""End-to-end tests of the kiln CLI: inputs in every format, output files, seeds, exit codes, errors.

usage: test_cli.py KILN WORKDIR
"""
import os
import re

import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

from e2e_util import WORK, check, finish, kiln, make_workdir

make_workdir()


def save_model(nodes, inputs, outputs, name, inits=()):
    g = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="kiln-e2e")
    m.ir_version = 8
    path = os.path.join(WORK, name + ".onnx")
    onnx.save(m, path)
    return path


# y:0/out = (x + w) * x with an output name that needs sanitizing.
w = np.array([1, 2, 3], dtype=np.float32)
model = save_model(
    [helper.make_node("Add", ["x", "w"], ["s"], name="add"), helper.make_node("Mul", ["s", "x"], ["y:0/out"], name="mul")],
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
    [helper.make_tensor_value_info("y:0/out", TensorProto.FLOAT, ["batch", 3])], "small",
    [numpy_helper.from_array(w, "w")])
x = np.arange(6, dtype=np.float32).reshape(2, 3)
want = (x + w) * x

np.save(os.path.join(WORK, "x.npy"), x)
out_dir = os.path.join(WORK, "out_npy")
rc, log = kiln("run", model, "--input", "x=" + os.path.join(WORK, "x.npy"), "--output-dir", out_dir)
check(rc == 0, "run with --input .npy exits 0")
out_file = os.path.join(out_dir, "y_0_out.npy")
check(os.path.exists(out_file), "output name is sanitized to y_0_out.npy")
check(os.path.exists(out_file) and np.array_equal(np.load(out_file), want), "output values are right")
check("shape [2,3] dtype float32" in log and "NaN 0 Inf 0" in log, "summary line has shape, dtype and NaN/Inf counts")

np.savez_compressed(os.path.join(WORK, "in.npz"), x=x)
rc, log = kiln("run", model, "--inputs", os.path.join(WORK, "in.npz"), "--output-dir", os.path.join(WORK, "out_npz"))
check(rc == 0 and np.array_equal(np.load(os.path.join(WORK, "out_npz", "y_0_out.npy")), want), "run with compressed --inputs .npz")

with open(os.path.join(WORK, "x.pb"), "wb") as f:
    f.write(numpy_helper.from_array(x, "x").SerializeToString())
rc, log = kiln("run", model, "--input", "x=" + os.path.join(WORK, "x.pb"), "--output-dir", os.path.join(WORK, "out_pb"))
check(rc == 0 and np.array_equal(np.load(os.path.join(WORK, "out_pb", "y_0_out.npy")), want), "run with a TensorProto .pb input")

rc, log = kiln("run", model, "--inputs", os.path.join(WORK, "in.npz"), "--output-dir", os.path.join(WORK, "out_pbfmt"),
               "--output-format", "pb", "--save-outputs", os.path.join(WORK, "all.npz"))
pb_out = os.path.join(WORK, "out_pbfmt", "y_0_out.pb")
check(rc == 0 and os.path.exists(pb_out) and np.array_equal(numpy_helper.to_array(onnx.load_tensor(pb_out)), want),
      "--output-format pb writes TensorProto files")
check(rc == 0 and np.array_equal(np.load(os.path.join(WORK, "all.npz"))["y:0/out"], want), "--save-outputs writes one .npz")

np.savez(os.path.join(WORK, "expected.npz"), **{"y:0/out": want})
rc, log = kiln("run", model, "--inputs", os.path.join(WORK, "in.npz"), "--expect-outputs", os.path.join(WORK, "expected.npz"))
check(rc == 0 and "MATCH" in log, "--expect-outputs matches")
np.savez(os.path.join(WORK, "wrong.npz"), **{"y:0/out": want + 1})
rc, log = kiln("run", model, "--inputs", os.path.join(WORK, "in.npz"), "--expect-outputs", os.path.join(WORK, "wrong.npz"))
check(rc == 1 and "differ" in log, "--expect-outputs mismatch exits 1")

outs = []
for seed in ("7", "7", "8"):
    d = os.path.join(WORK, "seed" + seed + str(len(outs)))
    rc, log = kiln("run", model, "--seed", seed, "--shapes", "x:4x3", "--output-dir", d)
    outs.append(np.load(os.path.join(d, "y_0_out.npy")) if rc == 0 else None)
check(outs[0] is not None and outs[0].shape == (4, 3), "random inputs follow --shapes")
check(outs[0] is not None and np.array_equal(outs[0], outs[1]), "same --seed gives the same random inputs")
check(outs[0] is not None and not np.array_equal(outs[0], outs[2]), "another --seed gives other inputs")

rc, log = kiln("run", model, "--input", "x=" + os.path.join(WORK, "x.npy").replace("x.npy", "nope.npy"))
check(rc == 3 and "nope.npy" in log, "missing input file: exit 3 naming the file")
np.save(os.path.join(WORK, "xi.npy"), x.astype(np.int64))
rc, log = kiln("run", model, "--input", "x=" + os.path.join(WORK, "xi.npy"))
check(rc == 3 and "expects dtype float32" in log, "wrong input dtype: exit 3 with the expected dtype")

bad = save_model([helper.make_node("Frobnicate", ["x"], ["y"], name="f1"), helper.make_node("Zap", ["y"], ["z"], name="f2")],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                 [helper.make_tensor_value_info("z", TensorProto.FLOAT, [3])], "unsupported")
rc, log = kiln("run", bad)
check(rc == 4 and "'f1': Frobnicate" in log and "'f2': Zap" in log and "examples/plugins" in log
      and "--plugin" in log,
      "unsupported ops: exit 4 listing every node and the plugin route")

data = open(model, "rb").read()
trunc = os.path.join(WORK, "truncated.onnx")
open(trunc, "wb").write(data[: len(data) // 2])
rc, log = kiln("run", trunc)
check(rc == 3 and "kiln: error:" in log, "truncated model: exit 3 with a clean error")
rc, log = kiln("run", os.path.join(WORK, "does_not_exist.onnx"))
check(rc == 3 and "does not exist" in log, "missing model file: exit 3")
rc, log = kiln("run")
check(rc == 2, "bad command line: exit 2")

# Auto-tuner and timing cache: a cold build times candidates, a warm one only reads the cache; inspect
# shows each layer's candidates and the thread count; a corrupt cache is ignored with a warning.
rng = np.random.default_rng(0)
conv = save_model(
    [helper.make_node("Conv", ["img", "cw"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
     helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
     helper.make_node("Conv", ["r1", "cw2"], ["out"], name="conv2", pads=[1, 1, 1, 1])],
    [helper.make_tensor_value_info("img", TensorProto.FLOAT, ["batch", 16, 16, 16])],
    [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 16, 16, 16])], "convs",
    [numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32), "cw"),
     numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32), "cw2")])
cache = os.path.join(WORK, "tc.json")
engine = os.path.join(WORK, "convs.kiln")
for f in (cache, cache + ".corrupt"):
    if os.path.exists(f):
        os.remove(f)
rc, cold = kiln("build", conv, "-o", engine, "--shapes", "img:2x16x16x16", "--timing-cache", cache, "--threads", "1")
has_tactics = "conv2d_onednn" in cold
check(rc == 0 and re.search(r"tuned \d+ layers for 1 thread", cold) is not None,
      "build prints the tuning summary line")
if has_tactics:
    check(" 0 candidates timed" not in cold and os.path.exists(cache), "cold build times candidates, writes the cache")
    rc, warm = kiln("build", conv, "-o", engine, "--shapes", "img:2x16x16x16", "--timing-cache", cache, "--threads", "1")
    check(rc == 0 and " 0 candidates timed" in warm and " 0 prepared" in warm, "warm build times and prepares nothing")
    rc, text = kiln("inspect", engine)
    check(rc == 0 and "tuned for 1 thread" in text and "candidates: conv2d_onednn" in text and "(won)" in text,
          "inspect shows the thread count and each layer's candidates with the winner")
    open(cache, "w").write('{"format": "kiln-timing-cache", "layers": ')
    rc, log = kiln("build", conv, "-o", engine, "--shapes", "img:2x16x16x16", "--timing-cache", cache, "--threads", "1")
    check(rc == 0 and "kiln: warning: timing cache" in log and "corrupt" in log and os.path.exists(cache + ".corrupt"),
          "a corrupt timing cache is ignored with a warning and moved aside")

# --workspace: a cap on one layer's workspace (tactic scratch); inspect shows each layer's and the total.
if has_tactics:
    rc, text = kiln("inspect", engine)
    check(rc == 0 and re.search(r"workspace \d+ layer\(s\) with one: largest .* limit 1024.00 MiB", text) is not None,
          "inspect shows the layers' workspace: largest, sum, limit")
    # Plain-layout convolutions (no blocked layout pass): oneDNN reorders X and Y through the workspace.
    plain = ("--disable-pass", "layout_blocked", "--tactics", "conv2d_onednn_blocked")
    rc, log = kiln("build", conv, "-o", engine, "--shapes", "img:2x16x16x16", "--threads", "1", *plain, "--workspace", "64B")
    check(rc == 3 and "need more workspace than the limit of 64 bytes (--workspace)" in log and "layer 'conv" in log
          and "Raise --workspace" in log and "exclude the tactic" in log,
          "a --workspace below a layer's need fails the build naming the layer, the bytes and the fix")
    rc, log = kiln("build", conv, "-o", engine, "--shapes", "img:2x16x16x16", "--threads", "1", *plain, "--workspace", "64M")
    check(rc == 0, "--workspace 64M builds")
    rc, text = kiln("inspect", engine)
    check(rc == 0 and re.search(r"conv2d_onednn_\w+ .* ws \d", text) is not None, "inspect shows a layer's workspace")
rc, log = kiln("build", conv, "-o", engine, "--shapes", "img:2x16x16x16", "--workspace", "lots")
check(rc == 3 and "--workspace 'lots': not a size" in log, "a --workspace that is not a size is an error naming it")

finish()
