#!/usr/bin/env python3
"""Exports a torchvision detector with control flow in its post-processing (If around batched NMS).

usage: export_detector.py {ssdlite,fasterrcnn} OUT.onnx [--head-scale S]
Writes OUT.onnx (torch.onnx.export, opset 11, one 3x320x320 image) and OUT_image.npy (the image).
Weights are random with a fixed seed, eval mode. Two adjustments keep the outputs comparable
between runtimes: BatchNorm statistics are estimated on random images (with default statistics deep
feature maps go constant and many anchors tie exactly on their scores, so TopK/NMS order hangs on
rounding), and the classification heads are scaled up (near-uniform softmax scores otherwise: ssdlite
ties, fasterrcnn detects nothing above its 0.05 threshold).
"""
import argparse

import numpy as np
import torch
import torchvision

p = argparse.ArgumentParser()
p.add_argument("name", choices=["ssdlite", "fasterrcnn"])
p.add_argument("out")
p.add_argument("--head-scale", type=float, default=None, help="ssdlite: 2, fasterrcnn: 60 (default)")
a = p.parse_args()
torch.manual_seed(0)
det = torchvision.models.detection
if a.name == "ssdlite":
    m = det.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)
    outputs = ["boxes", "scores", "labels"]  # SSD's postprocess order
else:
    m = det.fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None)
    outputs = ["boxes", "labels", "scores"]
for mod in m.modules():
    if isinstance(mod, torch.nn.BatchNorm2d):
        mod.reset_running_stats()
        mod.momentum = None  # cumulative average over the batches below
m.train()
with torch.no_grad():
    for _ in range(3):
        feats = m.backbone(torch.randn(4, 3, 320, 320))
        if a.name == "ssdlite":
            m.head(list(feats.values()))
    if a.name == "ssdlite":
        for seq in m.head.classification_head.module_list:
            seq[-1].weight.mul_(a.head_scale or 2.0)
    else:
        m.roi_heads.box_predictor.cls_score.weight.mul_(a.head_scale or 60.0)
        m.rpn.head.cls_logits.weight.mul_(20.0)
m.eval()
x = torch.rand(3, 320, 320)
with torch.no_grad():
    r = m([x])[0]
    print({k: tuple(v.shape) for k, v in r.items()})
    torch.onnx.export(m, ([x],), a.out, opset_version=11, input_names=["image"], output_names=outputs,
                      do_constant_folding=True)
np.save(a.out.replace(".onnx", "_image.npy"), x.numpy())
