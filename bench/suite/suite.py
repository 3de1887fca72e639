#!/usr/bin/env python3
"""The broad model suite: kiln vs ONNX Runtime on ~40 exported models, one table (bench/README.md).

Called by `bench/run.sh --suite` (which installs ONNX Runtime). Per model: export (cached, own process:
bench/suite/export.py), then per batch: `kiln build --shapes ... --threads T`, `kiln bench --json
--export-profile` (a short run: which kernel each layer ran, its median share), then the latency of
both runtimes in interleaved rounds (`kiln bench --export-times`, bench/ort_runner.js with all graph
optimizations; measure_latency). A failure at any step is that row's error, never the suite's. Every row is also saved to OUT/rows/NAME_bB.json, so that partial runs accumulate:
--findings writes the Markdown findings from every saved row (this run's and earlier ones).
"""
import argparse
import glob
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(1, BENCH)
import models as suite_models  # noqa: E402
from bench import cpu_model, fmt  # noqa: E402  (bench/bench.py)
from findings import write_findings  # noqa: E402

PY = "/usr/bin/python3"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def short_error(text, limit=300):
    """The most telling line of a tool's stderr: kiln's 'error:' line, a Python exception, or the tail."""
    lines = [l.strip() for l in (text or "").strip().splitlines() if l.strip()]
    for pat in ("error", "Error", "Exception"):
        hits = [l for l in lines if pat in l and "Warning" not in l]
        if hits:
            return hits[-1][:limit]
    return (lines[-1] if lines else "no output")[:limit]


def run_tool(cmd, env=None, timeout=900):
    """(returncode, stdout, stderr, seconds); a timeout is returncode 124 with a message."""
    t0 = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        return r.returncode, r.stdout, r.stderr, time.time() - t0
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout} s: {' '.join(cmd)}", time.time() - t0
    except OSError as e:
        return 127, "", f"error: {e}", time.time() - t0


def parse_json(text):
    text = text.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(text.splitlines()[-1])


def shapes_flag(spec, batch):
    return ",".join(f"{i.name}:{'x'.join(map(str, i.dims(batch)))}" for i in spec.inputs)


def export(spec, models_dir, env, timeout):
    path = os.path.join(models_dir, spec.name + ".onnx")
    if os.path.exists(path) and os.path.getsize(path) > 0:
        return path, None, 0.0
    log(f"  exporting {spec.name}")
    rc, out, err, s = run_tool([PY, os.path.join(HERE, "export.py"), spec.name, models_dir], env=env, timeout=timeout)
    if rc != 0 or not os.path.exists(path):
        return None, f"export: {short_error(err)}", s
    return path, None, s


def median_profile(trace_path):
    """Per-layer median over the profiled iterations, from kiln bench's Chrome trace (--export-profile):
    on a busy machine one preempted iteration would otherwise inflate a small layer's mean by 10x.
    The same list as the --json profile: layer, op, kernel, ms. None when the trace cannot be read."""
    try:
        with open(trace_path) as f:
            events = json.load(f)["traceEvents"]
        os.remove(trace_path)
    except (OSError, ValueError, KeyError):
        return None
    iterations = sum(1 for e in events if e.get("cat") == "iteration")
    durs, order = {}, []
    for e in events:
        if e.get("cat") != "layer":
            continue
        key = (e["name"], e["args"]["op"], e["args"]["kernel"], bool(e["args"].get("shape_work", False)))
        if key not in durs:
            durs[key] = []
            order.append(key)
        durs[key].append(e["dur"] / 1000.0)
    if not iterations or not order:
        return None
    # A name seen k times per iteration (unnamed layers are named by their op): k x the median.
    return [{"layer": k[0], "op": k[1], "kernel": k[2], "shape_work": k[3],
             "ms": statistics.median(durs[k]) * len(durs[k]) / iterations} for k in order]


def profile_summary(profile, interpreter):
    """Reference-kernel share of kiln's per-layer time, by op and by layer, and every kernel's share."""
    for p in profile:  # kiln bench --json: mean_ms
        p.setdefault("ms", p.get("mean_ms", 0.0))
    total = sum(p["ms"] for p in profile) or 1e-12
    ref_ops, shape_ops, kernels, layers, every = {}, {}, {}, [], []
    for p in profile:
        share = 100.0 * p["ms"] / total
        kern = "reference" if interpreter else (p["kernel"] or "reference")
        if kern.startswith("reference"):  # "reference (TACTIC declined)": a body layer's run-time decline
            kern = "reference"
        if kern == "reference" and p.get("shape_work") and not interpreter:
            # Shape work (kiln build's rule: views, Shape/Size, small shape arithmetic): counted apart,
            # as kiln build and kiln bench do; not a hot-path finding.
            kern = "reference (shape work)"
            shape_ops[p["op"]] = shape_ops.get(p["op"], 0.0) + share
        kernels[kern] = kernels.get(kern, 0.0) + share
        every.append({"layer": p["layer"], "op": p["op"], "kernel": kern, "share": share, "ms": p["ms"]})
        if kern == "reference":
            ref_ops[p["op"]] = ref_ops.get(p["op"], 0.0) + share
            layers.append({"layer": p["layer"], "op": p["op"], "share": share, "ms": p["ms"]})
    layers.sort(key=lambda x: -x["share"])
    every.sort(key=lambda x: -x["share"])
    return {"reference_share": sum(ref_ops.values()),
            "shape_work_share": sum(shape_ops.values()),
            "shape_work_by_op": dict(sorted(shape_ops.items(), key=lambda kv: -kv[1])),
            "reference_by_op": dict(sorted(ref_ops.items(), key=lambda kv: -kv[1])),
            "top_reference_layers": layers[:8], "reference_layers": len(layers), "layers": len(profile),
            "top_layers": every[:8],
            "kernel_share": dict(sorted(kernels.items(), key=lambda kv: -kv[1])), "profiled_ms": total}


# kiln bench's threshold (src/core/wait_policy.h, kSharedCoresWaitShare): above it a round ran on shared cores.
SHARED_CORES_WAIT_SHARE = 0.05


def kiln_round(engine, a, env, iterations):
    """One kiln bench process: its warm-up, then `iterations` timed runs. (times in ms, error or None,
    (ms its threads spent waiting for a core, their ms) or None)"""
    times = engine + ".times.json"
    rc, out, err, s = run_tool([a.kiln, "bench", engine, "--threads", str(a.threads), "--warmup-ms", "0",
                                "--duration", "0", "--json", "--warmup", str(a.warmup), "--iterations",
                                str(iterations), "--export-times", times], env=env, timeout=a.run_timeout)
    if rc != 0:
        return None, short_error(err), None
    try:
        with open(times) as f:
            t = [x["latency_ms"] for x in json.load(f)]
        os.remove(times)
    except (OSError, ValueError, KeyError) as e:
        return None, f"per-iteration times unreadable: {e}", None
    try:  # kiln's thread time spent waiting for a core, and its thread time: the load, seen by the scheduler
        o = parse_json(out)
        wait = (o["runqueue_wait_ms"], o["thread_ms"])
    except (ValueError, AttributeError, KeyError, TypeError):
        wait = None
    return t, None, wait


def ort_round(onnx_path, shapes, a, env, iterations):
    """One ort_runner.js process, measured as kiln_round. (times in ms, error or None; version)"""
    rc, out, err, s = run_tool(["node", os.path.join(BENCH, "ort_runner.js"), onnx_path, "--threads", str(a.threads),
                                "--warmup", str(a.warmup), "--iterations", str(iterations), "--shapes", shapes],
                               env=env, timeout=a.run_timeout)
    if rc != 0:
        return None, short_error(err), None
    o = parse_json(out)
    return o["times_ms"], None, o.get("version")


def measure_latency(row, engine, onnx_path, shapes, a, env):
    """kiln's and ONNX Runtime's latency, measured the same way and interleaved: `rounds` rounds of
    (kiln process, ORT process), each process with the same warm-up and iterations/rounds timed runs,
    so that a burst of load on a shared machine hits both runtimes rather than one of them. Each
    runtime's latency is the median over all its timed runs (every round); the per-round medians are
    kept in the row (kiln_round_ms, ort_round_ms) to show the spread. engine None: no kiln engine."""
    rounds = max(1, min(a.rounds, a.iterations))
    per = -(-a.iterations // rounds)  # ceil: at least `iterations` timed runs each
    kiln_t, ort_t, kiln_r, ort_r = [], [], [], []
    waited_ms = thread_ms = 0.0
    for _ in range(rounds):
        if engine and "kiln_run" not in row["errors"]:
            t, e, wait = kiln_round(engine, a, env, per)
            if e:
                row["errors"]["kiln_run"] = e
            else:
                kiln_t += t
                kiln_r.append(round(statistics.median(t), 4))
                if wait is not None:  # over all rounds: one short round's hiccup does not mark the row
                    waited_ms += wait[0]
                    thread_ms += wait[1]
        if not a.no_ort and "ort" not in row["errors"]:
            t, e, version = ort_round(onnx_path, shapes, a, env, per)
            if e:
                row["errors"]["ort"] = e
            else:
                ort_t += t
                ort_r.append(round(statistics.median(t), 4))
                row["ort_version"] = version
    row["rounds"], row["iterations_per_round"] = rounds, per
    if thread_ms > 0:
        row["kiln_wait_share"] = waited_ms / thread_ms
    if kiln_t and "kiln_run" not in row["errors"]:
        row["kiln_ms"], row["kiln_round_ms"] = statistics.median(kiln_t), kiln_r
        st = sorted(kiln_t)
        row["kiln_latency"] = {"median": row["kiln_ms"], "min": st[0], "max": st[-1],
                               "mean": sum(st) / len(st), "runs": len(st)}
    if ort_t and "ort" not in row["errors"]:
        row["ort_ms"], row["ort_round_ms"] = statistics.median(ort_t), ort_r


def run_row(spec, onnx_path, batch, a, env):
    row = {"model": spec.name, "family": spec.family, "batch": batch, "threads": a.threads, "note": spec.note,
           "second_path_of": spec.second_path_of, "opset": spec.opset, "dynamic": bool(spec.dynamic),
           "kiln_ms": None, "ort_ms": None, "kiln_vs_ort": None, "reference_share": None, "errors": {},
           "time": time.strftime("%Y-%m-%d %H:%M:%S"), "warmup": a.warmup, "iterations": a.iterations}
    shapes = shapes_flag(spec, batch)
    row["shapes"] = shapes
    th = str(a.threads)
    engine = os.path.join(a.out, "engines", f"{spec.name}_b{batch}_t{th}.kiln")
    os.makedirs(os.path.dirname(engine), exist_ok=True)
    cmd = [a.kiln, "build", onnx_path, "-o", engine, "--shapes", shapes, "--threads", th]
    if a.timing_cache:
        cmd += ["--timing-cache", a.timing_cache]
    rc, out, err, s = run_tool(cmd, env=env, timeout=a.build_timeout)
    row["kiln_build_s"] = round(s, 1)
    row["kiln_build_log"] = [l for l in err.strip().splitlines() if l.strip()][-12:]
    if rc != 0:
        row["errors"]["kiln_build"] = short_error(err)
    else:
        bench = [a.kiln, "bench", engine, "--threads", th, "--warmup-ms", "0", "--duration", "0", "--json"]
        trace = engine + ".trace.json"
        rc, out, err, s = run_tool(bench + ["--warmup", "1", "--iterations", str(a.profile_iterations),
                                            "--dump-profile", "--export-profile", trace], env=env,
                                   timeout=a.run_timeout)
        if rc != 0:
            row["errors"]["kiln_profile"] = short_error(err)
        else:
            prof = median_profile(trace) or parse_json(out).get("profile", [])
            # Control flow runs inside the engine (executor.cc): every layer's kernel in the profile is
            # the one it ran; body layers are rows of their own (If_N/else_branch/<layer>).
            row["profile"] = profile_summary(prof, False)
            row["reference_share"] = row["profile"]["reference_share"]
    if a.compare and "kiln_build" not in row["errors"]:
        # The engine's outputs against the reference interpreter's, on the same random inputs.
        rc, out, err, s = run_tool([a.kiln, "compare", onnx_path, "--engine", engine, "--shapes", shapes,
                                    "--threads", th], env=env, timeout=a.run_timeout)
        result = [l for l in (out + err).splitlines() if l.startswith("RESULT:")]
        row["compare"] = result[-1][len("RESULT:"):].strip() if result else f"error: {short_error(err)}"
        row["compare_ok"] = bool(result) and result[-1].startswith("RESULT: PASS")
    measure_latency(row, engine if "kiln_build" not in row["errors"] else None, onnx_path, shapes, a, env)
    if row["kiln_ms"] and row["ort_ms"]:
        row["kiln_vs_ort"] = row["kiln_ms"] / row["ort_ms"]
    return row


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def print_table(rows, meta):
    print(f"\nkiln vs ONNX Runtime, median latency in ms, {meta['threads']} threads ({meta['cpu']}, "
          f"{meta['cores']} cores; {meta['kiln']}, onnxruntime-node {meta['ort'] or '?'})")
    hdr = f"{'model':<38}{'batch':>6}{'kiln ms':>11}{'ORT ms':>11}{'kiln/ORT':>10}{'ref %':>8}{'shape %':>9}  note / error"
    print(hdr)
    print("-" * (len(hdr) + 30))
    for r in rows:
        err = "; ".join(f"{k}: {v}" for k, v in r["errors"].items())
        note = err or r.get("note", "")
        if (r.get("kiln_wait_share") or 0) > SHARED_CORES_WAIT_SHARE:
            note = (f"CORES SHARED: kiln's threads waited {100 * r['kiln_wait_share']:.0f}% of the time for a core, "
                    "figure not valid; " + note)
        if r.get("interpreter"):
            note = "whole graph on the interpreter (top-level If/Loop); " + note
        if "compare" in r:
            note = ("outputs match the reference; " if r["compare_ok"] else f"MISMATCH: {r['compare']}; ") + note
        print(f"{r['model']:<38}{r['batch']:>6}{fmt(r['kiln_ms']):>11}{fmt(r['ort_ms']):>11}"
              f"{fmt(r['kiln_vs_ort'], '{:.2f}x'):>10}{fmt(r['reference_share'], '{:.1f}'):>8}"
              f"{fmt((r.get('profile') or {}).get('shape_work_share'), '{:.1f}'):>9}  {note}")
    g = geomean([r["kiln_vs_ort"] for r in rows])
    n = sum(1 for r in rows if r["kiln_vs_ort"])
    shared = sum(1 for r in rows if (r.get("kiln_wait_share") or 0) > SHARED_CORES_WAIT_SHARE)
    print(f"\ngeometric mean of kiln/ORT over {n} of {len(rows)} rows: {fmt(g, '{:.2f}x')}  (below 1.0: kiln is faster)"
          + (f"; {shared} rows ran on shared cores (CORES SHARED): rerun them on a quiet machine" if shared else ""))
    print("ref %: share of kiln's per-layer time (medians, kiln bench --export-profile) in layers whose kernel is "
          "'reference' (control-flow layers' own time included); shape %: in reference layers that are shape work "
          "(kiln build's rule: views, Shape/Size, small shape arithmetic), counted apart as kiln build and bench do.")
    if meta.get("report"):
        runs = "Saved rows of earlier runs (--report; each row's time, rounds and counts are in its JSON)"
    else:
        per = -(-meta["iterations"] // max(1, min(meta["rounds"], meta["iterations"])))
        runs = (f"Medians of {per * meta['rounds']} timed runs per runtime: {meta['rounds']} interleaved rounds "
                f"(kiln, ORT, kiln, ORT, ...), each a fresh process with {meta['warmup']} warm-up runs and {per} "
                "timed ones")
    print(f"{runs}. The machine may be loaded: compare figures within one run only.")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--out", required=True, help="models/, engines/, rows/, suite.json go here")
    ap.add_argument("--models", default="", help="comma-separated names or families (default: the whole suite)")
    ap.add_argument("--batch", default=None,
                    help="batches (default 1,8; --quick: 1); models other than classifiers run at batch 1 only")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=20, help="timed runs per runtime, over all rounds")
    ap.add_argument("--rounds", type=int, default=5,
                    help="interleaved rounds (kiln, ORT, kiln, ORT, ...), each a fresh process with its own warm-up "
                         "and iterations/rounds timed runs; latency = median over all rounds' runs")
    ap.add_argument("--profile-iterations", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="batch 1, 3 warm-up runs, 10 iterations, 5 profiled")
    ap.add_argument("--timing-cache", default="")
    ap.add_argument("--no-ort", action="store_true")
    ap.add_argument("--compare", action="store_true",
                    help="also check each engine against the reference interpreter (kiln compare; slow on big models)")
    ap.add_argument("--export-only", action="store_true")
    ap.add_argument("--list", action="store_true", help="print the suite's models and exit")
    ap.add_argument("--report", action="store_true",
                    help="run nothing: print the table of the rows saved by earlier runs (OUT/rows) and --findings")
    ap.add_argument("--findings", default="", help="write the findings (Markdown) from every saved row to FILE")
    ap.add_argument("--build-timeout", type=int, default=1200)
    ap.add_argument("--run-timeout", type=int, default=900)
    ap.add_argument("--export-timeout", type=int, default=900)
    ap.add_argument("--blas-dir", default="", help="OpenBLAS for the exporter's PyTorch (BatchNorm estimation)")
    a = ap.parse_args()
    if a.quick:
        a.warmup, a.iterations, a.profile_iterations = 3, 10, 5
        a.batch = a.batch or "1"
    specs = suite_models.SPECS
    if a.models:
        want = a.models.split(",")
        unknown = [w for w in want if w not in suite_models.BY_NAME and w not in {s.family for s in specs}]
        if unknown:
            sys.exit(f"unknown models/families: {','.join(unknown)} (--list shows them)")
        specs = [s for s in specs if s.name in want or (s.family in want and not s.smoke)]
    else:
        specs = [s for s in specs if not s.smoke]
    if a.list:
        for s in specs:
            print(f"{s.name:<40}{s.family:<16}opset {s.opset:<3}{'dynamic ' if s.dynamic else ''}{s.note}")
        return
    batches = [int(b) for b in (a.batch or "1,8").split(",")]
    models_dir = os.path.join(a.out, "models")
    rows_dir = os.path.join(a.out, "rows")
    os.makedirs(models_dir, exist_ok=True)
    os.makedirs(rows_dir, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads))
    xenv = dict(env)
    if a.blas_dir:
        xenv["LD_LIBRARY_PATH"] = a.blas_dir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    rows = []
    order = {s.name: i for i, s in enumerate(specs)}
    if a.report:  # no runs: the saved rows of the selected models, in suite order
        saved = [json.load(open(p)) for p in glob.glob(os.path.join(rows_dir, "*.json"))]
        rows = sorted((r for r in saved if r["model"] in order and r["batch"] in batches),
                      key=lambda r: (r["batch"], order[r["model"]]))
    for spec in [] if a.report else specs:
        log(f"{spec.name}")
        onnx_path, err, s = export(spec, models_dir, xenv, a.export_timeout)
        if a.export_only:
            log(f"  {'exported' if onnx_path else err}")
            continue
        # Classifiers (a batch dim "B") run every batch asked for; the others batch 1 only.
        batched = any("B" in i.shape for i in spec.inputs)
        for batch in batches if batched else [b for b in batches if b == 1]:
            if err:
                row = {"model": spec.name, "family": spec.family, "batch": batch, "threads": a.threads,
                       "note": spec.note, "kiln_ms": None, "ort_ms": None, "kiln_vs_ort": None,
                       "reference_share": None, "errors": {"export": err}, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
            else:
                row = run_row(spec, onnx_path, batch, a, env)
            rows.append(row)
            with open(os.path.join(rows_dir, f"{spec.name}_b{batch}.json"), "w") as f:
                json.dump(row, f, indent=1)
            log("  b%d: kiln %s ms, ORT %s ms, ref %s%% %s" % (batch, fmt(row["kiln_ms"]), fmt(row["ort_ms"]),
                                                             fmt(row["reference_share"], "{:.1f}"),
                                                             json.dumps(row["errors"]) if row["errors"] else ""))
    if a.export_only:
        return
    kiln_version = run_tool([a.kiln, "--version"], timeout=30)[1].strip()
    meta = {"cpu": cpu_model(), "cores": os.cpu_count(), "kernel": platform.release(), "kiln": kiln_version,
            "ort": next((r.get("ort_version") for r in rows if r.get("ort_version")), None), "threads": a.threads,
            "warmup": a.warmup, "iterations": a.iterations, "rounds": a.rounds,
            "profile_iterations": a.profile_iterations,
            "geomean_kiln_vs_ort": geomean([r["kiln_vs_ort"] for r in rows]), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "report": a.report}
    if a.report:
        meta["threads"] = ",".join(sorted({str(r["threads"]) for r in rows})) or a.threads
    else:
        with open(os.path.join(a.out, "suite.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print_table(rows, meta)
    if not a.report:
        print(f"\nresults: {os.path.join(a.out, 'suite.json')} (every row also in {rows_dir}/)")
    if a.findings:
        saved = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(rows_dir, "*.json")))]
        write_findings(a.findings, saved, meta, os.path.relpath(rows_dir, os.path.dirname(BENCH)))
        print(f"findings: {a.findings} ({len(saved)} saved rows)")


if __name__ == "__main__":
    main()
