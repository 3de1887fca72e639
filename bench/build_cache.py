#!/usr/bin/env python3
"""Cold vs warm engine builds: how much a timing cache saves (issue 4's "second build with a warm
timing cache is at least 5x faster than the first").

For each repetition: delete the cache, `kiln build --timing-cache C` (cold: every candidate is
prepared and timed, the cache is written), then the same command again (warm: every layer is answered
by the cache, nothing is prepared or timed). Wall time of the whole process, median over the
repetitions, for each model/shape given; the engine file is deleted before each build (both builds
write a new file; the file system's cost of deleting a previous engine is not build work). Also prints
what the builds said about tuning.

  bench/build_cache.py [--kiln build/kiln] [--reps 5] [--threads 2] MODEL.onnx:SHAPES ...
  e.g. bench/build_cache.py bench/out/models/resnet50.onnx:input:1x3x224x224
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def timed(cmd, engine):
    if os.path.exists(engine):  # each build writes a new file: deleting the previous output is not build work
        os.remove(engine)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr[-800:]}")
    tuned = [l for l in (r.stderr + r.stdout).splitlines() if "tuned" in l]
    return dt, (tuned[-1].replace("[kiln build] ", "") if tuned else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default=os.path.join(os.path.dirname(HERE), "build", "kiln"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("cases", nargs="+", help="MODEL.onnx:NAME:DIMS[,NAME:DIMS...]")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kiln_build_cache_")
    print(f"{'model':<16} {'shapes':<34} {'cold (s)':>9} {'warm (s)':>9} {'cold/warm':>10}")
    for case in a.cases:
        model, shapes = case.split(":", 1)
        engine, cache = os.path.join(tmp, "m.kiln"), os.path.join(tmp, "cache.json")
        cmd = [a.kiln, "build", model, "-o", engine, "--shapes", shapes, "--threads", str(a.threads),
               "--timing-cache", cache, "--verbose"]
        cold, warm = [], []
        for _ in range(a.reps):
            if os.path.exists(cache):
                os.remove(cache)
            c, cold_msg = timed(cmd, engine)
            w, warm_msg = timed(cmd, engine)
            cold.append(c)
            warm.append(w)
        mc, mw = statistics.median(cold), statistics.median(warm)
        name = os.path.splitext(os.path.basename(model))[0]
        print(f"{name:<16} {shapes:<34} {mc:9.3f} {mw:9.3f} {mc / mw:9.1f}x")
        print(f"  cold: {cold_msg}\n  warm: {warm_msg}")
        print(f"  cold runs {', '.join(f'{x:.3f}' for x in cold)}; warm runs {', '.join(f'{x:.3f}' for x in warm)}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
