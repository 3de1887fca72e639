#!/usr/bin/env python3
"""PyTorch eager latency runner for bench/run.sh: the same models scripts/export_torch_model.py exports.

usage: torch_runner.py MODEL BATCH THREADS WARMUP ITERATIONS
Prints one JSON line: median/min/max/mean ms, torch version and the BLAS library actually loaded.
"""
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from export_torch_model import build  # noqa: E402


def blas_in_use():
    """The BLAS shared library mapped into this process, and whether it is netlib's reference BLAS."""
    libs = sorted({line.split()[-1] for line in open("/proc/self/maps")
                   if any(k in line.lower() for k in ("blas", "mkl_rt", "libmkl", "blis"))})
    config = torch.__config__.show()
    info = next((p.strip() for p in config.replace("\n", ",").split(",") if "BLAS_INFO" in p), "BLAS_INFO=?")
    names = [os.path.basename(os.path.realpath(l)) for l in libs]
    reference = any("/blas/libblas.so" in os.path.realpath(l) for l in libs) and not any(
        "openblas" in l or "mkl" in l or "blis" in l for l in libs)
    return {"build": info, "libraries": libs, "reference_blas": reference,
            "name": ("reference BLAS (netlib) -- slow; bench/run.sh puts OpenBLAS first" if reference else
                     next((f"OpenBLAS ({n})" for n in names if "openblas" in n), ", ".join(sorted(set(names))) or
                          "none mapped")),
            "mkldnn": "MKL-DNN" in config or "oneDNN" in config}


def main():
    name, batch, threads, warmup, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(
        sys.argv[5])
    torch.set_num_threads(threads)
    model, inputs, *_ = build(name)
    model.eval()
    if name == "bert_encoder":
        inputs = (torch.randint(0, 1000, (batch, 128)), torch.ones(batch, 128, dtype=torch.int64))
    else:
        inputs = (torch.rand(batch, 3, 224, 224),)
    times = []
    with torch.inference_mode():
        for _ in range(warmup):
            model(*inputs)
        for _ in range(iters):
            t0 = time.perf_counter()
            model(*inputs)
            times.append((time.perf_counter() - t0) * 1000)
    print(json.dumps({"runtime": "pytorch-eager", "version": torch.__version__, "threads": torch.get_num_threads(),
                      "iterations": len(times), "median_ms": statistics.median(times), "min_ms": min(times),
                      "max_ms": max(times), "mean_ms": statistics.fmean(times), "blas": blas_in_use()}))


if __name__ == "__main__":
    main()
