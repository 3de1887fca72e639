#!/usr/bin/env python3
"""Python API overhead and thread scaling (issue 14's figures; not a test: timings live in bench/).

  PYTHONPATH=build/python OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/python_overhead.py [--parallel]

Overhead: per run of a tiny model (y = x + 1 on [1,4]), context.run({"x": x}) from Python against
the same inputs through the C++ API in a C++ loop (ExecutionContext._time_cpp_runs: set_input_shared,
run, output), interleaved, median of the repeats; also InferenceSession.run. --parallel: a
compute-heavy model (8 MatMul+Tanh layers of 512x512) with 1 kiln thread, 2 Python threads each
running its own context vs the same runs one after another.
"""
import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python", "tests"))
import numpy as np  # noqa: E402

import kiln  # noqa: E402
import models  # noqa: E402


def overhead(tmp, repeats, iters):
    path = models.save(models.tiny(), os.path.join(tmp, "tiny.onnx"))
    ctx = kiln.build(path).create_context()
    x = kiln.aligned_empty((1, 4))
    x[...] = 1
    feeds = {"x": x}
    for _ in range(1000):
        ctx.run(feeds)
    py, cpp, view, sess_t = [], [], [], []
    os.environ.setdefault("KILN_CACHE_DIR", os.path.join(tmp, "cache"))
    sess = kiln.InferenceSession(path)
    for _ in range(repeats):
        cpp.append(ctx._time_cpp_runs(feeds, iters))
        t0 = time.perf_counter()
        for _ in range(iters):
            ctx.run(feeds)
        py.append((time.perf_counter() - t0) / iters)
        t0 = time.perf_counter()
        for _ in range(iters):
            ctx.run(feeds, copy=False)
        view.append((time.perf_counter() - t0) / iters)
        t0 = time.perf_counter()
        for _ in range(iters):
            sess.run(None, feeds)
        sess_t.append((time.perf_counter() - t0) / iters)
    med = statistics.median
    us = 1e6
    print("tiny model, %d repeats x %d runs, median per run:" % (repeats, iters))
    print("  C++ API (set_input_shared, run, output)   %7.2f us" % (med(cpp) * us))
    print("  context.run({'x': x})                     %7.2f us  (overhead %+.2f us)" %
          (med(py) * us, (med(py) - med(cpp)) * us))
    print("  context.run({'x': x}, copy=False)         %7.2f us  (overhead %+.2f us)" %
          (med(view) * us, (med(view) - med(cpp)) * us))
    print("  InferenceSession.run(None, {'x': x})      %7.2f us  (overhead %+.2f us)" %
          (med(sess_t) * us, (med(sess_t) - med(cpp)) * us))
    overheads = sorted((p - c) * us for p, c in zip(py, cpp))
    print("  context.run overhead per repeat (us): " + " ".join("%.2f" % o for o in overheads))


def parallel(tmp, runs):
    kiln.set_threads(1)
    path = models.save(models.matmul_chain(512, 8), os.path.join(tmp, "chain.onnx"))
    engine = kiln.build(path)
    x = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    ctxs = [engine.create_context() for _ in range(2)]
    for c in ctxs:
        c.run({"x": x})

    def serial():
        t0 = time.perf_counter()
        for c in ctxs:
            for _ in range(runs):
                c.run({"x": x})
        return time.perf_counter() - t0

    def threaded():
        ts = [threading.Thread(target=lambda c=c: [c.run({"x": x}) for _ in range(runs)]) for c in ctxs]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return time.perf_counter() - t0

    s, p = [], []
    for _ in range(3):  # interleaved
        s.append(serial())
        p.append(threaded())
    ms, mp = statistics.median(s), statistics.median(p)
    print("matmul chain 8 x 512^2, 1 kiln thread, 2 x %d runs: serial %.3f s, 2 Python threads %.3f s: "
          "speedup %.2fx (each repeat: %s)" % (runs, ms, mp, ms / mp,
                                               " ".join("%.2f" % (a / b) for a, b in zip(s, p))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--parallel", action="store_true", help="also measure 2-thread scaling")
    ap.add_argument("--runs", type=int, default=10, help="--parallel: runs per context")
    a = ap.parse_args()
    print("kiln %s, load average %.2f %.2f %.2f" % ((kiln.version(),) + os.getloadavg()))
    with tempfile.TemporaryDirectory() as tmp:
        kiln.set_threads(1)
        overhead(tmp, a.repeats, a.iters)
        if a.parallel:
            parallel(tmp, a.runs)


if __name__ == "__main__":
    main()
