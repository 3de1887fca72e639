#!/usr/bin/env python3
"""Acceptance tests of `kiln compare`: a planted engine bug found by --find-divergence with fusions on,
reports (text, JSON, self-contained HTML rendered by headless Chromium), input sources, repro bundles
and --replay.

usage: test_compare.py KILN WORKDIR
The planted bug is a test-only graph rewrite (plant_bug below) applied to a copy of the model before
`kiln build`: the engine built from it is compared (--engine) with the reference run of the clean model,
so kiln itself carries no fault injection.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import tempfile

import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

import e2e_util
from e2e_util import WORK, check, finish, make_workdir

make_workdir(clean=True)


def kiln(*args):
    return e2e_util.kiln(*args)


def plant_bug(m, mod):
    """A copy of model m where every Conv whose output channel count is a multiple of mod is wrong: channel 0
    of its output is 0.25 too high (through its BatchNormalization's bias when one follows, so that the
    folded layer's pre-activation is off by exactly 0.25; else through the Conv's own bias)."""
    bad = onnx.ModelProto()
    bad.CopyFrom(m)
    g = bad.graph
    inits = {t.name: t for t in g.initializer}
    for n in g.node:
        if n.op_type != "Conv" or numpy_helper.to_array(inits[n.input[1]]).shape[0] % mod:
            continue
        bn = [c for c in g.node if c.op_type == "BatchNormalization" and c.input[0] == n.output[0]]
        bias = inits[bn[0].input[2]] if bn else inits[n.input[2]]
        b = numpy_helper.to_array(bias).copy()
        b[0] += np.float32(0.25)
        bias.CopyFrom(numpy_helper.from_array(b, bias.name))
    return bad


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
planted_model = os.path.join(WORK, "planted_bug.onnx")
onnx.save(plant_bug(m, 5), planted_model)
planted = os.path.join(WORK, "planted.kiln")
rc, log = kiln("build", planted_model, "-o", planted)
check(rc == 0, "engine of the planted model built")
html = os.path.join(WORK, "report.html")
bundle = os.path.join(WORK, "bundle")
rc, log = kiln("compare", model, "--engine", planted, "--inputs", os.path.join(WORK, "inputs.npz"), "--find-divergence",
               "--json", os.path.join(WORK, "planted.json"), "--html", html, "--save-failure", bundle)
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
check(os.path.exists(os.path.join(bundle, "engine.kiln")), "bundle has the engine under test")
rc, log = kiln("compare", "--replay", bundle, "--json", rjson)
print(log)
rr = json.load(open(rjson)) if os.path.exists(rjson) else {}
check(rc == 1 and rr.get("replay", {}).get("reproduced") is True and "reproduces the bundle's numbers" in log,
      "--replay reproduces the same numbers")
same = rr and all(a["stats"]["abs_err"] == c["stats"]["abs_err"] for a, c in zip(rr["outputs"], rep["outputs"]))
check(same and rr["divergence"]["first"]["name"] == first.get("name"), "replayed max/mean/median abs errors and divergent layer are identical")
# The bug fixed: the bundle's engine rebuilt from the clean model.
rc, log = kiln("build", model, "-o", os.path.join(bundle, "engine.kiln"))
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

# 6. The engine-build flags are kiln build's, registered in one place (src/tools/build_flags.cc): compare and
# bench take --tactics, --timing-cache and --profile too, with the same help.
rjson = os.path.join(WORK, "tactics.json")
rc, log = kiln("compare", model, "--inputs", os.path.join(WORK, "inputs.npz"), "--tactics", "reference",
               "--find-divergence", "--json", rjson)
rr = json.load(open(rjson)) if rc == 0 else {}
kernels = {l["kernel"] for l in rr.get("divergence", {}).get("layers", [])}
check(rc == 0 and kernels == {"reference"}, "compare --tactics reference: every layer on its reference kernel (%s)" % kernels)
cache = os.path.join(WORK, "compare.cache")
rc, log = kiln("compare", model, "--inputs", os.path.join(WORK, "inputs.npz"), "--timing-cache", cache, "--profile",
               "small=image:1x3x12x12/2x3x12x12/4x3x12x12", "--find-divergence", "--json", rjson)
rr = json.load(open(rjson)) if rc == 0 else {}
profs = rr.get("build", {}).get("config", {}).get("profiles", [])
check(rc == 0 and [p.get("name") for p in profs] == ["small"], "compare --profile NAME=...: the engine's profile (%r)" % profs)
check(os.path.exists(cache) and json.load(open(cache)).get("format") == "kiln-timing-cache",
      "compare --timing-cache writes the timing cache")
check(rc == 0 and "reference" not in {l["kernel"] for l in rr["divergence"]["layers"] if l["op_type"].endswith("Conv")},
      "with all tactics allowed the Conv layers run tactics")
rc, log = kiln("compare", model, "--inputs", os.path.join(WORK, "inputs.npz"), "--profile", "image:1x3x12x12/8x3x12x12")
check(rc == 3 and "MIN/OPT/MAX" in log, "a bad --profile is refused as kiln build refuses it (exit 3)")
rc, log = kiln("compare", model, "--engine", planted, "--inputs", os.path.join(WORK, "inputs.npz"), "--tactics",
               "reference")
check("--tactics: build flags, ignored" in log, "build flags given with --engine are warned about")
rc, log = kiln("bench", model, "--shapes", "image:2x3x12x12", "--tactics", "reference", "--iterations", "1",
               "--duration", "0", "--warmup-ms", "0", "--dump-profile", "--json")
bj = json.loads(log[log.index("{"):log.rindex("}") + 1]) if rc == 0 else {}
check(rc == 0 and {p["kernel"] for p in bj.get("profile", [])} == {"reference"}, "bench --tactics reference")


def build_group(cmd):
    """The 'Engine build' option lines of `kiln CMD --help`, the fixed-shape flag left out."""
    rc, text = kiln(cmd, "--help")
    sec = text.split("Engine build:\n", 1)[1].split("\n\n", 1)[0] if "Engine build:\n" in text else ""
    return rc, [l for l in sec.splitlines() if not re.match(r"\s+--(build-)?shapes ", l)]


helps = {c: build_group(c) for c in ("build", "bench", "compare")}
check(all(rc == 0 and len(lines) >= 14 for rc, lines in helps.values()), "build, bench and compare have an Engine build group")
check(helps["build"][1] == helps["bench"][1] == helps["compare"][1], "the same build flags with the same help everywhere")
check(all(any(l.strip().startswith(f) for l in helps["compare"][1])
          for f in ("--tactics", "--timing-cache", "--profile", "--strict-tactics", "--workspace", "--fp16")),
      "compare --help lists --tactics, --timing-cache, --profile, --strict-tactics, --workspace, --fp16")

finish()
