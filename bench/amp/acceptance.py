#!/usr/bin/env python3
"""Issue 12's acceptance run for automatic mixed precision (kiln build --precision auto).

    /usr/bin/python3 bench/amp/acceptance.py [--kiln build/kiln] [--out bench/out/amp] [--models resnet18,mobilenet_v2,bert]

Fashion-MNIST models (../shared/data/fmnist): the first 512 training images in batches of 32, the first 8
batches calibrating and measuring sensitivity, the other 8 (256 images) held back; tolerance
logits:top1=0.995; then both engines (FP32 and auto) on the first 1,984 test images (never seen by the
build): top-1 agreement with FP32 and accuracy. BERT encoder (bench/out/models/bert_encoder.onnx): 24
random token sequences (lengths 16..128, seed 0) at batch 1, 8 calibrating, 16 held back, candidates
BF16 only (--bf16: kiln's INT8 BERT build folds its MatMul Q/DQ elsewhere), tolerance hidden:atol=0.01
(all-BF16 misses it, so the search has to keep some layers FP32). Speed: `kiln bench` medians of both
engines, back to back. Logs and a JSON summary under --out.
"""
import argparse
import json
import os
import re
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "fmnist"))
import fmnist  # noqa: E402


def run(cmd, log):
    p = subprocess.run(cmd, capture_output=True, text=True)
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n" + p.stdout + p.stderr + "\n")
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}); see {log}")
    return p


def median_ms(kiln, engine, log, env_threads=None):
    p = run([kiln, "bench", engine, "--iterations", "50"], log)
    m = re.search(r"median = ([0-9.]+) ms", p.stdout + p.stderr)
    return float(m.group(1)) if m else None


def fmnist_row(kiln, name, out, log):
    model = os.path.join(fmnist.MODELS_DIR, f"{name}_fmnist.onnx")
    train, _ = fmnist.load_split("train", 512)
    data = os.path.join(out, "fmnist_train512.npz")
    np.savez(data, images=fmnist.preprocess(train))
    test, labels = fmnist.load_split("test", 1984)
    chunks = fmnist.write_chunks(fmnist.preprocess(test), 32, os.path.join(out, "chunks"))
    fp32, auto = os.path.join(out, f"{name}_fp32.kiln"), os.path.join(out, f"{name}_auto.kiln")
    shapes = ["--shapes", "images:32x3x64x64", "--timing-cache", os.path.join(out, "timing.cache")]
    run([kiln, "build", model, "-o", fp32] + shapes, log)
    p = run([kiln, "build", model, "-o", auto, "--precision", "auto", "--tolerance", "logits:top1=0.995",
             "--calib-data", data, "--calib-batches", "8"] + shapes, log)
    rec = json.loads(run([kiln, "inspect", auto, "--format", "json"], log).stdout)["build"]["auto_precision"]
    a = fmnist.kiln_logits(kiln, fp32, chunks, out, None, None).argmax(1)
    b = fmnist.kiln_logits(kiln, auto, chunks, out, None, None).argmax(1)
    t32, tauto = median_ms(kiln, fp32, log), median_ms(kiln, auto, log)
    counts = {}
    for u in rec["assignment"]:
        counts[u["precision"]] = counts.get(u["precision"], 0) + 1
    return {"model": name, "tolerance": "logits:top1=0.995", "held_back": rec["held_back"],
            "assignment": counts, "builds": rec["builds"], "build_seconds": rec["seconds"],
            "test_images": len(labels), "test_agreement_pct": float((a == b).mean() * 100),
            "top1_fp32_pct": float((a == labels).mean() * 100), "top1_auto_pct": float((b == labels).mean() * 100),
            "bench_median_ms_fp32_b32": t32, "bench_median_ms_auto_b32": tauto,
            "speedup": t32 / tauto if t32 and tauto else None, "build_stdout_tail": p.stdout[-600:]}


def bert_row(kiln, out, log):
    model = os.path.join(ROOT, "bench", "out", "models", "bert_encoder.onnx")
    if not os.path.exists(model):
        model = "/work/main/bench/out/models/bert_encoder.onnx"
    rng = np.random.default_rng(0)
    n = 24
    ids = rng.integers(2, 1000, size=(n, 128)).astype(np.int64)
    mask = np.ones((n, 128), np.int64)
    for i in range(n):
        length = rng.integers(16, 129)
        mask[i, length:] = 0
        ids[i, length:] = 0
    data = os.path.join(out, "bert24.npz")
    np.savez(data, input_ids=ids, attention_mask=mask)
    fp32, auto = os.path.join(out, "bert_fp32.kiln"), os.path.join(out, "bert_auto.kiln")
    shapes = ["--shapes", "input_ids:1x128,attention_mask:1x128", "--timing-cache", os.path.join(out, "timing.cache")]
    run([kiln, "build", model, "-o", fp32] + shapes, log)
    p = run([kiln, "build", model, "-o", auto, "--precision", "auto", "--bf16", "--tolerance", "hidden:atol=0.01",
             "--calib-data", data, "--calib-batch-size", "1", "--calib-batches", "8"] + shapes, log)
    rec = json.loads(run([kiln, "inspect", auto, "--format", "json"], log).stdout)["build"]["auto_precision"]
    t32, tauto = median_ms(kiln, fp32, log), median_ms(kiln, auto, log)
    counts = {}
    for u in rec["assignment"]:
        counts[u["precision"]] = counts.get(u["precision"], 0) + 1
    return {"model": "bert_encoder", "tolerance": "hidden:atol=0.01", "held_back": rec["held_back"],
            "every_layer_bf16": rec["every_layer_reduced"].get("bf16", {}).get("held_back"),
            "assignment": counts, "builds": rec["builds"], "build_seconds": rec["seconds"],
            "bench_median_ms_fp32_b1": t32, "bench_median_ms_auto_b1": tauto,
            "speedup": t32 / tauto if t32 and tauto else None, "build_stdout_tail": p.stdout[-600:]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "amp"))
    ap.add_argument("--models", default="resnet18,mobilenet_v2,bert")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    log = os.path.join(args.out, "acceptance.log")
    rows = []
    for m in args.models.split(","):
        rows.append(bert_row(args.kiln, args.out, log) if m == "bert" else fmnist_row(args.kiln, m, args.out, log))
        print(json.dumps(rows[-1], indent=1), flush=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"load_average": os.getloadavg(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
