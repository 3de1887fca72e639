#!/usr/bin/env bash
# `pip install .` in a fresh virtual environment (--system-site-packages, for Debian's numpy) from a
# clean clone of the repository's HEAD, offline (--no-index), with and without build isolation. The
# extension this build tree made is installed (KILN_PREBUILT_EXTENSION: setup.py's other path builds
# the whole library with CMake, minutes on 2 cores). Then kiln is imported outside the source tree and
# runs a model through both APIs.
#   python/tests/pip_install.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
src=$1 build=$2 work=$3
ext=$(ls "$build"/python/kiln/_kiln*.so | head -n 1)
rm -rf "$work"
mkdir -p "$work"
git clone -q --depth 1 "file://$src" "$work/src"
for mode in isolated no-isolation; do
  venv="$work/venv-$mode"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  flags=(--no-index --quiet)
  [ "$mode" = no-isolation ] && flags+=(--no-build-isolation)
  (cd "$work/src" && KILN_PREBUILT_EXTENSION="$ext" "$venv/bin/python" -m pip install "${flags[@]}" .)
  (cd "$work" && KILN_CACHE_DIR="$work/cache" "$venv/bin/python" - "$work" <<'PY'
import os, sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import kiln
assert os.path.dirname(kiln.__file__).startswith(sys.prefix), kiln.__file__  # the installed copy
assert os.path.exists(os.path.join(os.path.dirname(kiln.__file__), "__init__.pyi"))
g = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
                      [numpy_helper.from_array(np.full(3, 2, np.float32), "two")])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 8
path = os.path.join(sys.argv[1], "mul.onnx")
onnx.save(m, path)
x = np.arange(6, dtype=np.float32).reshape(2, 3)
y = kiln.build(path).create_context().run({"x": x})["y"]
assert np.array_equal(y, 2 * x), y
import kiln as onnxruntime
sess = onnxruntime.InferenceSession(path)
assert sess.get_inputs()[0].shape == ["n", 3]
assert np.array_equal(sess.run(None, {sess.get_inputs()[0].name: x})[0], 2 * x)
# A Python custom op (kiln/custom_op.py is installed with the package).
kiln.custom_op("pip.domain", "Half")(lambda x: x / 2)
g = helper.make_graph([helper.make_node("Half", ["x"], ["y"], domain="pip.domain")], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("pip.domain", 1)])
m.ir_version = 8
assert np.array_equal(kiln.build(m.SerializeToString()).create_context().run({"x": x})["y"], x / 2)
print("pip install: kiln", kiln.__version__, "from", os.path.dirname(kiln.__file__), "OK")
PY
  )
done
