#!/usr/bin/env python3
"""Smoke test of the model suite's harness (bench/suite/suite.py): export -> kiln build -> kiln bench
(per-layer profile) -> kiln compare -> kiln and ONNX Runtime latency in interleaved rounds (ORT when
bench/node_modules has it) -> table, JSON rows and
findings, on the suite's tiny smoke_cnn model; and a failing step is a row with its error, not a crash.
The suite itself (~40 models) is far too slow for CTest: bench/run.sh --suite.

usage: test_bench_suite.py KILN WORKDIR
"""
import json
import os
import subprocess

from e2e_util import KILN, WORK, check, finish, make_workdir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUITE = os.path.join(ROOT, "bench", "suite", "suite.py")
HAVE_ORT = os.path.isdir(os.path.join(ROOT, "bench", "node_modules", "onnxruntime-node"))

make_workdir(clean=True)


def suite(*args, kiln=KILN):
    r = subprocess.run(["/usr/bin/python3", SUITE, "--kiln", kiln, "--out", WORK, "--models", "smoke_cnn",
                        "--quick", *args], capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout, r.stderr


findings = os.path.join(WORK, "FINDINGS.md")
rc, out, err = suite("--batch", "1,8", "--compare", "--findings", findings, *([] if HAVE_ORT else ["--no-ort"]))
check(rc == 0, f"suite exits 0 (rc {rc}; {err[-400:]})")
check(os.path.getsize(os.path.join(WORK, "models", "smoke_cnn.onnx")) > 0, "smoke_cnn exported")
rows = json.load(open(os.path.join(WORK, "suite.json")))["rows"]
check([(r["model"], r["batch"]) for r in rows] == [("smoke_cnn", 1), ("smoke_cnn", 8)],
      "a classifier runs at batch 1 and 8")
for r in rows:
    check(r["errors"] == {}, f"b{r['batch']}: no errors ({r['errors']})")
    check((r["kiln_ms"] or 0) > 0, f"b{r['batch']}: kiln median measured")
    # --quick: 10 timed runs per runtime in 5 interleaved rounds of 2 (measure_latency)
    check(r.get("rounds") == 5 and r.get("iterations_per_round") == 2, f"b{r['batch']}: 5 rounds of 2 runs")
    check(len(r.get("kiln_round_ms", [])) == 5 and r["kiln_latency"]["runs"] == 10,
          f"b{r['batch']}: kiln measured in every round, median over all 10 runs ({r.get('kiln_round_ms')})")
    check(min(r["kiln_round_ms"]) <= r["kiln_ms"] <= max(r["kiln_round_ms"]),
          f"b{r['batch']}: the overall median lies within the round medians")
    prof = r.get("profile") or {}
    check(prof.get("layers", 0) >= 4, f"b{r['batch']}: per-layer profile read ({prof.get('layers')} layers)")
    shares = sum(prof.get("kernel_share", {}).values())
    check(abs(shares - 100.0) < 0.5, f"b{r['batch']}: kernel shares add up to 100% ({shares:.2f})")
    check(0.0 <= r["reference_share"] <= 100.0, f"b{r['batch']}: reference share {r['reference_share']:.1f}%")
    check(r["shapes"] == f"input:{r['batch']}x3x16x16", f"b{r['batch']}: shapes flag {r['shapes']}")
    check(r.get("compare_ok") is True, f"b{r['batch']}: engine matches the reference interpreter ({r.get('compare')})")
    if HAVE_ORT:
        check((r["ort_ms"] or 0) > 0 and r["kiln_vs_ort"] is not None, f"b{r['batch']}: ORT measured, ratio")
        check(len(r.get("ort_round_ms", [])) == 5, f"b{r['batch']}: ORT measured in every round")
check("smoke_cnn" in out and "geometric mean of kiln/ORT" in out, "table printed")
check(os.path.exists(findings) and "| smoke_cnn | 8 |" in open(findings).read(), "findings written")

# --report: the saved rows again, without running anything.
rc, out, err = suite("--report", "--batch", "1,8")
check(rc == 0 and out.count("smoke_cnn") == 2 and "Saved rows" in out, f"--report prints the saved rows (rc {rc})")

# A kiln that cannot build: the row records the error and the suite still prints its table.
rc, out, err = suite("--no-ort", kiln="/bin/false")
rows = json.load(open(os.path.join(WORK, "suite.json")))["rows"]
check(rc == 0 and len(rows) == 1, f"failing build: suite exits 0 with one row (rc {rc})")
check("kiln_build" in rows[0]["errors"] and rows[0]["kiln_ms"] is None, f"build error recorded: {rows[0]['errors']}")
check("kiln_build:" in out, "error shown in the table")
finish()
