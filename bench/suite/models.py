"""The model suite of `bench/run.sh --suite`: what each model is, its inputs, and how it is exported.

This module imports no torch at load time (the runner only needs names, inputs and batches);
`make()` builds the PyTorch module and its example inputs when export.py asks for it.

Conventions:
- Random weights with a fixed seed; BatchNorm running statistics are estimated by export.py on random
  inputs (train-mode forwards with momentum=None), so that activations are not degenerate.
- Primary export: torch.onnx.export (TorchScript-based: the only exporter of torch 1.13), opset 17.
  Classifiers have a dynamic batch dim (one file serves batch 1 and 8); the others are static.
- Second export paths (a name suffix): `_op11` / `_op13` (older opset: e.g. LayerNormalization is
  decomposed before opset 17) and `_dyn` (dynamic_axes on batch / sequence / spatial dims, so shape
  arithmetic stays in the graph instead of being constant-folded by the exporter).
- Reduced resolutions where a model is heavy for 2 cores: noted in `note` and in the table.
"""
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple


@dataclass
class Input:
    name: str
    shape: Tuple  # "B" stands for the batch
    dtype: str = "float32"  # float32 | int64

    def dims(self, batch):
        return [batch if d == "B" else d for d in self.shape]


@dataclass
class Spec:
    name: str
    family: str  # classification | detection | segmentation | transformer
    make: Callable  # () -> (torch.nn.Module, tuple of example inputs at batch 1)
    inputs: List[Input]
    outputs: List[str]
    batches: Tuple = (1,)
    opset: int = 17
    dynamic: Optional[Dict] = None  # dynamic_axes for torch.onnx.export
    note: str = ""
    second_path_of: str = ""  # the primary model this is a second export of
    smoke: bool = False  # tiny model of the ctest smoke test (not in the default suite)


def _tv(name, **kw):
    def make():
        import torchvision
        return getattr(torchvision.models, name)(weights=None, **kw)
    return make


def _image_inputs(res, batch_dim="B"):
    return [Input("input", (batch_dim, 3, res, res))]


class _ClassifierMake:
    def __init__(self, tv_name, res, **kw):
        self.tv_name, self.res, self.kw = tv_name, res, kw

    def __call__(self):
        import torch
        return _tv(self.tv_name, **self.kw)(), (torch.rand(1, 3, self.res, self.res) * 2 - 1,)


def classifier(name, res=224, tv_name=None, note="", opset=17, second_path_of="", **kw):
    return Spec(name, "classification", _ClassifierMake(tv_name or name, res, **kw), _image_inputs(res), ["logits"],
                batches=(1, 8), opset=opset, dynamic={"input": {0: "batch"}, "logits": {0: "batch"}},
                note=note or (f"{res}x{res}" if res != 224 else ""), second_path_of=second_path_of)


class _DictOut:
    """Segmentation models return {'out': ..., 'aux': ...}: export the 'out' tensor only."""

    def __new__(cls, model):
        import torch

        class Wrap(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, x):
                return self.m(x)["out"]
        return Wrap(model)


class _SegMake:
    def __init__(self, tv_name, res, **kw):
        self.tv_name, self.res, self.kw = tv_name, res, kw

    def __call__(self):
        import torch
        import torchvision
        m = getattr(torchvision.models.segmentation, self.tv_name)(weights=None, weights_backbone=None, **self.kw)
        return _DictOut(m), (torch.rand(1, 3, self.res, self.res) * 2 - 1,)


def segmentation(name, res, tv_name=None, note="", opset=17, dynamic=None, second_path_of="", **kw):
    return Spec(name, "segmentation", _SegMake(tv_name or name, res, **kw), [Input("input", (1, 3, res, res))],
                ["out"], opset=opset, dynamic=dynamic, note=note, second_path_of=second_path_of)


class _DetMake:
    """torchvision detectors take a list of 3-D images and return [{'boxes', 'scores', 'labels'}]:
    exported with one image, as torchvision's own ONNX tests do."""

    def __init__(self, tv_name, res, **kw):
        self.tv_name, self.res, self.kw = tv_name, res, kw

    def __call__(self):
        import torch
        import torchvision
        m = getattr(torchvision.models.detection, self.tv_name)(weights=None, weights_backbone=None, **self.kw)
        return m, ([torch.rand(3, self.res, self.res)],)

    def condition(self, model, inputs):
        """After export.py's BatchNorm estimate, the heads whose init leaves the detector with no output:
        a parity check of zero boxes checks nothing. Seeded (the caller's torch.manual_seed).
        - Faster R-CNN: the RoI head's two fully connected layers (TwoMLPHead fc6, fc7: nn.Linear's
          init, weight variance 1/(3 fan_in)) shrink the features ~7x, the 91 class logits are ~0 and
          every softmax score ~1/91, under box_score_thresh 0.05. fc6/fc7 get He init (variance
          2/fan_in, the ReLU's gain: variance kept); the class logits are scaled to std 2.
        - RetinaNet: the head's convolutions are drawn with std 0.01 (torchvision's focal-loss init),
          which shrinks the towers' features ~3x per layer, and the class logits sit at the prior bias
          (sigmoid 0.01, under score_thresh 0.05). The towers' hidden convolutions get He init; the
          class logits' spread around the prior is scaled to std 2 (the prior bias kept); the box
          regression keeps its init (deltas of std ~0.5 on He-initialized features).
        - SSDlite: left as built (softmax scores already pass its threshold, 300 detections).
        A trained detector's scores are spread too; std 2 leaves some above the threshold."""
        import torch
        if hasattr(model, "roi_heads"):
            for fc in (model.roi_heads.box_head.fc6, model.roi_heads.box_head.fc7):
                torch.nn.init.kaiming_normal_(fc.weight, nonlinearity="relu")
                torch.nn.init.zeros_(fc.bias)
            _scale_logits(model, inputs, model.roi_heads.box_predictor.cls_score, 2.0, keep_bias=False)
        elif self.tv_name.startswith("retinanet"):
            for tower in (model.head.classification_head.conv, model.head.regression_head.conv):
                for conv in (m for m in tower.modules() if isinstance(m, torch.nn.Conv2d)):
                    torch.nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
                    torch.nn.init.zeros_(conv.bias)
            _scale_logits(model, inputs, model.head.classification_head.cls_logits, 2.0, keep_bias=True)


def _scale_logits(model, inputs, layer, std, keep_bias):
    """Scales `layer`'s weight so that its output, less its bias, has standard deviation `std` on one
    forward of `inputs` (every call of the layer: all FPN levels); zeroes the bias unless keep_bias."""
    import torch
    outs = []
    h = layer.register_forward_hook(lambda mod, i, o: outs.append(o.detach().flatten(1)))
    with torch.no_grad():
        model(*inputs)
    h.remove()
    bias = layer.bias.detach().view(1, -1, 1) if isinstance(layer, torch.nn.Conv2d) else layer.bias.detach()
    spread = []
    for o in outs:
        o = o.view(o.shape[0], bias.shape[1], -1) if isinstance(layer, torch.nn.Conv2d) else o
        spread.append((o - bias).flatten())
    cur = torch.cat(spread).std().item()
    with torch.no_grad():
        layer.weight.mul_(std / cur)
        if not keep_bias:
            layer.bias.zero_()


def detection(name, res, tv_name=None, note="", opset=17, second_path_of="", **kw):
    # Output names follow the order of the detector's result dict, which torch.onnx.export flattens:
    # boxes, scores, labels for SSD and RetinaNet; boxes, labels, scores for Faster R-CNN's RoI heads.
    order = ["boxes", "labels", "scores"] if (tv_name or name).startswith("fasterrcnn") else ["boxes", "scores", "labels"]
    return Spec(name, "detection", _DetMake(tv_name or name, res, **kw), [Input("images", (3, res, res))], order,
                opset=opset, note=note, second_path_of=second_path_of)


class _HFMake:
    def __init__(self, kind):
        self.kind = kind

    def __call__(self):
        from hf_models import make  # bench/suite/hf_models.py
        return make(self.kind)


def transformer(name, kind, inputs, outputs, note, opset=17, dynamic=None, second_path_of=""):
    return Spec(name, "transformer", _HFMake(kind), inputs, outputs, opset=opset, dynamic=dynamic, note=note,
                second_path_of=second_path_of)


class _SmokeMake:
    def __call__(self):
        import torch
        m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.MaxPool2d(3, 2, ceil_mode=True), torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 10))
        return m, (torch.rand(1, 3, 16, 16),)


SEQ = 128
BERT_IN = [Input("input_ids", (1, SEQ), "int64"), Input("token_type_ids", (1, SEQ), "int64"),
           Input("attention_mask", (1, SEQ), "int64")]
BERT_DYN = {n: {0: "batch", 1: "seq"} for n in ("input_ids", "token_type_ids", "attention_mask", "last_hidden_state")}
BERT_DYN["pooler_output"] = {0: "batch"}
GPT_IN = [Input("input_ids", (1, SEQ), "int64")]
GPT_DYN = {"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
T5_IN = [Input("input_ids", (1, SEQ), "int64")]
T5_DYN = {"input_ids": {0: "batch", 1: "seq"}, "last_hidden_state": {0: "batch", 1: "seq"}}
WHISPER_FRAMES = 1000
WHISPER_IN = [Input("input_features", (1, 80, WHISPER_FRAMES))]

SPECS = [
    # --- torchvision classification zoo (224x224 unless noted; batch 1 and 8)
    classifier("resnet18"),
    classifier("resnet50"),
    classifier("resnext50_32x4d"),
    classifier("wide_resnet50_2"),
    classifier("densenet121"),
    classifier("inception_v3", res=299, init_weights=True),
    classifier("googlenet", init_weights=True),
    classifier("vgg11"),
    classifier("alexnet"),
    classifier("mobilenet_v2"),
    classifier("mobilenet_v3_large"),
    classifier("mobilenet_v3_small"),
    classifier("mnasnet1_0"),
    classifier("shufflenet_v2_x1_0"),
    classifier("squeezenet1_0"),
    classifier("squeezenet1_1"),
    classifier("efficientnet_b0"),
    classifier("regnet_x_400mf"),
    classifier("regnet_y_400mf"),
    classifier("convnext_tiny"),
    classifier("swin_t"),
    classifier("vit_b_32", note="vit_b_32 (vit_b_16 is 4x the FLOPs)"),
    # second export path: opset 11
    classifier("resnet50_op11", tv_name="resnet50", opset=11, second_path_of="resnet50"),
    classifier("mobilenet_v3_large_op11", tv_name="mobilenet_v3_large", opset=11, second_path_of="mobilenet_v3_large"),
    classifier("swin_t_op13", tv_name="swin_t", opset=13, second_path_of="swin_t"),
    # --- detection (one image, reduced resolution)
    detection("ssdlite320_mobilenet_v3_large", 320, note="320x320 (its native size)"),
    detection("fasterrcnn_mobilenet_v3_large_320_fpn", 320, note="320x320 (its native min_size)"),
    detection("retinanet_resnet50_fpn", 320, min_size=320, max_size=320, note="320x320 (min_size=max_size=320; default 800)"),
    detection("ssdlite320_op11", 320, tv_name="ssdlite320_mobilenet_v3_large", opset=11,
              second_path_of="ssdlite320_mobilenet_v3_large", note="320x320, opset 11"),
    # --- segmentation
    segmentation("lraspp_mobilenet_v3_large", 320, note="320x320 (default 520)"),
    segmentation("deeplabv3_mobilenet_v3_large", 320, aux_loss=False, note="320x320 (default 520)"),
    segmentation("fcn_resnet50", 224, aux_loss=False, note="224x224 (default 520)"),
    segmentation("lraspp_dyn", 320, tv_name="lraspp_mobilenet_v3_large",
                 dynamic={"input": {0: "batch", 2: "height", 3: "width"}, "out": {0: "batch", 2: "height", 3: "width"}},
                 second_path_of="lraspp_mobilenet_v3_large", note="320x320, dynamic batch/height/width"),
    # --- transformers written the way Hugging Face's are (bench/suite/hf_models.py)
    transformer("bert", "bert", BERT_IN, ["last_hidden_state", "pooler_output"],
                "BERT with token types + pooler: hidden 256, 4 layers, 4 heads, seq 128"),
    transformer("gpt2", "gpt2", GPT_IN, ["logits"],
                "GPT-2 causal LM, no KV cache: hidden 384, 4 layers, 6 heads, vocab 1000, seq 128"),
    transformer("t5_encoder", "t5", T5_IN, ["last_hidden_state"],
                "T5 v1.1 encoder, relative position bias, gated-GELU: d_model 256, 4 layers, 4 heads, seq 128"),
    transformer("whisper_encoder", "whisper", WHISPER_IN, ["last_hidden_state"],
                "Whisper-tiny encoder (d 384, 4 layers, 6 heads), 80 mel x 1000 frames (10 s; real: 3000)"),
    transformer("bert_dyn", "bert", BERT_IN, ["last_hidden_state", "pooler_output"],
                "bert, dynamic batch/seq", dynamic=BERT_DYN, second_path_of="bert"),
    transformer("bert_op13", "bert", BERT_IN, ["last_hidden_state", "pooler_output"],
                "bert, opset 13 (LayerNorm decomposed)", opset=13, second_path_of="bert"),
    transformer("gpt2_dyn", "gpt2", GPT_IN, ["logits"], "gpt2, dynamic batch/seq", dynamic=GPT_DYN,
                second_path_of="gpt2"),
    transformer("t5_encoder_dyn", "t5", T5_IN, ["last_hidden_state"],
                "t5_encoder, dynamic batch/seq (the bucket arithmetic stays in the graph)", dynamic=T5_DYN,
                second_path_of="t5_encoder"),
    transformer("whisper_encoder_op13", "whisper", WHISPER_IN, ["last_hidden_state"],
                "whisper_encoder, opset 13 (LayerNorm decomposed)", opset=13, second_path_of="whisper_encoder"),
    # --- the ctest smoke test's model (not in the default suite)
    Spec("smoke_cnn", "classification", _SmokeMake(), [Input("input", ("B", 3, 16, 16))], ["logits"],
         batches=(1, 8), dynamic={"input": {0: "batch"}, "logits": {0: "batch"}}, note="tiny test model", smoke=True),
]

BY_NAME = {s.name: s for s in SPECS}


def default_names():
    return [s.name for s in SPECS if not s.smoke]
