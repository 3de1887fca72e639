"""Small ONNX models for the Python tests and bench/python_overhead.py, with numpy references."""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def save(model, path):
    onnx.save(model, str(path))
    return str(path)


def _model(nodes, inputs, outputs, inits=(), opset=OPSET, domains=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    m = helper.make_model(g, opset_imports=ops, producer_name="kiln python tests")
    m.ir_version = 8
    return m


def weights(seed=0, k=64, n=32):
    r = np.random.default_rng(seed)
    return (r.standard_normal((k, n)).astype(np.float32) / np.sqrt(k), r.standard_normal(n).astype(np.float32))


def mlp(k=64, n=32):
    """y = relu(x @ W + b), x [batch, k] (batch symbolic)."""
    w, b = weights(0, k, n)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="matmul"),
             helper.make_node("Add", ["h", "b"], ["hb"], name="bias"),
             helper.make_node("Relu", ["hb"], ["y"], name="relu")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", k])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", n])],
                  [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")])


def mlp_reference(x, k=64, n=32):
    w, b = weights(0, k, n)
    return np.maximum(x @ w + b, 0)


def tiny():
    """y = x + 1 on [1, 4]: the Python overhead benchmark's model."""
    one = numpy_helper.from_array(np.ones(4, np.float32), "one")
    return _model([helper.make_node("Add", ["x", "one"], ["y"], name="add")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [one])


def two_inputs():
    """sum = a + b (float), idx = argmax(a) (int64), for names, dtypes and output order."""
    nodes = [helper.make_node("Add", ["a", "b"], ["sum"], name="add"),
             helper.make_node("ArgMax", ["a"], ["idx"], name="argmax", axis=1, keepdims=0)]
    return _model(nodes, [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 8]),
                          helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 8])],
                  [helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["n", 8]),
                   helper.make_tensor_value_info("idx", TensorProto.INT64, ["n"])])


def passthrough():
    """Outputs x itself and y = x + 1: the engine's output x is its input (zero-copy in and out is
    observable)."""
    one = numpy_helper.from_array(np.ones(64, np.float32), "one")
    return _model([helper.make_node("Add", ["x", "one"], ["y"], name="add")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64]),
                   helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])], [one])


def matmul_chain(size=512, depth=8):
    """depth MatMul+Tanh layers of size x size: a compute-heavy model (2*size^3*depth FLOPs a run)."""
    r = np.random.default_rng(1)
    nodes, inits, prev = [], [], "x"
    for i in range(depth):
        w = (r.standard_normal((size, size)) / np.sqrt(size)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, "W%d" % i))
        nodes.append(helper.make_node("MatMul", [prev, "W%d" % i], ["m%d" % i], name="mm%d" % i))
        nodes.append(helper.make_node("Tanh", ["m%d" % i], ["t%d" % i], name="tanh%d" % i))
        prev = "t%d" % i
    nodes.append(helper.make_node("Identity", [prev], ["y"], name="out"))
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [size, size])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size, size])], inits)


def custom_op():
    """An op kiln does not have (domain my.domain): UnsupportedError at build."""
    return _model([helper.make_node("MyOp", ["x"], ["y"], name="my_op", domain="my.domain")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])], domains=["my.domain"])
