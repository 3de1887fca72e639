#!/usr/bin/env python3
"""How fast can an FP32 CNN run on this machine? A roofline check of kiln and ONNX Runtime.

Counts the model's convolution / GEMM FLOPs (2 per multiply-add) by kind, measures this machine's
SGEMM rate (OpenBLAS, 3072^3, the rate the issue quotes) at the given thread count, runs kiln (its
per-layer profile) and ONNX Runtime on the same shapes, and prints:
  - each runtime's achieved GFLOP/s (direct-convolution FLOPs / median latency);
  - kiln's time per kind of layer against that kind's time at the SGEMM rate;
  - a lower bound for any FP32 implementation: every non-Winograd FLOP at the SGEMM rate, plus the
    3x3 stride-1 convolutions at the SGEMM rate with Winograd F(4x4,3x3)'s full 4x fewer multiplies
    and free transforms (no real kernel gets there); and the same bound once each 3x3 layer must also
    read its weights from memory (4x of them for Winograd), at one core's measured read bandwidth.

  /usr/bin/python3 bench/roofline.py [--batch 1] [--threads 2] [--model bench/out/models/resnet50.onnx]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BLAS_DIR = os.path.join(HERE, ".deps/usr/lib/x86_64-linux-gnu/openblas-pthread")

SGEMM = r"""
import time, torch
n = 3072
a, b = torch.randn(n, n), torch.randn(n, n)
torch.mm(a, b)
best = min((lambda t: (torch.mm(a, b), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(5))
print(2 * n ** 3 / best / 1e9)
"""


def conv_flops(model_path, batch):
    import onnx
    from onnx import shape_inference
    m = onnx.load(model_path, load_external_data=False)
    inp = m.graph.input[0]
    inp.type.tensor_type.shape.dim[0].dim_value = batch
    m = shape_inference.infer_shapes(m)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(m.graph.value_info) + list(m.graph.output)}
    inits = {i.name: list(i.dims) for i in m.graph.initializer}
    kinds, layer_kind, wino = {}, {}, []
    for n in m.graph.node:
        if n.op_type == "Conv":
            w, out = inits[n.input[1]], shapes[n.output[0]]
            strides = next((list(a.ints) for a in n.attribute if a.name == "strides"), [1, 1])
            group = next((a.i for a in n.attribute if a.name == "group"), 1)
            flops = 2 * w[0] * w[1] * w[2] * w[3] * out[0] * out[2] * out[3]
            if group > 1:
                kind = "depthwise/grouped conv"
            elif w[2:] == [1, 1]:
                kind = "1x1 conv"
            elif w[2:] == [3, 3] and strides == [1, 1]:
                kind = "3x3 conv stride 1 (Winograd-able)"
                wino.append((flops, 4 * w[0] * w[1] * 9))  # direct FLOPs, weight bytes
            elif w[2:] == [3, 3]:
                kind = "3x3 conv stride 2"
            else:
                kind = f"{w[2]}x{w[3]} conv"
        elif n.op_type in ("Gemm", "MatMul"):
            w = inits.get(n.input[1])
            if not w:
                continue
            a = shapes.get(n.input[0]) or [batch, w[0]]
            flops = 2 * (a[0] if len(a) == 2 else 1) * w[0] * w[1]
            kind = "gemm"
        else:
            continue
        kinds[kind] = kinds.get(kind, 0) + flops
        layer_kind[n.name] = kind
    return kinds, layer_kind, wino


BANDWIDTH = r"""
import time, numpy as np
a = np.ones(100_000_000, dtype=np.float32)
a.sum()
best = min((lambda t: (a.sum(), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(3))
print(a.nbytes / best / 1e9)
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(HERE, "out/models/resnet50.onnx"))
    ap.add_argument("--input", default="input")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build/kiln"))
    a = ap.parse_args()
    shapes = f"{a.input}:{a.batch}x3x224x224"
    kinds, layer_kind, wino = conv_flops(a.model, a.batch)
    total = sum(kinds.values())

    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
    if os.path.exists(os.path.join(BLAS_DIR, "libblas.so.3")):
        env["LD_LIBRARY_PATH"] = BLAS_DIR
    else:
        print("warning: bench/.deps has no OpenBLAS (run bench/run.sh once): the SGEMM rate is the system BLAS's")
    peak = float(subprocess.run(["/usr/bin/python3", "-c", SGEMM], env=env, capture_output=True, text=True,
                                check=True).stdout.split()[-1])

    bw = float(subprocess.run(["/usr/bin/python3", "-c", BANDWIDTH], capture_output=True, text=True,
                              check=True).stdout.split()[-1])
    tmp = tempfile.mkdtemp(prefix="kiln_roofline_")
    engine = os.path.join(tmp, "m.kiln")
    subprocess.run([a.kiln, "build", a.model, "-o", engine, "--shapes", shapes, "--threads", str(a.threads)],
                   check=True, capture_output=True)
    k = json.loads(subprocess.run([a.kiln, "bench", engine, "--threads", str(a.threads), "--warmup", "5",
                                   "--iterations", str(a.iterations), "--duration", "0", "--json", "--dump-profile"],
                                  check=True, capture_output=True, text=True).stdout)
    ort = json.loads(subprocess.run(["node", os.path.join(HERE, "ort_runner.js"), a.model, "--threads",
                                     str(a.threads), "--warmup", "5", "--iterations", str(a.iterations),
                                     "--shapes", shapes], check=True, capture_output=True,
                                    text=True).stdout.strip().splitlines()[-1])
    kiln_ms, ort_ms = k["latency_ms"]["median"], ort["median_ms"]

    by_kind = {}
    for layer in k["profile"]:
        kind = layer_kind.get(layer["layer"], "other layers")
        by_kind[kind] = by_kind.get(kind, 0) + layer["mean_ms"]
    print(f"{os.path.basename(a.model)} batch {a.batch}, {a.threads} thread(s): {total / 1e9:.2f} GFLOP "
          f"(direct convolution and GEMM, 2 FLOP per multiply-add)")
    print(f"SGEMM (OpenBLAS 3072^3, {a.threads} thread(s)): {peak:.0f} GFLOP/s")
    print(f"ONNX Runtime: median {ort_ms:.2f} ms = {total / ort_ms / 1e6:.0f} GFLOP/s "
          f"({total / ort_ms / 1e6 / peak * 100:.0f}% of SGEMM)")
    print(f"kiln:         median {kiln_ms:.2f} ms = {total / kiln_ms / 1e6:.0f} GFLOP/s "
          f"({total / kiln_ms / 1e6 / peak * 100:.0f}% of SGEMM); kiln/ORT {kiln_ms / ort_ms:.2f}x")
    print()
    print(f"{'kind of layer':<36} {'GFLOP':>7} {'at SGEMM (ms)':>14} {'bound (ms)':>11} {'kiln (ms)':>10}")
    bound = 0.0
    for kind in sorted(set(kinds) | set(by_kind), key=lambda x: -kinds.get(x, 0)):
        f = kinds.get(kind, 0)
        at_peak = f / peak / 1e6
        b = at_peak / 4 if "Winograd" in kind else at_peak
        bound += b
        print(f"{kind:<36} {f / 1e9:7.3f} {at_peak:14.2f} {b:11.2f} {by_kind.get(kind, 0):10.2f}")
    print(f"{'all':<36} {total / 1e9:7.3f} {total / peak / 1e6:14.2f} {bound:11.2f} "
          f"{sum(by_kind.values()):10.2f}  (kiln: sum of per-layer means)")
    print()
    print(f"lower bound (every FLOP at the SGEMM rate, ideal 4x Winograd, nothing else costs): {bound:.2f} ms "
          f"= {bound / ort_ms:.2f}x ONNX Runtime; 0.75x ONNX Runtime = {0.75 * ort_ms:.2f} ms")
    # The weights of a large model do not stay in cache from one inference to the next: each 3x3 layer
    # reads its weights from memory, F(4x4,3x3) Winograd reads 36/9 = 4x as many (transformed). Per
    # layer, the better of direct max(F/peak, W/bw) and Winograd max(F/4/peak, 4W/bw).
    w_flop = sum(f for f, _ in wino) / peak / 1e6 / 4
    w_mem = sum(min(max(f / peak / 1e6, wb / bw / 1e6), max(f / 4 / peak / 1e6, 4 * wb / bw / 1e6)) for f, wb in wino)
    mem_bound = bound - w_flop + w_mem
    print(f"memory read bandwidth (one core, numpy sum of 400 MB): {bw:.1f} GB/s; with each 3x3 stride-1 layer "
          f"also bounded by reading its weights (Winograd: 4x of them): {mem_bound:.2f} ms = "
          f"{mem_bound / ort_ms:.2f}x ONNX Runtime")


if __name__ == "__main__":
    sys.exit(main())
