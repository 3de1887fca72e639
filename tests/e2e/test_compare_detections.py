#!/usr/bin/env python3
"""Acceptance tests of `kiln compare --detections`: detector outputs compared as sets of detections.

usage: test_compare_detections.py KILN WORKDIR
The model passes its inputs through (boxes, scores, labels = Identity of b, s, l) and has one
`scores > 0.3` node, the score threshold kiln reads. The reference side is a framework .npz
(--ref FILE.npz) and the test side the reference interpreter (--test onnx), so each case plants an
exact difference: the test detections are the model's inputs, the reference ones the .npz.
"""
import json
import os

import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

import e2e_util
from e2e_util import WORK, check, finish, make_workdir

make_workdir(clean=True)


def make_model(path, batched=False, label_dtype=TensorProto.INT64, names=("boxes", "scores", "labels")):
    lead = ["batch", "n"] if batched else ["n"]
    nodes = [helper.make_node("Identity", ["b"], [names[0]]), helper.make_node("Identity", ["s"], [names[1]]),
             helper.make_node("Identity", ["l"], [names[2]]),
             helper.make_node("Greater", ["s", "thr"], ["keep"], name="score_thresh")]
    g = helper.make_graph(nodes, "det", [helper.make_tensor_value_info("b", TensorProto.FLOAT, lead + [4]),
                                         helper.make_tensor_value_info("s", TensorProto.FLOAT, lead),
                                         helper.make_tensor_value_info("l", label_dtype, lead)],
                          [helper.make_tensor_value_info(names[0], TensorProto.FLOAT, lead + [4]),
                           helper.make_tensor_value_info(names[1], TensorProto.FLOAT, lead),
                           helper.make_tensor_value_info(names[2], label_dtype, lead),
                           helper.make_tensor_value_info("keep", TensorProto.BOOL, lead)],
                          initializer=[numpy_helper.from_array(np.array(0.3, np.float32), "thr")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="kiln-detections-test")
    m.ir_version = 8
    onnx.save(m, path)


model = os.path.join(WORK, "det.onnx")
make_model(model)
plain = os.path.join(WORK, "det_named.onnx")  # outputs not named boxes/scores/labels: no automatic head
make_model(plain, names=("dets", "conf", "cls"))

# Reference: 6 detections, scores descending, all above the 0.3 threshold.
R_BOXES = np.array([[10, 10, 50, 60], [100, 20, 180, 90], [30, 200, 90, 260], [200, 200, 300, 310],
                    [5, 120, 40, 170], [250, 10, 310, 70]], np.float32)
R_SCORES = np.array([0.95, 0.90, 0.80, 0.70, 0.55, 0.40], np.float32)
R_LABELS = np.array([1, 3, 1, 2, 5, 3], np.int64)


def run(name, t_boxes, t_scores, t_labels, *extra, ref=None, model_path=None, names=("boxes", "scores", "labels")):
    """kiln compare of reference (R_* or ref) vs test detections: (exit code, log, report)."""
    rb, rs, rl = ref if ref is not None else (R_BOXES, R_SCORES, R_LABELS)
    ref_npz, in_npz, rep = (os.path.join(WORK, f"{name}_{k}") for k in ("ref.npz", "in.npz", "report.json"))
    c = np.ascontiguousarray
    np.savez(ref_npz, **{names[0]: c(rb), names[1]: c(rs), names[2]: c(rl)})
    np.savez(in_npz, b=c(t_boxes, np.float32), s=c(t_scores, np.float32), l=c(t_labels, rl.dtype))
    rc, log = e2e_util.kiln("compare", model_path or model, "--ref", ref_npz, "--test", "onnx", "--inputs", in_npz,
                            "--json", rep, *extra)
    report = json.load(open(rep)) if os.path.exists(rep) else {}
    return rc, log, report


def head(report):
    return report.get("detections", [{}])[0]


perm = [3, 0, 5, 1, 4, 2]
rc, log, rep = run("perm", R_BOXES[perm], R_SCORES[perm], R_LABELS[perm])
check(rc == 0 and head(rep).get("matched") == 6 and head(rep).get("pass"), "permuted detections pass")
check("compared as detections because the outputs are named boxes, scores, labels" in log,
      "the boxes/scores/labels head is found by name, and the output says so")
check(head(rep).get("score_threshold") is not None and abs(head(rep)["score_threshold"] - 0.3) < 1e-6,
      "the score threshold is read from the model's Greater node")
rc, log, _ = run("perm_none", R_BOXES[perm], R_SCORES[perm], R_LABELS[perm], "--detections", "none")
check(rc == 1 and "detections" not in log.split("RESULT")[0].split("boundary")[-1],
      "--detections none compares elementwise (the permutation then fails)")

# Tiny rounding differences in scores and boxes (within atol/rtol) pass.
rc, log, rep = run("noise", R_BOXES[perm] + 1e-3, R_SCORES[perm] + 5e-5, R_LABELS[perm])
check(rc == 0, "scores and boxes within tolerance pass")

# A box moved so that its IoU drops to about 0.95 fails.
moved = R_BOXES.copy()
moved[1] += np.array([2, 0, 2, 0], np.float32)  # 80 wide: IoU 78/82 = 0.951
rc, log, rep = run("moved", moved, R_SCORES, R_LABELS)
check(rc == 1 and not head(rep).get("pass", True) and head(rep)["matched"] == 6, "a box moved by 5% IoU fails")
check("IoU 0.95" in log, "the failing pair's IoU is reported")

# A score 10x atol off fails.
s = R_SCORES.copy()
s[2] += 1e-3  # atol 1e-4, rtol 1e-3 of 0.8 is 8e-4
rc, log, rep = run("score", R_BOXES, s, R_LABELS)
check(rc == 1 and "score differs by" in log, "a score off by 10x atol fails")

# An extra test detection far above the cut fails.
eb = np.vstack([R_BOXES, [[150, 150, 190, 190]]])
rc, log, rep = run("extra_high", eb, np.append(R_SCORES, 0.85), np.append(R_LABELS, 4))
check(rc == 1 and head(rep).get("unexplained") == 1 and "NOT accepted" in log,
      "an extra detection with a score far above the cut fails")

# An extra test detection tied with the reference's lowest score (the cut) passes.
rc, log, rep = run("extra_cut", eb, np.append(R_SCORES, 0.40003), np.append(R_LABELS, 4))
check(rc == 0 and head(rep).get("unexplained") == 0 and "at the cut" in log,
      "an extra detection tied at the cut passes")
# A swap at a top-k cut: the last detection differs on both sides, with tied scores: passes.
sb = R_BOXES.copy()
sb[5] = [150, 150, 190, 190]
sl = R_LABELS.copy()
sl[5] = 4
rc, log, rep = run("swap_cut", sb, R_SCORES + np.float32(0), sl)
check(rc == 0 and len(head(rep).get("unmatched", [])) == 2, "a swap of tied detections at the cut passes")
# A missing detection at the score threshold (not the lowest on the other side) passes; with
# --det-threshold none it fails.
lb = np.vstack([R_BOXES, [[150, 150, 190, 190]]])
rc, log, rep = run("thresh", R_BOXES, R_SCORES, R_LABELS, ref=(lb, np.append(R_SCORES, 0.30002), np.append(R_LABELS, 4)))
check(rc == 0 and "at the score threshold 0.3" in log, "a detection dropped at the score threshold passes")
rc, log, rep = run("thresh_none", R_BOXES, R_SCORES, R_LABELS, "--det-threshold", "none",
                   ref=(lb, np.append(R_SCORES, 0.30002), np.append(R_LABELS, 4)))
check(rc == 1 and "no score threshold known" in log, "without the threshold the same missing detection fails")

# Labels that differ: the detections do not match, and neither side's is explained.
ll = R_LABELS.copy()
ll[0] = 7
rc, log, rep = run("labels", R_BOXES, R_SCORES, ll)
check(rc == 1 and head(rep).get("matched") == 5 and head(rep).get("unexplained") == 2, "a label mismatch fails")
rc, log, rep = run("labels_ignored", R_BOXES, R_SCORES, ll, "--detections", "boxes,scores")
check(rc == 1 and "output labels: FAIL" in log and head(rep).get("pass"),
      "without LABELS the head ignores labels; the labels output is then compared elementwise (and fails)")

# Explicit head on other names; no automatic head there.
nm = ("dets", "conf", "cls")
rc, log, rep = run("named", R_BOXES[perm], R_SCORES[perm], R_LABELS[perm], model_path=plain, names=nm)
check(rc == 1 and rep.get("detections") == [] and "output dets: FAIL" in log,
      "outputs not named boxes/scores/labels are compared elementwise by default")
rc, log, rep = run("named2", R_BOXES[perm], R_SCORES[perm], R_LABELS[perm], "--detections", "dets,conf,cls",
                   model_path=plain, names=nm)
check(rc == 0 and head(rep).get("spec") == "dets,conf,cls" and not head(rep).get("auto"), "--detections NAMES")
rc, log, _ = run("named3", R_BOXES, R_SCORES, R_LABELS, "--detections", "dets,nope", model_path=plain, names=nm)
check(rc != 0 and rc != 1 and "'nope' is not an output of the model" in log, "an unknown output name is an error")
rc, log, _ = run("named4", R_BOXES, R_SCORES, R_LABELS, "--detections", "conf,dets", model_path=plain, names=nm)
check(rc != 0 and rc != 1 and "output 'conf' is float32[6]" in log and "[N,4]" in log,
      "a boxes output of the wrong shape is an error naming the output and its shape")

# Batched [B,N,4] / [B,N] detections: per image.
bmodel = os.path.join(WORK, "det_batched.onnx")
make_model(bmodel, batched=True)
B = (np.stack([R_BOXES, R_BOXES + 37]), np.stack([R_SCORES, R_SCORES]), np.stack([R_LABELS, R_LABELS]))
rc, log, rep = run("batched", B[0][:, perm], B[1][:, perm], B[2][:, perm], ref=B, model_path=bmodel)
check(rc == 0 and head(rep).get("images") == 2 and head(rep).get("matched") == 12, "[B,N,4] detections per image")
# Image 1's detections given as image 0's: they match nothing across images.
rc, log, rep = run("batched_swap", B[0][::-1], B[1][::-1], B[2][::-1], ref=B, model_path=bmodel)
check(rc == 1, "detections are matched within their image only")

# HTML carries the verdict; a repro bundle keeps the flag and replays to the same verdict.
html = os.path.join(WORK, "moved.html")
bundle = os.path.join(WORK, "bundle")
rc, log, rep = run("bundle", moved, R_SCORES, R_LABELS, "--detections", "boxes,scores,labels", "--html", html,
                   "--save-failure", bundle)
check(rc == 1 and os.path.exists(html) and 'class="detections"' in open(html).read(), "the HTML report has the head")
opts = json.load(open(os.path.join(bundle, "bundle.json")))["options"]
check(opts.get("detections") == ["boxes,scores,labels"], "the bundle records --detections")
rc, log = e2e_util.kiln("compare", "--replay", bundle)
check(rc == 1 and "detections boxes,scores,labels: FAIL" in log and "reproduces the bundle's numbers exactly" in log,
      "--replay reruns the detection comparison and reproduces it")

finish()
