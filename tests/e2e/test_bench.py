#!/usr/bin/env python3
"""End-to-end test of `kiln bench`: JSON fields, statistics, per-iteration times, the per-layer profile
table and the Chrome trace (one track per stream). Tiny model, few iterations: runs in about a second.

usage: test_bench.py KILN WORKDIR
"""
import json
import os

import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

from e2e_util import WORK, check, finish, make_workdir
from e2e_util import run_kiln as kiln

make_workdir()


# y = relu(x @ w) * x + x with a dynamic batch dim.
w = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
g = helper.make_graph(
    [helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul"),
     helper.make_node("Sigmoid", ["h"], ["r"], name="sigmoid"),
     helper.make_node("Mul", ["r", "x"], ["m"], name="mul"),
     helper.make_node("Add", ["m", "x"], ["y"], name="add")],
    "bench_tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32])], [numpy_helper.from_array(w, "w")])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="kiln-e2e")
m.ir_version = 8
model = os.path.join(WORK, "bench_tiny.onnx")
onnx.save(m, model)

# --- JSON output, .onnx built in memory, --batch, --export-times, two streams.
times_file = os.path.join(WORK, "times.json")
trace_file = os.path.join(WORK, "trace.json")
rc, out, err = kiln("bench", model, "--batch", "4", "--warmup", "2", "--warmup-ms", "0", "--iterations", "7",
                    "--duration", "0", "--streams", "2", "--json", "--export-times", times_file,
                    "--export-profile", trace_file)
check(rc == 0, f"bench --json exits 0 ({err.strip()[:200]})")
try:
    j = json.loads(out)
except json.JSONDecodeError:
    j = {}
check(bool(j), "stdout is one JSON document")
for key in ("model", "built_from_onnx", "inputs", "batch", "streams", "threads", "warmup_runs", "iterations",
            "wall_s", "latency_ms", "throughput_qps", "throughput_ips"):
    check(key in j, f"JSON has '{key}'")
lat = j.get("latency_ms", {})
for key in ("median", "mean", "min", "max", "p90", "p95", "p99"):
    check(isinstance(lat.get(key), (int, float)) and lat.get(key) > 0, f"latency_ms.{key} is a positive number")
if lat:
    check(lat["min"] <= lat["median"] <= lat["max"] and lat["min"] <= lat["mean"] <= lat["max"],
          "min <= median, mean <= max")
    check(lat["median"] <= lat["p90"] <= lat["p95"] <= lat["p99"] <= lat["max"], "percentiles are ordered")
check(j.get("built_from_onnx") is True, "an .onnx model is built in memory")
check(j.get("inputs", {}).get("x") == [4, 32], "--batch 4 sets the dynamic first dim")
check(j.get("batch") == 4 and j.get("streams") == 2, "batch and streams are reported")
check(j.get("iterations") == 14, "iterations counts both streams (2 x 7), warm-up excluded")
check(j.get("warmup_runs") == 4, "warm-up runs are counted separately (2 per stream)")
if j.get("throughput_qps"):
    check(abs(j["throughput_ips"] - 4 * j["throughput_qps"]) < 1e-6 * j["throughput_ips"],
          "inferences/s = queries/s x batch")
    sq = j.get("stream_qps", [])
    check(len(sq) == 2 and abs(sum(sq) - j["throughput_qps"]) < 1e-6 * j["throughput_qps"],
          "stream_qps gives each stream's share of the aggregate throughput")
check("profile" in j, "--export-profile also fills the JSON profile")

times = json.load(open(times_file)) if os.path.exists(times_file) else []
check(len(times) == 14, "--export-times has every measured iteration")
check(all({"stream", "start_ms", "latency_ms"} <= set(t) for t in times), "each time has stream/start_ms/latency_ms")
check(sorted({t["stream"] for t in times}) == [0, 1], "times come from both streams")

trace = json.load(open(trace_file)) if os.path.exists(trace_file) else {}
ev = trace.get("traceEvents", [])
check(len(ev) > 0, "Chrome trace has traceEvents")
xs = [e for e in ev if e.get("ph") == "X"]
check(all(isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0
          and "name" in e and "pid" in e and "tid" in e for e in xs), "complete events have name/ts/dur/pid/tid")
check({e["tid"] for e in xs} == {0, 1}, "one track per stream")
meta = [e for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"]
check(len(meta) == 2, "each stream's track is named")
layer_ev = [e for e in xs if e.get("cat") == "layer"]
iter_ev = [e for e in xs if e.get("cat") == "iteration"]
check(len(iter_ev) == 14, "one iteration event per measured iteration")
n_layers = len(j.get("profile", []))
check(n_layers > 0 and len(layer_ev) == 14 * n_layers, "one layer event per layer per measured iteration")
check(all("op" in e.get("args", {}) and "kernel" in e.get("args", {}) for e in layer_ev), "layer events name op and kernel")
# Layers of an iteration lie inside it (same track), in order.
it0 = next((e for e in iter_ev if e["tid"] == 0), None)
if it0:
    end0 = it0["ts"] + it0["dur"]
    inside = [e for e in layer_ev if e["tid"] == 0 and it0["ts"] - 0.01 <= e["ts"] and e["ts"] + e["dur"] <= end0 + 0.01]
    check(len(inside) == n_layers, "an iteration's layer events lie within it")
total_pct = sum(p["percent"] for p in j.get("profile", []))
check(abs(total_pct - 100) < 0.01, "profile percentages add up to 100")

# --- text output with --dump-profile: the table names each layer, its op and its kernel.
rc, out, err = kiln("bench", model, "--shapes", "x:2x32", "--iterations", "5", "--duration", "0", "--warmup-ms", "0",
                    "--dump-profile")
check(rc == 0, "bench --dump-profile exits 0")
check("Latency: min = " in out and "median = " in out and "percentile(99%)" in out, "text output has the latency line")
check("Throughput:" in out, "text output has throughput")
check("Layer" in out and "Op" in out and "Kernel" in out and "Mean (ms)" in out and "% total" in out,
      "profile table has its header")
rows = [l for l in out.splitlines() if l.split() and l.split()[-1].endswith("%") and not l.startswith("Total")]
check(len(rows) >= 1 and all(len(r.split()) >= 5 for r in rows[1:]), "profile table has one row per layer")
check(any(l.startswith("Total (all layers)") for l in out.splitlines()), "profile table has a total row")

# --- an engine file, and --duration: keeps measuring past --iterations until the time is up.
engine = os.path.join(WORK, "bench_tiny.kiln")
rc, _, err = kiln("build", model, "-o", engine, "--shapes", "x:1x32")
check(rc == 0, "build the engine")
rc, out, err = kiln("bench", engine, "--iterations", "1", "--duration", "0.2", "--warmup-ms", "0", "--json")
j = json.loads(out) if rc == 0 else {}
check(rc == 0 and j.get("built_from_onnx") is False, "bench runs a .kiln engine")
check(j.get("wall_s", 0) >= 0.2 and j.get("iterations", 0) > 1, "--duration keeps measuring past --iterations")

# --- errors: bad values exit with a usage/invalid-argument code and say why.
rc, out, err = kiln("bench", model, "--streams", "0")
check(rc != 0 and "--streams" in err, "--streams 0 is rejected with a message")
rc, out, err = kiln("bench", engine, "--batch", "3", "--iterations", "1", "--duration", "0")
check(rc != 0, "--batch on an engine whose batch dim is fixed fails cleanly")

finish()
