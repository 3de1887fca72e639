#!/usr/bin/env python3
"""The CPU model suite (bench/suite/models.py) on one NVIDIA GPU (issue 13: "every model of the CPU suite
builds for the GPU and matches the reference interpreter within the precision's tolerance").

usage: suite.py --kiln BIN/kiln --out DIR [--models a,b,...] [--precision fp32|fp16] [--jobs 8]
                [--budget SECONDS] [--cpu-threads 4]

For each model, at batch 1, in one run on this machine:
  export    bench/suite/export.py (random weights, BatchNorm statistics estimated on random inputs) with
            torch.onnx.export's TorchScript path (dynamo=False: the suite's files were made with it), several
            models at once (--jobs), into DIR/models;
  build     kiln build --device cuda [--fp16]: the layers it reports on the host are counted;
  GPU ms    kiln bench --no-data-transfers --use-cuda-graph (median; device compute, inputs staged once);
            without the graph when a layer prevents capture (the reason is kept);
  compare   kiln compare MODEL --engine ENGINE (the reference interpreter on the same random inputs; kiln's
            default tolerances for the engine's precision);
  CPU ms    a CPU engine of the same model on this host's CPU (--cpu-threads), for the table's CPU column.
The GPU rows run one after another (no other GPU work while one is timed); the compares and CPU engines run
in the background meanwhile, so the CPU column is only indicative. Prints the table and writes DIR/suite_gpu.json.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE = os.path.join(HERE, "..", "suite")
sys.path.insert(0, SUITE)
import models as suite_models  # noqa: E402

# export.py under torch >= 2 with the TorchScript exporter, as the suite's files were made.
SHIM = """
import runpy, sys, torch
_e = torch.onnx.export
def export(*a, **k):
    k.setdefault("dynamo", False)
    return _e(*a, **k)
torch.onnx.export = export
sys.argv = [sys.argv[1]] + sys.argv[2:]
sys.path.insert(0, __import__("os").path.dirname(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run(cmd, timeout, env=None):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        return p.returncode, p.stdout + p.stderr, time.time() - t0
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out + f"\n(timed out after {timeout} s)", time.time() - t0


def last_line(text):
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def shapes_flag(spec):
    return ",".join(f"{i.name}:{'x'.join(map(str, i.dims(1)))}" for i in spec.inputs)


def export(spec, models_dir):
    path = os.path.join(models_dir, spec.name + ".onnx")
    if os.path.exists(path) and os.path.getsize(path) > 0:
        return spec.name, path, ""
    env = dict(os.environ, OMP_NUM_THREADS="2")
    rc, out, _ = run([sys.executable, "-c", SHIM, os.path.join(SUITE, "export.py"), spec.name, models_dir], 600, env)
    if rc != 0 or not os.path.exists(path):
        return spec.name, None, "export failed: " + last_line(out)
    return spec.name, path, ""


def bench_json(kiln, engine, extra):
    rc, out, _ = run([kiln, "bench", engine, "--json", "--duration", "1", "--iterations", "20"] + extra, 120)
    if rc != 0 or "{" not in out:
        return None, last_line(out)
    return json.loads(out[out.index("{"):out.rindex("}") + 1]), ""


def gpu_row(a, spec, path):
    row = {"model": spec.name, "family": spec.family, "shapes": shapes_flag(spec), "precision": a.precision}
    engine = os.path.join(a.out, "engines", spec.name + ".cuda.kiln")
    cmd = [a.kiln, "build", path, "--device", "cuda", "--shapes", row["shapes"], "-o", engine]
    if a.precision == "fp16":
        cmd.append("--fp16")
    rc, out, secs = run(cmd, a.build_timeout)
    row["build_s"] = round(secs, 1)
    with open(os.path.join(a.out, "logs", spec.name + ".build.txt"), "w") as f:
        f.write(out)
    if rc != 0:
        row["error"] = "build: " + last_line(out)
        return row, None
    m = re.findall(r"(\d+) layers run reference kernels", out)
    row["host_layers"] = int(m[-1]) if m else None
    j, err = bench_json(a.kiln, engine, ["--no-data-transfers", "--use-cuda-graph"])
    if j is None:
        row["error"] = "bench: " + err
        return row, engine
    row["gpu_ms"] = j["latency_ms"]["median"]
    g = j.get("cuda_graph", {})
    row["cuda_graph"] = bool(g.get("enabled")) and not g.get("blocker")
    if g.get("blocker"):
        row["graph_blocker"] = g["blocker"][:200]
    return row, engine


def background(a, spec, path, engine, row):
    if engine:
        report = os.path.join(a.out, "logs", spec.name + ".compare.json")
        rc, out, secs = run([a.kiln, "compare", path, "--engine", engine, "--shapes", row["shapes"], "--threads", "4",
                             "--json", report], a.compare_timeout)
        with open(os.path.join(a.out, "logs", spec.name + ".compare.txt"), "w") as f:
            f.write(out)
        row["compare"] = "PASS" if rc == 0 else ("TIMEOUT" if rc == 124 else "FAIL")
        if rc not in (0, 1):
            row["compare_error"] = last_line(out)
        try:
            outs = json.load(open(report)).get("outputs", [])
            errs = [o["stats"]["abs_err"]["max"] for o in outs if o.get("stats", {}).get("abs_err")]
            if errs:
                row["max_abs_err"] = max(errs)
        except (OSError, ValueError, KeyError):
            pass
    cpu = os.path.join(a.out, "engines", spec.name + ".cpu.kiln")
    th = str(a.cpu_threads)
    rc, out, _ = run([a.kiln, "build", path, "--shapes", row["shapes"], "--threads", th, "-o", cpu], a.cpu_timeout)
    if rc == 0:
        j, err = bench_json(a.kiln, cpu, ["--threads", th])
        if j:
            row["cpu_ms"] = j["latency_ms"]["median"]
        else:
            row["cpu_error"] = err
    else:
        row["cpu_error"] = "build: " + last_line(out)


def fmt(v, f="{:.3f}"):
    return "-" if v is None else f.format(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "fp16"])
    ap.add_argument("--jobs", type=int, default=8, help="exports at once")
    ap.add_argument("--cpu-threads", type=int, default=4)
    ap.add_argument("--compare-timeout", type=int, default=120)
    ap.add_argument("--build-timeout", type=int, default=600, help="seconds for the GPU engine's build")
    ap.add_argument("--cpu-timeout", type=int, default=300, help="seconds for the CPU engine's build")
    ap.add_argument("--budget", type=int, default=0, help="seconds; models not started by then are skipped")
    a = ap.parse_args()
    t0 = time.time()
    specs = [s for s in suite_models.SPECS if not s.smoke]
    if a.models:
        want = a.models.split(",")
        specs = [s for s in specs if s.name in want or s.family in want]
    for d in ("models", "engines", "logs"):
        os.makedirs(os.path.join(a.out, d), exist_ok=True)
    rows = []
    with ThreadPoolExecutor(a.jobs) as exporter, ThreadPoolExecutor(4) as bg:
        exports = {s.name: exporter.submit(export, s, os.path.join(a.out, "models")) for s in specs}
        pending = []
        for spec in specs:
            _, path, err = exports[spec.name].result()
            if a.budget and time.time() - t0 > a.budget:
                rows.append({"model": spec.name, "family": spec.family, "error": "skipped: out of time"})
                continue
            if not path:
                rows.append({"model": spec.name, "family": spec.family, "error": err})
                continue
            row, engine = gpu_row(a, spec, path)
            print(f"[gpu suite] {spec.name}: {fmt(row.get('gpu_ms'))} ms {row.get('error', '')}", flush=True)
            rows.append(row)
            pending.append(bg.submit(background, a, spec, path, engine, row))
        for p in pending:
            p.result()
    meta = {"precision": a.precision, "seconds": round(time.time() - t0), "cpu_threads": a.cpu_threads}
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip()
        meta["gpu"] = gpu
    except OSError:
        pass
    with open(os.path.join(a.out, "suite_gpu.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"\nGPU suite ({meta.get('gpu', '?')}), {a.precision}, batch 1; GPU ms: kiln bench --no-data-transfers "
          f"--use-cuda-graph median; CPU ms: a CPU engine on this host, {a.cpu_threads} threads, run beside others")
    print("model | host layers | GPU ms | CUDA graph | CPU ms | compare vs reference | max abs err | note")
    ok = 0
    for r in rows:
        note = r.get("error") or r.get("compare_error") or r.get("graph_blocker") or r.get("cpu_error") or ""
        ok += r.get("compare") == "PASS"
        print(f"{r['model']} | {r.get('host_layers', '-')} | {fmt(r.get('gpu_ms'))} | "
              f"{'yes' if r.get('cuda_graph') else ('-' if 'gpu_ms' not in r else 'no')} | {fmt(r.get('cpu_ms'))} | "
              f"{r.get('compare', '-')} | {fmt(r.get('max_abs_err'), '{:.2e}')} | {note[:120]}")
    print(f"\n{ok} of {len(rows)} models pass the comparison; {meta['seconds']} s")


if __name__ == "__main__":
    main()
