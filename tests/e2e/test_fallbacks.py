#!/usr/bin/env python3
"""End-to-end test of reference-kernel reporting (issue 11): `kiln build` warns per layer left on its
reference kernel with the reason and counts them, `kiln inspect` lists them with their share of the
estimated time, `--strict-tactics` fails with exit code 4 naming them, `kiln bench --dump-profile`
marks them and reports the first run apart. The model's CumSum has no tactic (whatever tactics are
added elsewhere, CumSum stays without one until a test here changes), its Reshape is shape work.

usage: test_fallbacks.py KILN WORKDIR
"""
import json
import os

import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

from e2e_util import WORK, check, finish, make_workdir
from e2e_util import run_kiln as kiln

make_workdir()

rng = np.random.default_rng(0)
w = rng.standard_normal((32, 64)).astype(np.float32)
nodes = [
    helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul"),
    helper.make_node("CumSum", ["h", "axis"], ["u"], name="upsample"),
    helper.make_node("Reshape", ["u", "shape"], ["y"], name="reshape"),
]
inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(1, np.int64), "axis"),
         numpy_helper.from_array(np.array([8, 32], np.int64), "shape")]
g = helper.make_graph(nodes, "fallbacks", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])], inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="kiln-e2e")
m.ir_version = 8
model = os.path.join(WORK, "fallbacks.onnx")
onnx.save(m, model)
engine = os.path.join(WORK, "fallbacks.kiln")

WARNING = "kiln: warning: layer 'upsample' (CumSum, opset 13) runs its reference kernel: no tactic implements CumSum"

# --- kiln build: a warning per reference layer on stderr, the count in the summary lines.
rc, out, err = kiln("build", model, "-o", engine, "--threads", "1")
check(rc == 0, f"build exits 0 ({err.strip()[:300]})")
check(WARNING in err, "build warns about the CumSum layer with its op, opset and reason on stderr")
check("reshape" not in err, "the Reshape (shape work) is not warned about")
check("[kiln build] 1 layer runs reference kernels (" in out and "% of the estimated time" in out,
      "the build's summary counts 1 reference layer with its share of the estimated time")
check("1 shape-work layer not counted" in out, "shape-work layers are counted apart")
check(out.rstrip().splitlines()[-1].endswith("; 1 layer runs reference kernels"),
      "the last summary line ends with the count")
rc, out, err = kiln("build", model, "-o", os.path.join(WORK, "ref_only.kiln"), "--tactics", "reference", "--threads", "1")
check(rc == 0 and "upsample" not in err and "reference kernels were requested" in err,
      "--tactics reference warns once, not per layer")

# --- kiln inspect: the reference layers with their share and reasons.
rc, out, err = kiln("inspect", engine)
check(rc == 0, f"inspect exits 0 ({err.strip()[:200]})")
lines = [l for l in out.splitlines() if "upsample" in l and "CumSum (opset 13)" in l]
check(out.count("reference 1 layer runs reference kernels, ") == 1, "inspect heads the list with the count")
check(len(lines) == 1 and "%" in lines[0] and "no tactic implements CumSum" in lines[0],
      "inspect lists the CumSum layer with its share and reason")
check("shape work (not counted" in out and "reshape" in out, "inspect names the shape-work layer apart")
rc, out, err = kiln("inspect", engine, "--format", "json")
j = json.loads(out) if rc == 0 else {}
refs = j.get("reference_layers", [])
finding = [r for r in refs if not r["shape_work"]]
check(len(finding) == 1 and finding[0]["layer"] == "upsample" and finding[0]["reasons"] == ["no tactic implements CumSum"],
      "inspect --format json lists the finding with its reasons")
check(bool(finding) and 0 < finding[0].get("share", 0) <= 1, "the finding has a share of the estimated time")
check(j.get("build", {}).get("reference", {}).get("layers") == 1, "build.reference.layers counts it")

# --- --strict-tactics: exit code 4 (unsupported), every such layer named, no engine written.
strict_engine = os.path.join(WORK, "strict.kiln")
rc, out, err = kiln("build", model, "-o", strict_engine, "--strict-tactics", "--threads", "1")
check(rc == 4, f"--strict-tactics exits 4 (got {rc})")
check("--strict-tactics: 1 layer would run reference kernels" in err and
      "layer 'upsample' (CumSum, opset 13): no tactic implements CumSum" in err,
      "--strict-tactics names the layer, op and reason")
check(not os.path.exists(strict_engine), "--strict-tactics writes no engine")

# --- kiln bench: the reference layer marked in the profile; the first run reported apart.
rc, out, err = kiln("bench", engine, "--dump-profile", "--warmup", "1", "--warmup-ms", "0", "--iterations", "3",
                    "--duration", "0", "--threads", "1")
check(rc == 0, f"bench --dump-profile exits 0 ({err.strip()[:200]})")
rows = [l for l in out.splitlines() if l.startswith("upsample")]
check(len(rows) == 1 and "reference *" in rows[0], "the profile marks the reference layer")
check("Reference kernels (marked *, shape work not counted): 1 layers" in out, "the profile sums reference layers")
check("[kiln bench] First run: " in out, "bench reports the first run")
rc, out, err = kiln("bench", engine, "--json", "--dump-profile", "--warmup", "1", "--warmup-ms", "0",
                    "--iterations", "3", "--duration", "0", "--threads", "1")
b = json.loads(out) if rc == 0 else {}
check(b.get("first_run_ms", 0) > 0 and b.get("first_run_vs_median", 0) > 0, "bench --json has the first run")
check(b.get("reference_layers") == 1 and 0 < b.get("reference_percent", 0) <= 100,
      "bench --json counts the reference layer and its share")
prof = {p["layer"]: p for p in b.get("profile", [])}
check(prof.get("upsample", {}).get("reference") is True and prof.get("reshape", {}).get("reference") is False,
      "the JSON profile marks the finding, not the shape work")

finish()
