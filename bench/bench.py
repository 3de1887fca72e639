#!/usr/bin/env python3
"""kiln vs ONNX Runtime vs PyTorch eager: one table of median latencies measured in the same run.

Called by bench/run.sh (which installs the peers); see bench/README.md. For every model x batch x threads
row it runs `kiln bench --json` on an engine built for that batch, bench/ort_runner.js (onnxruntime-node,
all graph optimizations) and bench/torch_runner.py (PyTorch eager), each in its own process, one after
the other. Writes OUT/results.json and OUT/results.png (when matplotlib is available).
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = "/usr/bin/python3"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run_json(cmd, env=None, timeout=3600):
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode != 0:
        log(f"  FAILED ({r.returncode}): {' '.join(cmd)}\n{r.stderr.strip()[-800:]}")
        return None
    lines = r.stdout.strip()
    try:
        try:
            return json.loads(lines)  # kiln bench --json: one (indented) document
        except json.JSONDecodeError:
            return json.loads(lines.splitlines()[-1])  # the runners: last line
    except (json.JSONDecodeError, IndexError):
        log(f"  bad output from {' '.join(cmd)} after {time.time() - t0:.1f}s: {lines[-300:]}")
        return None


# INT8 rows: kiln and ONNX Runtime running the same ONNX Runtime-quantized file (the data sets'
# READMEs: ../shared/data/qdq, ../shared/data/fmnist); no PyTorch column. name -> (file, input, dims).
INT8_FILES = {
    "resnet50_int8": ("qdq/resnet50.ort-int8-qdq.onnx", "input", [3, 224, 224]),
    "mobilenet_v2_int8": ("qdq/mobilenet_v2.ort-int8-qdq.onnx", "input", [3, 224, 224]),
    "bert_int8": ("qdq/bert_base_enc.ort-int8-dynamic.onnx", "embeddings", [128, 768]),
    "resnet18_fmnist_int8": ("fmnist/resnet18_fmnist.ort-int8-qdq.onnx", "images", [3, 64, 64]),
    "mobilenet_v2_fmnist_int8": ("fmnist/mobilenet_v2_fmnist.ort-int8-qdq.onnx", "images", [3, 64, 64]),
}


# kiln's own INT8 builds of the FP32 exports, against ONNX Runtime running its INT8 file of the same
# network: name -> (FP32 model in --models-dir, the INT8_FILES row ONNX Runtime runs). kiln calibrates
# on the export's fixed inputs (MODEL_inputs.npz, written by scripts/export_torch_model.py; minmax),
# once: the ranges go to OUT/MODEL.int8.calib (--calib-cache), which later rows and runs reuse.
OWN_INT8 = {
    "resnet50_own_int8": ("resnet50", "resnet50_int8"),
    "mobilenet_v2_own_int8": ("mobilenet_v2", "mobilenet_v2_int8"),
    "bert_own_int8": ("bert_encoder", "bert_int8"),
}


def input_shapes(model, batch):
    if model in OWN_INT8:
        return input_shapes(OWN_INT8[model][0], batch)
    if model in INT8_FILES:
        _, name, dims = INT8_FILES[model]
        return {name: [batch] + dims}
    if model == "bert_encoder":
        return {"input_ids": [batch, 128], "attention_mask": [batch, 128]}
    return {"input": [batch, 3, 224, 224]}


def shapes_flag(shapes):
    return ",".join(f"{k}:{'x'.join(map(str, v))}" for k, v in shapes.items())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--models-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="resnet50,mobilenet_v2,bert_encoder")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=20, help="peers (ORT, PyTorch)")
    ap.add_argument("--kiln-iterations", type=int, default=0, help="kiln (default: as --iterations)")
    ap.add_argument("--kiln-warmup", type=int, default=0, help="kiln (default: as --warmup)")
    ap.add_argument("--timing-cache", default="", help="kiln build --timing-cache FILE (reused across rows/runs)")
    ap.add_argument("--blas-dir", default="", help="directory with OpenBLAS's libblas.so.3 for PyTorch")
    ap.add_argument("--kiln-precisions", default="bf16",
                    help="extra kiln engines per row, by build flag (bf16: kiln build --bf16); empty: none. "
                         "Each adds kiln_<p>_ms and kiln_<p>_vs_fp32 to the row")
    ap.add_argument("--data-dir", default=os.path.join(ROOT, "..", "shared", "data"),
                    help="where the INT8 rows' files are (qdq/, fmnist/)")
    a = ap.parse_args()
    a.kiln_iterations = a.kiln_iterations or a.iterations
    a.kiln_warmup = a.kiln_warmup or a.warmup
    os.makedirs(a.out, exist_ok=True)
    models = a.models.split(",")
    batches = [int(b) for b in a.batches.split(",")]
    threads = [int(t) for t in a.threads.split(",")]
    rows = []
    torch_blas = None
    ort_version = None
    for model in models:
        own = OWN_INT8.get(model)
        int8 = model in INT8_FILES or own is not None
        onnx_path = (os.path.join(a.data_dir, INT8_FILES[model][0]) if model in INT8_FILES else
                     os.path.join(a.models_dir, (own[0] if own else model) + ".onnx"))
        # ONNX Runtime's side: the same file, or (own INT8 rows) its INT8 file of the network.
        ort_path = os.path.join(a.data_dir, INT8_FILES[own[1]][0]) if own else onnx_path
        for batch in batches:
            shapes = input_shapes(model, batch)
            ort_shapes = input_shapes(own[1], batch) if own else shapes
            for th in threads:
                log(f"{model} batch {batch} threads {th}")
                # kiln tunes its tactics at the thread count it will run with: one engine per row.
                engine = os.path.join(a.out, f"{model}_b{batch}_t{th}.kiln")
                cmd = [a.kiln, "build", onnx_path, "-o", engine, "--shapes", shapes_flag(shapes), "--threads", str(th)]
                if a.timing_cache:
                    cmd += ["--timing-cache", a.timing_cache]
                if own:
                    cmd += ["--int8", "--calib-data", os.path.join(a.models_dir, own[0] + "_inputs.npz"),
                            "--calib-cache", os.path.join(a.out, own[0] + ".int8.calib")]
                t0 = time.time()
                r = subprocess.run(cmd, capture_output=True, text=True)
                build_s = time.time() - t0
                if r.returncode != 0:
                    log(f"kiln build {model} b{batch} t{th} failed: {r.stderr.strip()[-500:]}")
                    engine = None
                env = dict(os.environ, OMP_NUM_THREADS=str(th), OPENBLAS_NUM_THREADS=str(th))
                kiln = run_json([a.kiln, "bench", engine, "--threads", str(th), "--warmup", str(a.kiln_warmup),
                                 "--warmup-ms", "0", "--iterations", str(a.kiln_iterations), "--duration", "0",
                                 "--json"], env=env) if engine else None
                ort = run_json(["node", os.path.join(HERE, "ort_runner.js"), ort_path, "--threads", str(th),
                                "--warmup", str(a.warmup), "--iterations", str(a.iterations), "--shapes",
                                shapes_flag(ort_shapes)], env=env)
                tenv = dict(env)
                if a.blas_dir:
                    tenv["LD_LIBRARY_PATH"] = a.blas_dir + (":" + env["LD_LIBRARY_PATH"] if env.get(
                        "LD_LIBRARY_PATH") else "")
                pt = None if int8 else run_json([PY, os.path.join(HERE, "torch_runner.py"), model, str(batch), str(th),
                                                 str(a.warmup), str(a.iterations)], env=tenv)
                if pt:
                    torch_blas = pt.get("blas")
                if ort:
                    ort_version = ort.get("version")
                row = {"model": model, "batch": batch, "threads": th,
                       "kiln_ms": kiln["latency_ms"]["median"] if kiln else None,
                       "ort_ms": ort["median_ms"] if ort else None,
                       "torch_ms": pt["median_ms"] if pt else None,
                       "kiln_iterations": kiln["iterations"] if kiln else 0,
                       "peer_iterations": a.iterations, "kiln_build_s": build_s}
                row["raw"] = {"kiln": {k: kiln[k] for k in ("latency_ms", "iterations", "warmup_runs", "inputs")}
                              if kiln else None,
                              "ort": ort, "torch": {k: v for k, v in pt.items() if k != "blas"} if pt else None}
                row["kiln_vs_ort"] = row["kiln_ms"] / row["ort_ms"] if row["kiln_ms"] and row["ort_ms"] else None
                row["kiln_vs_torch"] = (row["kiln_ms"] / row["torch_ms"]
                                        if row["kiln_ms"] and row["torch_ms"] else None)
                for p in [p for p in a.kiln_precisions.split(",") if p and not own]:
                    pe = os.path.join(a.out, f"{model}_b{batch}_t{th}_{p}.kiln")
                    r = subprocess.run(cmd[:4] + [pe] + cmd[5:] + ["--" + p], capture_output=True, text=True)
                    if r.returncode != 0:
                        log(f"kiln build --{p} {model} b{batch} t{th} failed: {r.stderr.strip()[-500:]}")
                    pk = run_json([a.kiln, "bench", pe, "--threads", str(th), "--warmup", str(a.kiln_warmup),
                                   "--warmup-ms", "0", "--iterations", str(a.kiln_iterations), "--duration", "0",
                                   "--json"], env=env) if r.returncode == 0 else None
                    row[f"kiln_{p}_ms"] = pk["latency_ms"]["median"] if pk else None
                    row[f"kiln_{p}_vs_fp32"] = (row[f"kiln_{p}_ms"] / row["kiln_ms"]
                                                if row[f"kiln_{p}_ms"] and row["kiln_ms"] else None)
                rows.append(row)
                log("  " + json.dumps({k: v for k, v in row.items() if k.endswith("_ms")}))
    kiln_version = subprocess.run([a.kiln, "--version"], capture_output=True, text=True).stdout.strip()
    meta = {"machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "kernel": platform.release()},
            "kiln": kiln_version, "onnxruntime_node": ort_version, "torch_blas": torch_blas,
            "note": "medians; ratio = kiln / peer (below 1.0: kiln is faster). Each runs in its own process, "
                    "one after the other, per row; threads = intra-op threads of each."}
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print_table(rows, meta)
    chart(rows, os.path.join(a.out, "results.png"))
    print(f"\nresults: {os.path.join(a.out, 'results.json')}")


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def fmt(x, spec="{:.2f}"):
    return "-" if x is None else spec.format(x)


def print_table(rows, meta):
    print(f"\nMedian latency, ms ({meta['machine']['cpu']}, {meta['machine']['cores']} cores; "
          f"{meta['kiln']}, onnxruntime-node {meta['onnxruntime_node']}, PyTorch eager with "
          f"{(meta['torch_blas'] or {}).get('name', '?')})")
    hdr = f"{'model':<26}{'batch':>6}{'thr':>5}{'kiln':>12}{'ORT':>11}{'PyTorch':>11}{'kiln/ORT':>10}{'kiln/PT':>10}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['model']:<26}{r['batch']:>6}{r['threads']:>5}{fmt(r['kiln_ms']):>12}{fmt(r['ort_ms']):>11}"
              f"{fmt(r['torch_ms']):>11}{fmt(r['kiln_vs_ort'], '{:.2f}x'):>10}{fmt(r['kiln_vs_torch'], '{:.2f}x'):>10}")
    extra = sorted({k[5:-3] for r in rows for k in r
                    if k.startswith("kiln_") and k.endswith("_ms") and k != "kiln_ms"})
    if extra:  # kiln's reduced-precision engines (--kiln-precisions)
        print(f"\n{'model':<14}{'batch':>6}{'thr':>5}{'kiln fp32':>12}" +
              "".join(f"{'kiln ' + p:>12}{p + '/fp32':>11}" for p in extra))
        for r in rows:
            print(f"{r['model']:<14}{r['batch']:>6}{r['threads']:>5}{fmt(r['kiln_ms']):>12}" +
                  "".join(f"{fmt(r.get(f'kiln_{p}_ms')):>12}{fmt(r.get(f'kiln_{p}_vs_fp32'), '{:.2f}x'):>11}"
                          for p in extra))
    print(f"\n{meta['note']}")
    blas = meta.get("torch_blas") or {}
    if blas.get("reference_blas"):
        print("WARNING: PyTorch ran on netlib's reference BLAS; its matmul-heavy rows are not representative.")


def chart(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no PNG chart: matplotlib is not installed (Debian: apt-get install python3-matplotlib)")
        return
    labels = [f"{r['model']}\nb{r['batch']} t{r['threads']}" for r in rows]
    series = [("kiln", "kiln_ms", "#d95f02"), ("ONNX Runtime", "ort_ms", "#1b9e77"), ("PyTorch", "torch_ms", "#7570b3")]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows)), 4.5))
    w = 0.27
    for k, (name, key, color) in enumerate(series):
        xs = [i + (k - 1) * w for i in range(len(rows))]
        ax.bar(xs, [r[key] or 0 for r in rows], w, label=name, color=color)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("median latency, ms (log scale)")
    ax.set_title("kiln vs ONNX Runtime vs PyTorch eager (lower is better)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"chart: {path}")


if __name__ == "__main__":
    main()
