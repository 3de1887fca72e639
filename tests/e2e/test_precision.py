#!/usr/bin/env python3
"""End-to-end tests of kiln build's precision flags: --fp16's refusal, --bf16 with --layer-precisions
under --precision-constraints obey / prefer, what kiln inspect shows, and bad values.

usage: test_precision.py KILN WORKDIR
"""
import json
import os

import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

from e2e_util import WORK, check, finish, kiln, run_kiln, make_workdir

make_workdir()

rng = np.random.default_rng(3)
w1 = rng.uniform(-1, 1, (256, 192)).astype(np.float32)
w2 = rng.uniform(-1, 1, (192, 40)).astype(np.float32)
g = helper.make_graph(
    [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
     helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")], "mlp",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 256])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 40])],
    initializer=[numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="kiln-e2e")
m.ir_version = 8
model = os.path.join(WORK, "mlp.onnx")
onnx.save(m, model)
engine = os.path.join(WORK, "mlp.kiln")
bf16_cpu = "avx512_bf16" in open("/proc/cpuinfo").read()

rc, out = kiln("build", "--help")
for flag in ("--bf16", "--fp16", "--best", "--layer-precisions", "--precision-constraints", "--strongly-typed"):
    check(flag in out, f"build --help lists {flag}")
check("FP16 arithmetic" in out, "build --help says what --fp16 does on the CPU")

rc, out = kiln("build", model, "-o", engine, "--fp16")
check(rc == 4, f"--fp16 exits 4 (unsupported), got {rc}")
check("no kernel computing in fp16 on cpu" in out and "--bf16" in out, "--fp16 says why and what to use: " + out[-300:])

rc, out = kiln("build", model, "-o", engine, "--layer-precisions", "fc2:fp16", "--precision-constraints", "obey")
check(rc == 4 and "layer 'fc2'" in out and "cannot be met" in out, "obey fails naming the layer: " + out[-300:])
rc, out = kiln("build", model, "-o", engine, "--layer-precisions", "fc2:fp16")
check(rc == 0 and "warning" in out and "layer 'fc2'" in out, "prefer (the default) warns naming the layer and builds")

rc, out = kiln("build", model, "-o", engine, "--layer-precisions", "fc2:fp64")
check(rc != 0 and "fp32, bf16, fp16, int8" in out, "a bad layer precision is an error listing the valid ones")
rc, out = kiln("build", model, "-o", engine, "--precision-constraints", "always")
check(rc != 0 and "obey, prefer, none" in out, "a bad --precision-constraints is an error listing the valid ones")
rc, out = kiln("build", model, "-o", engine, "--strongly-typed", "--bf16")
check(rc != 0 and "--strongly-typed" in out, "--strongly-typed with --bf16 is refused")

if bf16_cpu:
    rc, out = kiln("build", model, "-o", engine, "--bf16", "--layer-precisions", "fc1:fp32,fc2:bf16",
                   "--precision-constraints", "obey")
    check(rc == 0, "--bf16 with layer precisions under obey builds: " + out[-300:])
    rc, out, err = run_kiln("inspect", engine, "--format", "json")
    layers = {s: l for l in json.loads(out)["layers"] for s in l["sources"]} if rc == 0 else {}
    check(layers.get("fc1", {}).get("precision") == "fp32", "fc1 (forced fp32) computes in fp32")
    check(layers.get("fc2", {}).get("precision") == "bf16" and layers["fc2"]["kernel"] == "matmul_onednn_bf16_packed",
          "fc2 (forced bf16) runs the BF16 tactic")
    rc, out = kiln("inspect", engine)
    check("precision layers:" in out and "bf16 x1" in out, "inspect counts the layers per precision")
    x = rng.uniform(-1, 1, (8, 256)).astype(np.float32)
    np.save(os.path.join(WORK, "x.npy"), x)
    want = np.maximum(x @ w1, 0) @ w2
    rc, out = kiln("run", engine, "--input", "x=" + os.path.join(WORK, "x.npy"), "--output-dir", os.path.join(WORK, "o"))
    y = np.load(os.path.join(WORK, "o", "y.npy")) if rc == 0 else None
    # fc2 rounds its operands to bf16 (2^-8 each) over K = 192: well inside 2% of the output's scale.
    check(y is not None and np.abs(y - want).max() < 0.02 * np.abs(want).max(), "the BF16 engine computes the MLP")
    # kiln compare takes a BF16 engine's tolerances by default (stated), and explicit flags win.
    rep = os.path.join(WORK, "cmp.json")
    rc, out = kiln("compare", model, "--engine", engine, "--random-inputs", "--seed", "1", "--json", rep)
    d = json.load(open(rep)) if os.path.exists(rep) else {}
    check("tolerances for a bf16 engine: atol 0.08 rtol 0.08" in out, "compare states a bf16 engine's tolerances")
    check(d.get("default_tolerances", {}).get("format") == "bf16" and
          d["outputs"][0]["stats"]["atol"] == 0.08 and d["outputs"][0]["stats"]["rtol"] == 0.08,
          "the bf16 engine's output is checked at atol/rtol 0.08")
    os.remove(rep)
    rc, out = kiln("compare", model, "--engine", engine, "--random-inputs", "--seed", "1", "--atol", "1e-7", "--json",
                   rep)
    d = json.load(open(rep)) if os.path.exists(rep) else {}
    s = d["outputs"][0]["stats"] if d else {}
    check(s.get("atol") == 1e-7 and s.get("rtol") == 0.08, "--atol overrides the default, rtol keeps it: " + str({k: s.get(k) for k in ("atol", "rtol")}))
else:
    rc, out = kiln("build", model, "-o", engine, "--bf16")
    check(rc == 0 and "avx512_bf16" in out, "--bf16 without AVX-512 BF16 warns and builds FP32")
finish()
