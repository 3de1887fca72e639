#!/usr/bin/env python3
"""Acceptance tests of `kiln compare`: a planted engine bug found by --find-divergence with fusions on,
reports (text, JSON, self-contained HTML rendered by headless Chromium), input sources, repro bundles
and --replay.

usage: test_compare.py KILN WORKDIR
The planted bug uses the test-only KILN_TEST_PLANT_BUG hook of the engine runtime (src/engine/context.cc).
"""
import glob
import json
import os
import shutil
import subprocess
import tempfile

import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

import e2e_util
from e2e_util import WORK, check, finish, make_workdir

make_workdir(clean=True)


def kiln(*args, env=None):
    e = dict(os.environ)
    e.pop("KILN_TEST_PLANT_BUG", None)
    e.update(env or {})
    return e2e_util.kiln(*args, env=e)


# Three Conv -> BatchNorm -> Relu blocks with 8, 10 and 6 output channels, then GlobalAveragePool ->
# Flatten -> Gemm to 7 classes. BatchNorm folds into the Conv (and Relu fuses too when that pass exists),
# so each block is one engine layer whose sources name the ONNX nodes.
rng = np.random.default_rng(0)
nodes, inits = [], []
c_in, x = 3, "image"
for b, c_out in enumerate((8, 10, 6), start=1):
    w = rng.standard_normal((c_out, c_in, 3, 3)).astype(np.float32) * 0.3
    inits += [numpy_helper.from_array(w, f"w{b}"),
              numpy_helper.from_array(rng.uniform(0.5, 1.5, c_out).astype(np.float32), f"g{b}"),
              numpy_helper.from_array(rng.uniform(-0.1, 0.1, c_out).astype(np.float32), f"be{b}"),
              numpy_helper.from_array(rng.uniform(-0.1, 0.1, c_out).astype(np.float32), f"m{b}"),
              numpy_helper.from_array(rng.uniform(0.5, 1.5, c_out).astype(np.float32), f"v{b}")]
    nodes += [helper.make_node("Conv", [x, f"w{b}"], [f"conv{b}_out"], name=f"conv{b}", pads=[1, 1, 1, 1]),
              helper.make_node("BatchNormalization", [f"conv{b}_out", f"g{b}", f"be{b}", f"m{b}", f"v{b}"],
                               [f"bn{b}_out"], name=f"bn{b}"),
              helper.make_node("Relu", [f"bn{b}_out"], [f"relu{b}_out"], name=f"relu{b}")]
    x, c_in = f"relu{b}_out", c_out
inits += [numpy_helper.from_array(rng.standard_normal((7, 6)).astype(np.float32), "fc_w"),
          numpy_helper.from_array(rng.standard_normal(7).astype(np.float32), "fc_b")]
nodes += [helper.make_node("GlobalAveragePool", [x], ["pooled"], name="gap"),
          helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
          helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1)]
g = helper.make_graph(nodes, "planted", [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 12, 12])],
                      [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 7])], initializer=inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="kiln-compare-test")
m.ir_version = 8
model = os.path.join(WORK, "planted.onnx")
onnx.save(m, model)

# 1. Clean engine: everything within tolerance, exit 0, JSON has the statistics.
rep_json = os.path.join(WORK, "clean.json")
rc, log = kiln("compare", model, "--shapes", "image:2x3x12x12", "--seed", "3", "--input-range", "image:0,1",
               "--find-divergence", "--json", rep_json, "--save-inputs", os.path.join(WORK, "inputs.npz"))
check(rc == 0 and "RESULT: PASS" in log, "clean engine vs ONNX reference passes (exit 0)")
rep = json.load(open(rep_json)) if os.path.exists(rep_json) else {}
out0 = rep.get("outputs", [{}])[0]
check(out0.get("stats", {}).get("abs_err", {}).get("max", 1) < 1e-4 and "abs_err_percentiles" in out0.get("stats", {}),
      "JSON report has max abs error and percentiles")
check(out0.get("classifier", {}).get("flipped") == 0 and out0.get("classifier", {}).get("rows") == 2,
      "classifier check: 2 rows, no flipped decision")
ins = np.load(os.path.join(WORK, "inputs.npz"))
check(ins["image"].shape == (2, 3, 12, 12) and ins["image"].min() >= 0 and ins["image"].max() <= 1,
      "--save-inputs writes the generated inputs, --input-range applied")
print(log)

# 2. Planted bug: Conv layers with a channel count divisible by 5 are wrong (only the 10-channel block).
plant = {"KILN_TEST_PLANT_BUG": "conv_channels_mod_5"}
html = os.path.join(WORK, "report.html")
bundle = os.path.join(WORK, "bundle")
rc, log = kiln("compare", model, "--inputs", os.path.join(WORK, "inputs.npz"), "--find-divergence", "--json",
               os.path.join(WORK, "planted.json"), "--html", html, "--save-failure", bundle, env=plant)
print(log)
check(rc == 1 and "RESULT: FAIL" in log, "planted bug: compare fails with exit 1")
rep = json.load(open(os.path.join(WORK, "planted.json")))
first = (rep.get("divergence") or {}).get("first") or {}
check(first.get("name", "").startswith("conv2"), "first divergence is the fused layer conv2 (got %r)" % first.get("name"))
srcs = first.get("sources", [])
check("conv2" in srcs and "bn2" in srcs and first.get("fused"), "its ONNX sources include conv2 and bn2: %r" % srcs)
check(all(i.get("pass") for i in first.get("inputs", [])) and first.get("inputs"),
      "error before the layer (its input relu1_out) is within tolerance")
check(first.get("outputs") and not first["outputs"][0].get("pass") and first["outputs"][0]["max_abs"] > 0.2,
      "error after the layer is > 0.2")
check("introduced by this layer" in first.get("verdict", ""), "verdict: introduced by this layer")
check(first.get("kernel") and first.get("precision") == "fp32", "kernel and precision reported")
earlier = [l for l in rep["divergence"]["layers"] if l["index"] < first.get("index", 0)]
check(earlier and all(l["pass"] for l in earlier), "layers before it all pass")
check(all(l["sources"] != ["bn2"] for l in rep["divergence"]["layers"]), "fusions stayed on (bn2 is no layer of its own)")

# 3. HTML: self-contained; headless Chromium renders it; the histogram is visible.
text = open(html).read()
check("<svg" in text and 'id="histogram-0"' in text and 'id="layer-plot"' in text, "HTML has inline SVG histogram and layer plot")
check("<script" not in text and "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text,
      "HTML loads nothing external")
chromium = shutil.which("chromium") or shutil.which("chromium-browser")
if chromium:
    shot = os.path.join(WORK, "report.png")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
    with tempfile.TemporaryDirectory() as prof:
        r = subprocess.run([chromium, *flags, "--user-data-dir=" + prof, "--screenshot=" + shot,
                            "--window-size=1200,900", "file://" + os.path.abspath(html)],
                           capture_output=True, text=True, timeout=120)
    check(os.path.exists(shot) and os.path.getsize(shot) > 20000, "Chromium screenshot written (%d bytes)" %
          (os.path.getsize(shot) if os.path.exists(shot) else 0))
    with tempfile.TemporaryDirectory() as prof:
        r = subprocess.run([chromium, *flags, "--user-data-dir=" + prof, "--dump-dom", "file://" + os.path.abspath(html)],
                           capture_output=True, text=True, timeout=120)
    dom = r.stdout
    check(r.returncode == 0 and 'id="histogram-0"' in dom and "first-divergence" in dom and "kiln compare" in dom,
          "Chromium --dump-dom shows the report with its histogram")
    check("error" not in dom.lower().replace("abs err", "").replace("rel err", "").replace("max abs err", "")
          or "kiln-report-error" not in dom, "no error marker in the DOM")
else:
    check(False, "chromium is installed (scripts/setup.sh)")

# 4. Repro bundle and replay.
for f in ("inputs.npz", "ref_outputs.npz", "test_outputs.npz", "bundle.json", "command.txt", "model.onnx"):
    check(os.path.exists(os.path.join(bundle, f)), "bundle has " + f)
b = json.load(open(os.path.join(bundle, "bundle.json")))
v = b["report"]["versions"]
check(all(v.get(k) for k in ("kiln", "compiler", "cpu_model", "model_opsets", "model_producer")),
      "bundle records versions: kiln, compiler, CPU, model opset and producer")
check("compare" in b["command"] and "--save-failure" in b["command"], "bundle records the exact command")
check(b["report"]["build"]["config"]["precision"] == "fp32" and "profiles" in b["report"]["build"]["config"],
      "bundle records the build options and profiles")
rjson = os.path.join(WORK, "replay.json")
rc, log = kiln("compare", "--replay", bundle, "--json", rjson, env=plant)
print(log)
rr = json.load(open(rjson)) if os.path.exists(rjson) else {}
check(rc == 1 and rr.get("replay", {}).get("reproduced") is True and "reproduces the bundle's numbers" in log,
      "--replay reproduces the same numbers")
same = rr and all(a["stats"]["abs_err"] == c["stats"]["abs_err"] for a, c in zip(rr["outputs"], rep["outputs"]))
check(same and rr["divergence"]["first"]["name"] == first.get("name"), "replayed max/mean/median abs errors and divergent layer are identical")
rc, log = kiln("compare", "--replay", bundle)
check(rc == 1 and "numbers DIFFER" in log, "replay without the planted bug notices the numbers differ")

# 5. Input sources: directory of .npy, ONNX .pb, framework npz as the reference, tolerances, thresholds.
d = os.path.join(WORK, "npy_dir")
os.makedirs(d, exist_ok=True)
np.save(os.path.join(d, "image.npy"), ins["image"])
rc, log = kiln("compare", model, "--inputs", d, "--save-inputs", os.path.join(WORK, "again.npz"))
check(rc == 0 and np.array_equal(np.load(os.path.join(WORK, "again.npz"))["image"], ins["image"]), "--inputs DIR of .npy")
d2 = os.path.join(WORK, "pb_dir")
os.makedirs(d2, exist_ok=True)
with open(os.path.join(d2, "input_0.pb"), "wb") as f:
    f.write(numpy_helper.from_array(ins["image"], "image").SerializeToString())
rc, log = kiln("compare", model, "--inputs", d2)
check(rc == 0, "--inputs DIR of ONNX input_0.pb")
ref = np.load(os.path.join(bundle, "ref_outputs.npz"))["logits"]
np.savez(os.path.join(WORK, "fw.npz"), logits=ref + 0.01)
rc, log = kiln("compare", model, "--inputs", os.path.join(WORK, "inputs.npz"), "--ref", os.path.join(WORK, "fw.npz"),
               "--test", "onnx", "--threshold", "logits:0.0")
check(rc == 1 and "boundary:  framework -> onnx-reference" in log, "--ref FILE.npz vs onnx fails at the framework boundary")
rc, log = kiln("compare", model, "--inputs", os.path.join(WORK, "inputs.npz"), "--ref", os.path.join(WORK, "fw.npz"),
               "--test", "onnx", "--atol", "logits:0.02")
check(rc == 0, "per-output --atol NAME:VALUE loosens one output")
rc, log = kiln("compare", model, "--inputs", os.path.join(WORK, "inputs.npz"), "--ref", os.path.join(WORK, "fw.npz"),
               "--test", "onnx", "--check-error-stat", "median", "--rtol", "0.5")
check(rc == 0, "--check-error-stat median with rtol 0.5 passes")
rc, log = kiln("compare", model, "--check-error-stat", "bogus")
check(rc == 2, "bad --check-error-stat is a usage error (exit 2)")
rc, log = kiln("compare", model, "--inputs", os.path.join(WORK, "nope.npz"))
check(rc == 3, "missing inputs file exits 3")

finish()
