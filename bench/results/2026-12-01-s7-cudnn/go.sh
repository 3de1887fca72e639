#!/bin/bash
# Device run of s7/cudnn: models exported there (resnet50 + the suite's CNN classifiers), then
# bench/gpu/cnn.sh (tests, memcheck, resnet50/mobilenet_v2), then the suite census.
set -u
G=.gpu-cudnn
L=$OUT
mkdir -p /tmp/suite
(timeout 200 python3 $G/export_suite.py /tmp/suite >/tmp/suite/exported.txt 2>/tmp/suite/export_err.txt) &
exp=$!
timeout 90 python3 $G/export_resnet50.py /tmp/resnet50.onnx >$L/export.txt 2>&1 || tail -5 $L/export.txt
bash $G/cnn.sh $G/b.tar.xz $L /tmp/resnet50.onnx $G/mobilenet_v2.onnx
echo "cnn.sh exit $?"
wait $exp
cat /tmp/suite/exported.txt >>$L/export.txt
tail -5 /tmp/suite/export_err.txt >>$L/export.txt
d=$(mktemp -d); tar -C $d -xJf $G/b.tar.xz
export LD_LIBRARY_PATH=$d/lib
bash $G/census.sh $d/bin /tmp/suite 2>&1 | tee $L/census.txt
