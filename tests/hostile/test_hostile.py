#!/usr/bin/env python3
"""Hostile inputs (issue 15): generated hostile models, engines, input files and command lines, each run
under a time limit and an address-space limit, asserting the exact exit code (kiln's error category,
README "Exit codes") and a fragment of the message. None may crash, hang, or exit 0 with a wrong answer.

usage: test_hostile.py KILN WORKDIR [CASE-SUBSTRING...]

Cases listed in EXPECTED_FAILURES fail today because their fix belongs to another part of issue 15 (the
'files' work: confined file access, checked sizes, bounded JSON). They are run and must still fail
(with a reason printed); one that passes is an error, so the list is flipped when the fix lands.
"""
import os
import resource
import shutil
import stat
import struct
import subprocess
import sys
import time
import zipfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

KILN, WORK = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
ONLY = sys.argv[3:]
TIMEOUT_S = 60  # per case
HANG_TIMEOUT_S = 10  # per expected failure (some hang or copy 4 GiB today): keeps the suite fast; a fix answers in time
AS_LIMIT = 8 << 30  # bytes of address space per kiln process

# name -> why it fails today (the part of issue 15 that fixes it).
EXPECTED_FAILURES = {}

shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)


def path(name):
    return os.path.join(WORK, name)


def save_model(nodes, inputs, outputs, name, inits=(), opset=13, **kw):
    g = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="kiln-hostile")
    m.ir_version = 8
    onnx.save(m, path(name + ".onnx"), **kw)
    return path(name + ".onnx")


def vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL

# ---- models

add2 = save_model([helper.make_node("Add", ["a", "b"], ["y"])], [vi("a", F, [2, 3]), vi("b", F, [2, 3])],
                  [vi("y", F, [2, 3])], "add2")
np.save(path("a.npy"), np.ones((2, 3), np.float32))
np.savez(path("only_a.npz"), a=np.ones((2, 3), np.float32))
np.savez(path("a_and_c.npz"), a=np.ones((2, 3), np.float32), c=np.ones((2, 3), np.float32))
np.savez(path("ab.npz"), a=np.ones((2, 3), np.float32), b=np.full((2, 3), 2, np.float32))
dyn = save_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", F, ["n", 3])], [vi("y", F, ["n", 3])], "dyn")

# An embedding lookup over 5 rows: random int64 ids default to 0..9, so only --input-range keeps them in range.
emb = save_model([helper.make_node("Gather", ["table", "ids"], ["y"])], [vi("ids", I64, [1, 4])],
                 [vi("y", F, [1, 4, 2])], "embedding", [const("table", np.arange(10, dtype=np.float32).reshape(5, 2))])


# Loop with M = 10^18 and a trivial body: only a deadline stops it.
body = helper.make_graph(
    [helper.make_node("Identity", ["c"], ["c_out"]), helper.make_node("Identity", ["v"], ["v_out"])], "forever_body",
    [vi("i", I64, []), vi("c", B, []), vi("v", F, [1])], [vi("c_out", B, []), vi("v_out", F, [1])])
forever = save_model([helper.make_node("Loop", ["M", "", "x"], ["y"], body=body)], [vi("x", F, [1])], [vi("y", F, [1])],
                     "loop_forever", [const("M", np.array(10**18, np.int64))])


def nested_loops(depth):
    """depth Loops, each the body of the one above; the outermost runs 3 times, the others once; the innermost
    body adds 1: y = x + 3."""
    def body_at(level):  # the body of the Loop at `level` (0: outermost)
        s = str(level)
        ins = [vi("i" + s, I64, []), vi("c" + s, B, []), vi("v" + s, F, [1])]
        outs = [vi("co" + s, B, []), vi("vo" + s, F, [1])]
        nodes = [helper.make_node("Identity", ["c" + s], ["co" + s])]
        if level == depth - 1:
            nodes += [helper.make_node("Constant", [], ["one" + s], value=const("one" + s, np.ones(1, np.float32))),
                      helper.make_node("Add", ["v" + s, "one" + s], ["vo" + s])]
        else:
            nodes += [helper.make_node("Constant", [], ["m" + s], value=const("m" + s, np.array(1, np.int64))),
                      helper.make_node("Loop", ["m" + s, "", "v" + s], ["vo" + s], body=body_at(level + 1))]
        return helper.make_graph(nodes, "body" + s, ins, outs)
    return save_model([helper.make_node("Loop", ["M", "", "x"], ["y"], body=body_at(0))], [vi("x", F, [1])],
                      [vi("y", F, [1])], "nested_loops_%d" % depth, [const("M", np.array(3, np.int64))])


nested60 = nested_loops(60)


def nested_ifs(depth):
    """If inside the then-branch of an If, `depth` deep (protobuf nests ~4 messages a level)."""
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["o%d" % depth])], "leaf", [], [vi("o%d" % depth, F, [1])])
    for d in range(depth - 1, -1, -1):
        e = helper.make_graph([helper.make_node("Identity", ["x"], ["e%d" % d])], "e%d" % d, [], [vi("e%d" % d, F, [1])])
        g = helper.make_graph([helper.make_node("If", ["c"], ["o%d" % d], then_branch=g, else_branch=e)], "g%d" % d, [],
                              [vi("o%d" % d, F, [1])])
    return save_model(list(g.node), [vi("c", B, []), vi("x", F, [1])], [vi("o0", F, [1])], "nested_ifs_%d" % depth)


nested_if200 = nested_ifs(200)


def deep_ifs_bytes(depth):
    """The wire bytes of a model with `depth` Ifs, each the then_branch of the one above (3 protobuf levels
    each: GraphProto -> NodeProto -> AttributeProto), written directly: onnx's helpers take minutes this deep."""
    def varint(v):
        out = b""
        while True:
            out += bytes([(v & 0x7f) | (0x80 if v > 0x7f else 0)])
            v >>= 7
            if not v:
                return out

    def field(num, payload):
        return varint(num << 3 | 2) + varint(len(payload)) + payload

    graph = b""
    for _ in range(depth):
        attr = field(1, b"then_branch") + field(6, graph) + varint(20 << 3) + varint(5)  # type GRAPH
        graph = field(1, field(4, b"If") + field(5, attr))
    return varint(1 << 3) + varint(8) + field(7, graph) + field(8, varint(2 << 3) + varint(13))


with open(path("nested_ifs_700.onnx"), "wb") as f:  # 2101 levels: past the 2000 protobuf parses to tell depth
    f.write(deep_ifs_bytes(700))
with open(path("nested_ifs_700_cut.onnx"), "wb") as f:  # the same, truncated: corrupt, whatever its depth
    f.write(deep_ifs_bytes(700)[:-100])
expand_overflow = save_model([helper.make_node("Expand", ["x", "s"], ["y"])], [vi("x", F, [1, 1])], [vi("y", F, None)],
                             "expand_overflow", [const("s", np.array([1 << 62, 4], np.int64))])
np.save(path("zero1.npy"), np.zeros(1, np.float32))


def resize_model(name, scales):
    return save_model([helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")], [vi("x", F, [1, 1, 256, 2])],
                      [vi("y", F, None)], name, [const("scales", np.array(scales, np.float32))])


resize_nan = resize_model("resize_nan", [1, 1, float("nan"), 1])
resize_neg = resize_model("resize_negative", [1, 1, -2, 1])
resize_huge = resize_model("resize_2pow33", [1, 1, 2.0**33, 1])
reshape_bad = save_model([helper.make_node("Reshape", ["x", "shape"], ["y"])], [vi("x", F, [2, 3])], [vi("y", F, None)],
                         "reshape_count", [const("shape", np.array([4, 2], np.int64))])
cumsum_bad = save_model([helper.make_node("CumSum", ["x", "axis"], ["y"])], [vi("x", F, [2, 3])], [vi("y", F, None)],
                        "cumsum_axis", [const("axis", np.array(5, np.int64))])
gather_bad = save_model([helper.make_node("Gather", ["x", "idx"], ["y"], axis=1)], [vi("x", F, [2, 3])],
                        [vi("y", F, None)], "gather_index", [const("idx", np.array([0, 3], np.int64))])
scatter_el_bad = save_model([helper.make_node("ScatterElements", ["x", "idx", "upd"], ["y"], axis=1)],
                            [vi("x", F, [2, 3]), vi("upd", F, [2, 2])], [vi("y", F, None)], "scatter_elements_index",
                            [const("idx", np.array([[0, 1], [2, -4]], np.int64))])
scatter_nd_bad = save_model([helper.make_node("ScatterND", ["x", "idx", "upd"], ["y"])],
                            [vi("x", F, [2, 3]), vi("upd", F, [2])], [vi("y", F, None)], "scatter_nd_index",
                            [const("idx", np.array([[1, 2], [0, 3]], np.int64))])
H, In = 3, 2
lstm_bad = save_model(
    [helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=4)], [vi("x", F, [1, 1, In])], [vi("y", F, None)],
    "lstm_hidden", [const("W", np.zeros((1, 4 * H, In), np.float32)), const("R", np.zeros((1, 4 * H, H), np.float32))])
dft_bad = save_model([helper.make_node("DFT", ["x", "len"], ["y"])], [vi("x", F, [1, 4, 1])], [vi("y", F, None)],
                     "dft_length0", [const("len", np.array(0, np.int64))], opset=17)
bn_bad = save_model(
    [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])], [vi("x", F, [1, 3, 2, 2])],
    [vi("y", F, [1, 3, 2, 2])], "batchnorm_scale1",
    [const("s", np.ones(1, np.float32))] + [const(n, np.ones(3, np.float32)) for n in ("b", "m", "v")])
# Conv + BatchNormalization: fold_batch_norm would broadcast the length-1 scale if the build let it through.
bn_conv = save_model(
    [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"])],
    [vi("x", F, [1, 3, 4, 4])], [vi("y", F, None)], "conv_batchnorm_scale1",
    [const("w", np.ones((3, 3, 1, 1), np.float32)), const("s", np.ones(1, np.float32))] +
    [const(n, np.ones(3, np.float32)) for n in ("b", "m", "v")])
branch2 = helper.make_graph([helper.make_node("Identity", ["x"], ["o1"]), helper.make_node("Identity", ["x"], ["o2"])],
                            "two_outputs", [], [vi("o1", F, [1]), vi("o2", F, [1])])
if_more = save_model([helper.make_node("If", ["cond"], ["y"], then_branch=branch2, else_branch=branch2)],
                     [vi("cond", B, []), vi("x", F, [1])], [vi("y", F, [1])], "if_branch_more_outputs")

# Ops whose kernel refuses what a build used to accept (the engine then failed at run, or fused it away).
N = helper.make_node
x4 = [vi("x", F, [1, 3, 4, 4])]
agree = [  # (name, model, fragment of the kernel's message)
    ("conv_bias_length", save_model([N("Conv", ["x", "w", "b"], ["y"])], x4, [vi("y", F, None)], "conv_bias",
                                    [const("w", np.ones((4, 3, 3, 3), np.float32)), const("b", np.ones(2, np.float32))]),
     "bias B float32[2] must be 1-D of 4 elements"),
    ("gemm_bias_broadcast", save_model([N("Gemm", ["x", "w", "b"], ["y"], transB=1)], [vi("x", F, [2, 8])],
                                       [vi("y", F, None)], "gemm_bias",
                                       [const("w", np.ones((4, 8), np.float32)), const("b", np.ones(3, np.float32))]),
     "C float32[3] cannot be broadcast to the output [2,4]"),
    ("layernorm_scale", save_model([N("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1)], [vi("x", F, [2, 8])],
                                   [vi("y", F, None)], "layernorm_scale",
                                   [const("s", np.ones(3, np.float32)), const("b", np.ones(8, np.float32))], opset=17),
     "Scale float32[3] cannot be broadcast to [8]"),
    ("instancenorm_scale", save_model([N("InstanceNormalization", ["x", "s", "b"], ["y"])], x4, [vi("y", F, None)],
                                      "instancenorm_scale",
                                      [const("s", np.ones(1, np.float32)), const("b", np.ones(3, np.float32))]),
     "scale and bias must have 3 (channels) elements"),
    ("groupnorm_groups", save_model([N("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)], x4,
                                    [vi("y", F, None)], "groupnorm_groups",
                                    [const("s", np.ones(3, np.float32)), const("b", np.ones(3, np.float32))], opset=21),
     "num_groups 2 must be positive and divide the channel count 3"),
    ("prelu_slope", save_model([N("PRelu", ["x", "s"], ["y"])], x4, [vi("y", F, None)], "prelu_slope",
                               [const("s", np.ones(2, np.float32))]), "slope [2] does not broadcast onto X [1,3,4,4]"),
    ("lrn_size_0", save_model([N("LRN", ["x"], ["y"], size=0)], x4, [vi("y", F, None)], "lrn_size0"),
     "size must be positive, got 0"),
    ("matmul_batch_broadcast", save_model([N("MatMul", ["x", "w"], ["y"])], [vi("x", F, [2, 3, 4])], [vi("y", F, None)],
                                          "matmul_batch", [const("w", np.ones((5, 4, 2), np.float32))]),
     "cannot be broadcast (dim 0: 2 vs 5)"),
    ("range_delta_0", save_model([N("Range", ["s", "l", "d"], ["y"])], [], [vi("y", F, None)], "range_delta0",
                                 [const("s", np.float32(0)), const("l", np.float32(5)), const("d", np.float32(0))]),
     "invalid range: start 0, limit 5, delta 0"),
    ("onehot_depth_0", save_model([N("OneHot", ["i", "d", "v"], ["y"])], [vi("i", I64, [3])], [vi("y", F, None)],
                                  "onehot_depth0", [const("d", np.array([0], np.int64)), const("v", np.array([0, 1], np.float32))]),
     "depth must be a positive number, got 0"),
]

# ---- files

with open(path("garbage.kiln"), "wb") as f:
    f.write(os.urandom(4096))
with open(path("truncated.onnx"), "wb") as f:
    f.write(open(add2, "rb").read()[:40])
with open(path("sparse4g.kiln"), "wb") as f:  # a 4 GiB sparse file: must be refused by its magic, not read
    f.truncate(4 << 30)


def crc32c(data):
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    c = 0xFFFFFFFF
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


header = b"[" * 100000 + b"]" * 100000
with open(path("deep_header.kiln"), "wb") as f:  # a valid preamble and checksums, then a 100,000-deep JSON header
    pad = b"\0" * (-(32 + len(header)) % 64)  # the body checksum covers the padding after the header
    f.write(b"KILNENG\0" + struct.pack("<IIQII", 3, len(header), 0, crc32c(header), crc32c(pad)) + header + pad)
with open(path("deep_cache.json"), "w") as f:
    f.write("[" * 100000 + "]" * 100000)


def npy_bytes(descr, shape, data=b""):
    hdr = ("{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)).encode()
    hdr += b" " * (63 - (10 + len(hdr)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr + data


with open(path("huge.npy"), "wb") as f:  # declares 10^12 float32 elements, holds none
    f.write(npy_bytes("<f4", "(1000000000000,)"))
with open(path("overflow.npy"), "wb") as f:  # element count overflows int64
    f.write(npy_bytes("<f4", "(6148914691236517206, 3)"))
with zipfile.ZipFile(path("bomb.npz"), "w", zipfile.ZIP_DEFLATED) as z:  # a small member that declares 10^12 elements
    z.writestr("a.npy", npy_bytes("<f4", "(1000000000000,)", b"\0" * (1 << 20)))

with open(path("secret.bin"), "wb") as f:  # outside every model folder below
    f.write(b"\x01" * 24)
os.makedirs(path("ext"), exist_ok=True)
ext_model = onnx.load(add2)  # add2 with b an external-data initializer that is a symlink out of the folder
bt = numpy_helper.from_array(np.zeros((2, 3), np.float32), "b")
bt.ClearField("raw_data")
bt.data_location = TensorProto.EXTERNAL
bt.external_data.add(key="location", value="b.bin")
ext_model.graph.initializer.append(bt)
onnx.save(ext_model, path("ext/model.onnx"))
if not os.path.lexists(path("ext/b.bin")):
    os.symlink(path("secret.bin"), path("ext/b.bin"))  # 24 bytes: exactly b's size, so today it "works"
os.makedirs(path("ext_dir/data"), exist_ok=True)  # the same through a symlinked sub-folder
bt.external_data[0].value = "link/secret.bin"
ext_model.graph.initializer.pop()
ext_model.graph.initializer.append(bt)
onnx.save(ext_model, path("ext_dir/model.onnx"))
if not os.path.lexists(path("ext_dir/link")):
    os.symlink(path(""), path("ext_dir/link"))
os.makedirs(path("ext_is_dir/b.bin"), exist_ok=True)
bt.external_data[0].value = "b.bin"
ext_model.graph.initializer.pop()
ext_model.graph.initializer.append(bt)
onnx.save(ext_model, path("ext_is_dir/model.onnx"))
if not os.path.exists(path("fifo.npy")):
    os.mkfifo(path("fifo.npy"))

# Sparse initializer whose indices tensor is shorter than its values.
sp_model = onnx.load(add2)
sp_model.graph.sparse_initializer.append(helper.make_sparse_tensor(
    numpy_helper.from_array(np.ones(4, np.float32), "b"), numpy_helper.from_array(np.array([0], np.int64), ""), [2, 3]))
onnx.save(sp_model, path("sparse_short.onnx"))

with open(path("garbage.pb"), "wb") as f:
    f.write(b"\xff" * 64)
os.makedirs(path("in_dir"), exist_ok=True)  # a directory of inputs with a file that names no input
np.save(path("in_dir/a.npy"), np.ones((2, 3), np.float32))
np.save(path("in_dir/zz.npy"), np.ones((2, 3), np.float32))
os.makedirs(path("bundle_bad"), exist_ok=True)
with open(path("bundle_bad/bundle.json"), "w") as f:
    f.write('{"options": {"model": 7, "seed": "x"}}')  # fields of the wrong JSON type
out_is_file = path("out_is_file")
with open(out_is_file, "w") as f:
    f.write("not a directory")

# ---- cases: (name, argv, exit code, fragment of stdout+stderr[, timeout])
OK, MISMATCH, USAGE, INVALID, UNSUPPORTED, INTERNAL, DEADLINE = 0, 1, 2, 3, 4, 5, 6
cases = [
    # no guessing
    ("missing_input_npz", ["run", add2, "--inputs", path("only_a.npz")], INVALID, "input 'b' float32[2,3] not given"),
    ("missing_input_lists_model_inputs", ["run", add2, "--input", "a=" + path("a.npy")], INVALID,
     "the model's inputs are a float32[2,3], b float32[2,3]"),
    ("npz_names_unknown_input", ["run", add2, "--inputs", path("a_and_c.npz")], INVALID,
     "has 'c', which is not an input of the model"),
    ("input_flag_unknown_name", ["run", add2, "--input", "zz=" + path("a.npy")], INVALID, "'zz' is not an input"),
    ("random_inputs_when_asked", ["run", add2, "--inputs", path("only_a.npz"), "--random-inputs"], OK,
     "kiln: note: random inputs (seed 0): b [2,3]"),
    ("random_inputs_announced", ["run", add2], OK, "random inputs (seed 0): a [2,3] float32 [-1, 1], b"),
    ("compare_missing_input", ["compare", add2, "--inputs", path("only_a.npz")], INVALID, "input 'b' float32[2,3] not given"),
    ("bench_missing_input", ["bench", add2, "--inputs", path("only_a.npz"), "--iterations", "1", "--duration", "0",
                             "--warmup-ms", "0"], INVALID, "input 'b' float32[2,3] not given"),
    ("bench_loads_inputs", ["bench", add2, "--inputs", path("ab.npz"), "--iterations", "2", "--duration", "0",
                            "--warmup-ms", "0"], OK, "[kiln bench] input a [2,3]"),
    ("bench_random_ids_out_of_table", ["bench", emb, "--iterations", "1", "--duration", "0", "--warmup-ms", "0"],
     INVALID, "out of range"),
    ("bench_input_range_keeps_ids_in_table", ["bench", emb, "--input-range", "ids:0,4", "--iterations", "2",
                                              "--duration", "0", "--warmup-ms", "0"], OK, "ids [1,4] int64 0..4"),
    ("run_input_range", ["run", emb, "--input-range", "ids:0,4"], OK, "ids [1,4] int64 0..4"),
    ("input_range_reversed", ["run", emb, "--input-range", "ids:4,0"], INVALID, "need finite numbers LO <= HI"),
    ("input_range_nan", ["run", emb, "--input-range", "ids:nan,4"], INVALID, "need finite numbers LO <= HI"),
    ("input_range_on_file_input", ["run", add2, "--inputs", path("ab.npz"), "--input-range", "a:0,1"], INVALID,
     "is given from a file"),
    # command-line sizes and counts
    ("shapes_dim_too_large", ["run", dyn, "--shapes", "x:99999999999999999999x3"], INVALID, "is too large"),
    ("shapes_numel_overflow", ["run", dyn, "--shapes", "x:4294967296x4294967296x3"], INVALID,
     "shape [4294967296,4294967296,3] has more elements than fit in 64 bits"),
    ("shapes_bytes_overflow", ["run", dyn, "--shapes", "x:1152921504606846976x3"], INVALID,
     "more than a 64-bit byte size holds"),
    ("shapes_not_a_number", ["run", dyn, "--shapes", "x:1x-3"], INVALID, "is not a dimension"),
    ("shapes_unknown_input", ["run", dyn, "--shapes", "nope:1x3"], INVALID, "'nope' is not an input"),
    ("shapes_too_big_for_memory", ["run", dyn, "--shapes", "x:100000000000x3"], INVALID,
     "more than half of this machine's memory"),
    ("profile_dim_overflow", ["build", dyn, "-o", path("p.kiln"), "--profile", "x:1x3/99999999999999999999x3/1x3"],
     INVALID, "is too large"),
    ("min_shapes_numel_overflow", ["build", dyn, "-o", path("p.kiln"), "--min-shapes", "x:1x3", "--opt-shapes", "x:1x3",
                                   "--max-shapes", "x:4294967296x4294967296x3"], INVALID, "more elements than fit in 64 bits"),
    ("bench_streams_100000", ["bench", add2, "--streams", "100000"], USAGE, "out of range: 1 to 256"),
    ("bench_iterations_0", ["bench", add2, "--iterations", "0"], USAGE, "out of range"),
    ("bench_iterations_not_int", ["bench", add2, "--iterations", "1e30"], USAGE, "--iterations"),
    ("bench_duration_nan", ["bench", add2, "--duration", "nan"], USAGE, "not a finite number"),
    ("bench_warmup_ms_inf", ["bench", add2, "--warmup-ms", "inf"], USAGE, "not a finite number"),
    ("bench_warmup_negative", ["bench", add2, "--warmup", "-1"], USAGE, "out of range"),
    ("bench_batch_negative", ["bench", dyn, "--batch", "-3"], USAGE, "out of range"),
    ("bench_batch_too_big_for_memory", ["bench", dyn, "--batch", "1000000000", "--iterations", "1", "--duration", "0"],
     INVALID, "random input 'x' of shape [1000000000,3]"),
    ("threads_100000", ["run", add2, "--threads", "100000"], USAGE, "out of range: 1 to 1024"),
    ("threads_negative", ["run", add2, "--threads", "-5"], USAGE, "out of range"),
    ("deadline_negative", ["run", add2, "--deadline", "-1"], USAGE, "out of range"),
    ("deadline_nan", ["run", add2, "--deadline", "nan"], USAGE, "not a finite number"),
    ("shapes_empty_dims", ["run", dyn, "--shapes", "x:1xx3"], INVALID, "is not a dimension"),
    ("shapes_no_name", ["run", dyn, "--shapes", ":1x3"], INVALID, "must look like NAME:1x3x224x224"),
    ("shapes_plus_sign", ["run", dyn, "--shapes", "x:+1x3"], INVALID, "is not a dimension"),
    ("input_pb_garbage", ["run", add2, "--input", "a=" + path("garbage.pb"), "--input", "b=" + path("a.npy")], INVALID,
     "garbage.pb"),
    ("inputs_dir_names_no_input", ["run", add2, "--inputs", path("in_dir")], INVALID, "zz.npy' names no input"),
    ("save_outputs_into_missing_dir", ["run", add2, "--save-outputs", path("no/such/dir/o.npz")], INVALID,
     "no/such/dir/o.npz"),
    ("replay_without_bundle", ["compare", "--replay", path("in_dir")], INVALID, "bundle.json' not found"),
    ("replay_bundle_wrong_types", ["compare", "--replay", path("bundle_bad")], INVALID, "malformed JSON"),
    ("output_dir_is_a_file", ["run", add2, "--output-dir", out_is_file], INVALID, "exists and is not a directory"),
    ("missing_model_file", ["run", path("nope.onnx")], INVALID, "nope.onnx"),
    # bounded execution
    ("loop_1e18_run_deadline", ["run", forever, "--deadline", "1"], DEADLINE,
     "the run passed its deadline"),
    ("loop_1e18_bench_deadline", ["bench", forever, "--deadline", "1", "--warmup", "0", "--warmup-ms", "0",
                                  "--iterations", "1", "--duration", "0"], DEADLINE, "the run passed its deadline"),
    ("loop_1e18_compare_engine_deadline", ["compare", forever, "--deadline", "1"], DEADLINE, "deadline exceeded"),
    ("nested_loops_60_run", ["run", nested60, "--input", "x=" + path("zero1.npy")], OK, "min 3 max 3 mean 3"),
    ("nested_ifs_200", ["run", nested_if200], INVALID, "nests messages deeper than 200 protobuf levels"),
    ("nested_ifs_700", ["run", path("nested_ifs_700.onnx")], INVALID,
     "nests messages deeper than 200 protobuf levels (subgraphs inside subgraphs, about 3 levels per If/Loop/Scan), "
     "the limit kiln accepts (2101 levels)"),
    ("nested_ifs_700_truncated", ["run", path("nested_ifs_700_cut.onnx")], INVALID,
     "the protobuf could not be parsed (truncated or corrupted file)"),
    ("expand_shape_overflows_int64_build", ["build", expand_overflow, "-o", path("r.kiln")], INVALID,
     "the element count of shape [4611686018427387904,4] overflows int64"),
    ("nested_loops_60_build", ["build", nested60, "-o", path("nested60.kiln")], OK, "[kiln build] wrote"),
    # build validates what run validates (the same message both ways)
    ("resize_scales_nan_build", ["build", resize_nan, "-o", path("r.kiln")], INVALID, "scales value nan must be positive and finite"),
    ("resize_scales_nan_run", ["run", resize_nan], INVALID, "scales value nan must be positive and finite"),
    ("resize_scales_negative_build", ["build", resize_neg, "-o", path("r.kiln")], INVALID, "scales value -2 must be positive"),
    ("resize_scales_2pow33_build", ["build", resize_huge, "-o", path("r.kiln")], INVALID, "is out of range"),
    ("reshape_count_build", ["build", reshape_bad, "-o", path("r.kiln")], INVALID,
     "cannot reshape float32[2,3] (6 elements) to [4,2] (8 elements)"),
    ("reshape_count_run", ["run", reshape_bad], INVALID, "cannot reshape float32[2,3] (6 elements) to [4,2] (8 elements)"),
    ("cumsum_axis_build", ["build", cumsum_bad, "-o", path("r.kiln")], INVALID, "axis 5 is out of range for rank 2"),
    ("gather_constant_index_build", ["build", gather_bad, "-o", path("r.kiln")], INVALID,
     "indices[1] = 3 is out of range for a dim of size 3"),
    ("scatter_elements_constant_index_build", ["build", scatter_el_bad, "-o", path("r.kiln")], INVALID,
     "indices[3] = -4 is out of range for axis 1 of size 3"),
    ("scatter_elements_constant_index_run", ["run", scatter_el_bad], INVALID,
     "indices[3] = -4 is out of range for axis 1 of size 3"),
    ("scatter_nd_constant_index_build", ["build", scatter_nd_bad, "-o", path("r.kiln")], INVALID,
     "index 3 is out of range for dim 1 of data float32[2,3]"),
    ("scatter_nd_constant_index_run", ["run", scatter_nd_bad], INVALID,
     "index 3 is out of range for dim 1 of data float32[2,3]"),
    ("lstm_hidden_size_build", ["build", lstm_bad, "-o", path("r.kiln")], INVALID, "W float32[1,12,2] must be [1,16,2]"),
    ("lstm_hidden_size_run", ["run", lstm_bad], INVALID, "W float32[1,12,2] must be [1,16,2]"),
    ("dft_length_0_build", ["build", dft_bad, "-o", path("r.kiln")], INVALID, "dft_length must be in [1,"),
    ("batchnorm_scale1_build", ["build", bn_bad, "-o", path("r.kiln")], INVALID, "scale must have 3 elements (channels)"),
    ("batchnorm_scale1_run", ["run", bn_bad], INVALID, "scale must have 3 elements (channels)"),
    ("conv_batchnorm_scale1_build", ["build", bn_conv, "-o", path("r.kiln")], INVALID, "scale must have 3 elements"),
    ("if_branch_more_outputs", ["run", if_more], INVALID, "then_branch has 2 outputs, the node 1"),
] + [(name + "_" + cmd, [cmd, model] + (["-o", path("agree.kiln")] if cmd == "build" else []), INVALID, fragment)
      for name, model, fragment in agree for cmd in ("run", "build")] + [
    # files
    ("engine_random_bytes", ["run", path("garbage.kiln")], INVALID, "not a kiln engine file"),
    ("engine_4gib_sparse_file", ["run", path("sparse4g.kiln")], INVALID, "not a kiln engine file"),
    ("engine_header_deep_json", ["run", path("deep_header.kiln")], INVALID, "nests arrays/objects deeper than 64 levels"),
    ("model_truncated", ["run", path("truncated.onnx")], INVALID, "truncated.onnx"),
    ("npy_declares_1e12_elements", ["run", dyn, "--input", "x=" + path("huge.npy")], INVALID,
     "huge.npy': a float32 tensor of shape [1000000000000] would take 4000000000000 bytes"),
    ("npy_numel_overflow", ["run", dyn, "--input", "x=" + path("overflow.npy")], INVALID, "6148914691236517206"),
    ("npz_member_declares_1e12_elements", ["run", dyn, "--inputs", path("bomb.npz")], INVALID, "bomb.npz"),
    ("external_data_symlink_outside", ["run", path("ext/model.onnx"), "--input", "a=" + path("a.npy")], INVALID,
     "outside"),
    ("external_data_symlinked_dir", ["run", path("ext_dir/model.onnx"), "--input", "a=" + path("a.npy")], INVALID,
     "outside"),
    ("external_data_is_directory", ["run", path("ext_is_dir/model.onnx"), "--input", "a=" + path("a.npy")], INVALID,
     "directory"),
    ("input_is_fifo", ["run", dyn, "--input", "x=" + path("fifo.npy")], INVALID, "regular file"),
    ("sparse_indices_shorter_than_values", ["run", path("sparse_short.onnx"), "--input", "a=" + path("a.npy")],
     INVALID, "indices"),
    ("timing_cache_deep_json", ["build", add2, "-o", path("tc.kiln"), "--timing-cache", path("deep_cache.json")], OK,
     "corrupt"),
]


def limit_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
failures, expected, t_all = [], [], time.time()
for name, argv, want_rc, fragment, *rest in cases:
    if ONLY and not any(o in name for o in ONLY):
        continue
    xfail = EXPECTED_FAILURES.get(name)
    timeout = rest[0] if rest else (HANG_TIMEOUT_S if xfail else TIMEOUT_S)
    t0 = time.time()
    try:
        r = subprocess.run([KILN, *argv], capture_output=True, text=True, errors="replace", timeout=timeout, env=env,
                           preexec_fn=limit_address_space, cwd=WORK)
        rc, log = r.returncode, r.stdout + r.stderr
        got = "exit %d" % rc if rc >= 0 else "killed by signal %d (crash)" % -rc
    except subprocess.TimeoutExpired:
        rc, log, got = None, "", "no answer in %d s (hang)" % timeout
    ok = rc == want_rc and fragment in log
    secs = time.time() - t0
    last = log.strip().splitlines()[-1][:300] if log.strip() else ""
    if xfail:
        if ok:
            failures.append(name)
            print("XPASS %s (%.1f s): passes now; remove it from EXPECTED_FAILURES" % (name, secs))
        else:
            expected.append(name)
            print("xfail %s (%.1f s): %s; %s" % (name, secs, got, xfail))
    elif ok:
        print("ok    %s (%.1f s)" % (name, secs))
    else:
        failures.append(name)
        print("FAIL  %s (%.1f s): want exit %d and %r, got %s: %s" % (name, secs, want_rc, fragment, got, last))
print("%d case(s), %d failure(s), %d expected failure(s), %.1f s" %
      (len(cases), len(failures), len(expected), time.time() - t_all))
sys.exit(1 if failures else 0)
