#!/usr/bin/env python3
"""kiln vs PyTorch on one NVIDIA GPU, in one run (issue 13, deliver 6).

usage: bench.py --kiln BIN/kiln --repo REPO --out RESULTS.json [--models bert_encoder,resnet50]
                [--batches 1,32] [--precisions fp32,fp16[,int8]] [--compile-mode max-autotune|none] [--iters N]

For each model, batch and precision it measures, on the same GPU:
  kiln              kiln build --device cuda [--fp16], then kiln bench (median latency) twice: with the
                    boundary copies (host in, host out) and with --no-data-transfers --use-cuda-graph
                    (device compute only, what the PyTorch rows measure), plus the H2D/compute/D2H split;
  torch eager       the module on the GPU, inputs already there, timed with CUDA events;
  torch eager+graph the same captured once into a torch.cuda.CUDAGraph and replayed;
  torch compile     torch.compile(mode=COMPILE_MODE) (max-autotune uses CUDA graphs itself).
FP32 rows run with TF32 off everywhere (torch.backends.*.allow_tf32 = False; kiln builds without --tf32).
FP16 rows: kiln --fp16 (FP16 storage, FP32 accumulation) against the module in .half().
INT8 rows (resnet50): kiln build --int8 --fp16 calibrated on 64 random images; kiln only (no PyTorch INT8 peer),
checked against the FP32 module like the others (max error, top-1 agreement).

Models are rebuilt here from scripts/export_torch_model.py (random weights with a fixed seed) and
exported to ONNX with this machine's torch, so kiln and PyTorch run the same weights; the check compares
kiln's outputs with the FP32 PyTorch module's on the same inputs (max abs error, and the error relative
to the output's max magnitude). resnet50 needs torchvision and a GPU convolution: without either the row
says so (a host convolution is reported by kiln build as a fallback, and the row is marked).

Prints a table of latencies and kiln/PyTorch ratios (below 1: kiln faster) and writes RESULTS.json.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np


def log(msg):
    print(msg, flush=True)


def run(cmd, timeout=600):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr, time.time() - t0


def load_exporter(repo):
    sys.path.insert(0, os.path.join(repo, "scripts"))
    import export_torch_model  # noqa: E402
    return export_torch_model


def model_inputs(name, batch, torch):
    g = torch.Generator().manual_seed(1)
    if name == "bert_encoder":
        ids = torch.randint(0, 1000, (batch, 128), generator=g)
        mask = torch.ones(batch, 128, dtype=torch.int64)
        mask[:, 100:] = 0
        return {"input_ids": ids, "attention_mask": mask}
    return {"input": torch.rand(batch, 3, 224, 224, generator=g)}


def export(exp, name, work, torch):
    path = os.path.join(work, name + ".onnx")
    model, inputs, in_names, out_names, dyn, opset = exp.build(name)
    model.eval()
    if not os.path.exists(path):
        kwargs = dict(input_names=in_names, output_names=out_names, dynamic_axes=dyn, opset_version=opset)
        try:
            torch.onnx.export(model, inputs, path, dynamo=False, **kwargs)
        except TypeError:  # an older torch without the dynamo switch
            torch.onnx.export(model, inputs, path, **kwargs)
    return model, path, out_names[0]


def time_cuda(fn, torch, iters, warmup=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def torch_rows(model, inputs, precision, compile_mode, iters, torch):
    import copy
    m = copy.deepcopy(model).cuda().eval()
    dev = {k: v.cuda() for k, v in inputs.items()}
    if precision == "fp16":
        m = m.half()
        dev = {k: (v.half() if v.is_floating_point() else v) for k, v in dev.items()}
    args = list(dev.values())
    rows = {}
    with torch.inference_mode():
        out = m(*args)
        rows["torch_eager_ms"] = time_cuda(lambda: m(*args), torch, iters)
        # eager + CUDA graph: static inputs, captured once, replayed.
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                m(*args)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = m(*args)
        rows["torch_graph_ms"] = time_cuda(graph.replay, torch, iters)
        del static_out, graph
        if compile_mode != "none":
            t0 = time.time()
            try:
                c = torch.compile(m, mode=compile_mode)
                for _ in range(3):
                    c(*args)
                torch.cuda.synchronize()
                rows["torch_compile_s"] = time.time() - t0
                rows["torch_compile_ms"] = time_cuda(lambda: c(*args), torch, iters)
            except Exception as e:  # noqa: BLE001 - reported in the row
                rows["torch_compile_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            torch._dynamo.reset()
    return rows, out.float().cpu().numpy()


def kiln_rows(kiln, onnx, name, batch, precision, inputs, work, iters, extra_flags=()):
    tag = f"{name}_b{batch}_{precision}" + "".join(f.replace("-", "_") for f in extra_flags)
    engine = os.path.join(work, tag + ".kiln")
    if name == "bert_encoder":
        shapes = f"input_ids:{batch}x128,attention_mask:{batch}x128"
    else:
        shapes = f"input:{batch}x3x224x224"
    cmd = [kiln, "build", onnx, "--device", "cuda", "--shapes", shapes, "-o", engine]
    if precision == "fp16":
        cmd.append("--fp16")
    elif precision == "int8":
        # Post-training calibration (kiln's default calibrator) on 64 random images other than the test
        # inputs, in batches of the row's size; the FP16 kernels are allowed beside INT8 where a layer has no
        # INT8 kernel (kiln build --int8 --fp16).
        calib = os.path.join(work, f"{name}_calib.npz")
        if not os.path.exists(calib):
            g = np.random.default_rng(2)
            np.savez(calib, input=g.random((64, 3, 224, 224), dtype=np.float32))
        cmd += ["--int8", "--fp16", "--calib-data", calib, "--calib-batch-size", str(min(batch, 32))]
    cmd += list(extra_flags)
    rc, out, err, secs = run(cmd, timeout=900)
    row = {"kiln_build_s": secs}
    build_log = out + err
    with open(os.path.join(work, tag + ".build.txt"), "w") as f:
        f.write(build_log)
    if rc != 0:
        row["kiln_error"] = "build failed: " + build_log.strip().splitlines()[-1][:300]
        return row, None
    host = [line for line in build_log.splitlines() if "on the host" in line]
    if host:
        row["kiln_host_fallback"] = host[0][:300]
    for key, extra in (("kiln", []), ("kiln_graph_compute", ["--use-cuda-graph", "--no-data-transfers"]),
                       ("kiln_nograph_compute", ["--no-data-transfers"])):
        rc, out, err, _ = run([kiln, "bench", engine, "--json", "--iterations", str(iters), "--duration", "1"] + extra)
        if rc != 0:
            row[key + "_error"] = (out + err).strip().splitlines()[-1][:300]
            continue
        j = json.loads(out[out.index("{"):])
        row[key + "_ms"] = j["latency_ms"]["median"]
        if "device_phases_ms" in j:
            row[key + "_phases_ms"] = j["device_phases_ms"]
        if "cuda_graph" in j and j["cuda_graph"]["enabled"]:
            row[key + "_cuda_graph"] = j["cuda_graph"]
    npz = os.path.join(work, tag + "_inputs.npz")
    np.savez(npz, **{k: v.numpy() for k, v in inputs.items()})
    outs = os.path.join(work, tag + "_outputs.npz")
    rc, out, err, _ = run([kiln, "run", engine, "--inputs", npz, "--save-outputs", outs])
    if rc != 0:
        row["kiln_run_error"] = (out + err).strip().splitlines()[-1][:300]
        return row, None
    got = np.load(outs)
    return row, got[list(got.keys())[0]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--repo", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/kiln-gpu-bench")
    ap.add_argument("--models", default="bert_encoder,resnet50")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--precisions", default="fp32,fp16")
    ap.add_argument("--compile-mode", default="max-autotune", help='torch.compile mode, or "none" to skip')
    ap.add_argument("--compile-precisions", default="fp32,fp16",
                    help="precisions whose rows also time torch.compile (max-autotune compiles take minutes each)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--kiln-build-flags", default="", help="more kiln build flags, space-separated (e.g. --exact-gelu)")
    args = ap.parse_args()
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    os.makedirs(args.work, exist_ok=True)
    exp = load_exporter(args.repo)
    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "compile_mode": args.compile_mode,
            "tf32": False, "iters": args.iters}
    log(f"[bench] {meta}")
    rows = []
    for name in args.models.split(","):
        try:
            model, onnx, _ = export(exp, name, args.work, torch)
        except Exception as e:  # noqa: BLE001 - torchvision missing, export failure: the row says so
            rows.append({"model": name, "error": f"export: {type(e).__name__}: {str(e)[:200]}"})
            log(f"[bench] {name}: {rows[-1]['error']}")
            continue
        for batch in [int(b) for b in args.batches.split(",")]:
            inputs = model_inputs(name, batch, torch)
            with torch.inference_mode():
                ref = model.cuda().float()(*[v.cuda() for v in inputs.values()]).float().cpu().numpy()
            for precision in args.precisions.split(","):
                row = {"model": name, "batch": batch, "precision": precision}
                log(f"[bench] {name} batch {batch} {precision} ...")
                k, got = kiln_rows(args.kiln, onnx, name, batch, precision, inputs, args.work, args.iters,
                                   args.kiln_build_flags.split())
                if args.kiln_build_flags:
                    row["kiln_build_flags"] = args.kiln_build_flags
                row.update(k)
                torch_out = None
                if precision != "int8":  # PyTorch has no INT8 GPU path of its own to compare with here
                    t, torch_out = torch_rows(model, inputs, precision,
                                               args.compile_mode if precision in args.compile_precisions.split(",") else "none",
                                               args.iters, torch)
                    row.update(t)
                scale = float(np.abs(ref).max()) or 1.0
                if got is not None:
                    err = float(np.abs(got.astype(np.float64) - ref).max())
                    row["kiln_max_abs_err"], row["kiln_rel_err"] = err, err / scale
                    if name == "resnet50":  # classifier logits: top-1 must be identical to PyTorch FP32's
                        row["kiln_top1_agree"] = int((got.reshape(batch, -1).argmax(1) == ref.reshape(batch, -1).argmax(1)).sum())
                if torch_out is not None:
                    terr = float(np.abs(torch_out.astype(np.float64) - ref).max())
                    row["torch_max_abs_err"], row["torch_rel_err"] = terr, terr / scale
                for peer in ("torch_eager_ms", "torch_graph_ms", "torch_compile_ms"):
                    if peer in row and "kiln_graph_compute_ms" in row:
                        row["ratio_vs_" + peer[:-3]] = row["kiln_graph_compute_ms"] / row[peer]
                rows.append(row)
                log("[bench] " + json.dumps(row))
                with open(args.out, "w") as f:  # after every row: a run cut short keeps what it measured
                    json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print_table(rows, meta)


def fmt(x, spec="{:.3f}"):
    return spec.format(x) if isinstance(x, (int, float)) else "-"


def print_table(rows, meta):
    print(f"\nGPU {meta['gpu']}, torch {meta['torch']}, TF32 off, torch.compile mode {meta['compile_mode']}")
    print("latency medians in ms; kiln = host in/out; kiln dev = --no-data-transfers --use-cuda-graph;"
          " ratio = kiln dev / peer (below 1: kiln faster)")
    hdr = ["model", "b", "prec", "kiln", "kiln dev", "eager", "eager+graph", "compile", "/eager", "/graph",
           "/compile", "kiln rel err", "torch rel err", "note"]
    print(" | ".join(hdr))
    for r in rows:
        if "error" in r:
            print(f"{r['model']} | - | - | " + r["error"])
            continue
        note = r.get("kiln_error") or r.get("kiln_host_fallback") or r.get("torch_compile_error") or ""
        cells = [r["model"], str(r["batch"]), r["precision"], fmt(r.get("kiln_ms")), fmt(r.get("kiln_graph_compute_ms")),
                 fmt(r.get("torch_eager_ms")), fmt(r.get("torch_graph_ms")), fmt(r.get("torch_compile_ms")),
                 fmt(r.get("ratio_vs_torch_eager"), "{:.2f}"), fmt(r.get("ratio_vs_torch_graph"), "{:.2f}"),
                 fmt(r.get("ratio_vs_torch_compile"), "{:.2f}"), fmt(r.get("kiln_rel_err"), "{:.1e}"),
                 fmt(r.get("torch_rel_err"), "{:.1e}"), note[:80]]
        print(" | ".join(cells))


if __name__ == "__main__":
    main()
