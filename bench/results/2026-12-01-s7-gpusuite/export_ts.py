# bench/suite/export.py with torch.onnx.export's TorchScript path (dynamo=False), as the suite's files were
# made (torch 2.11 defaults to the torch.export path, whose graphs differ).
import runpy
import sys

import torch

_export = torch.onnx.export


def export(*a, **k):
    k.setdefault("dynamo", False)
    return _export(*a, **k)


torch.onnx.export = export
sys.argv = ["bench/suite/export.py"] + sys.argv[1:]
sys.path.insert(0, "bench/suite")
runpy.run_path("bench/suite/export.py", run_name="__main__")
