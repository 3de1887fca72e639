#!/bin/bash
# Device run 3 of s7/cudnn: the CUDA unit tests and memcheck again (the fused-conv test's case had a
# host-side bug in run 2), and inception_v3's compare in full.
set -u
G=.gpu-cudnn
L=$OUT
(timeout 100 python3 - <<'PY' >$L/export.txt 2>&1
import torch, torchvision
m = torchvision.models.inception_v3(weights=None, init_weights=True).eval()
torch.onnx.export(m, torch.randn(1, 3, 299, 299), "/tmp/inception_v3.onnx", input_names=["input"],
                  output_names=["output"], dynamic_axes={"input": {0: "N"}, "output": {0: "N"}}, opset_version=17,
                  dynamo=False)
print("exported")
PY
) &
exp=$!
bash $G/cnn.sh $G/b.tar.xz $L
echo "cnn.sh exit $?"
wait $exp
d=$(mktemp -d); tar -C $d -xJf $G/b.tar.xz
export LD_LIBRARY_PATH=$d/lib
(
  set -x
  timeout 60 $d/bin/kiln build /tmp/inception_v3.onnx --device cuda --shapes input:1x3x299x299 -o /tmp/i.kiln
  timeout 60 $d/bin/kiln compare /tmp/inception_v3.onnx --engine /tmp/i.kiln --random-inputs --shapes input:1x3x299x299
  timeout 60 $d/bin/kiln compare /tmp/inception_v3.onnx --random-inputs --shapes input:1x3x299x299
) >$L/inception_v3.txt 2>&1
grep -E "PASS|FAIL|err" $L/inception_v3.txt
