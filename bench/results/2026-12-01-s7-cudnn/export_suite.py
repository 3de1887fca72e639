# torchvision's CNN classifiers of the suite (random weights: no network on the GPU machine) as ONNX
# opset 17, input "input" [N, 3, S, S] with a dynamic N, into DIR/NAME.onnx, several at once.
import sys
from concurrent.futures import ProcessPoolExecutor

MODELS = {"alexnet": 224, "convnext_tiny": 224, "densenet121": 224, "efficientnet_b0": 224, "googlenet": 224,
          "inception_v3": 299, "mnasnet1_0": 224, "mobilenet_v3_large": 224, "mobilenet_v3_small": 224,
          "regnet_x_400mf": 224, "regnet_y_400mf": 224, "resnet18": 224, "resnext50_32x4d": 224,
          "shufflenet_v2_x1_0": 224, "squeezenet1_0": 224, "squeezenet1_1": 224, "vgg11": 224}


def export(name):
    import torch
    import torchvision
    torch.set_num_threads(2)
    kw = {"init_weights": True} if name in ("googlenet", "inception_v3") else {}
    m = getattr(torchvision.models, name)(weights=None, **kw).eval()
    s = MODELS[name]
    out = f"{sys.argv[1]}/{name}.onnx"
    try:
        torch.onnx.export(m, torch.randn(1, 3, s, s), out, input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "N"}, "output": {0: "N"}}, opset_version=17, dynamo=False)
        return f"{name} {s}"
    except Exception as e:  # noqa: BLE001 - reported, the others go on
        return f"FAILED {name}: {e}"


if __name__ == "__main__":
    with ProcessPoolExecutor(8) as ex:
        for r in ex.map(export, MODELS):
            print(r, flush=True)
