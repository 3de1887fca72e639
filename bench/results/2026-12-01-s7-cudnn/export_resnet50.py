# torchvision's resnet50 (random weights: the GPU machine has no network) as ONNX, input "input"
# [N, 3, 224, 224] with a dynamic N, like bench/out/models/resnet50.onnx.
import sys
import torch
import torchvision

m = torchvision.models.resnet50().eval()
x = torch.randn(1, 3, 224, 224)
kw = dict(input_names=["input"], output_names=["output"], dynamic_axes={"input": {0: "N"}, "output": {0: "N"}},
          opset_version=17)
try:
    torch.onnx.export(m, x, sys.argv[1], dynamo=False, **kw)
except TypeError:
    torch.onnx.export(m, x, sys.argv[1], **kw)
print("exported", sys.argv[1])
