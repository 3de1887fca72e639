"""Custom ops from Python and plugins through Python: @kiln.custom_op (attributes, shape functions with
symbolic dims, several outputs, errors, inspect, engines saved and loaded elsewhere), kiln.load_plugin
and kiln.loaded_plugins, the examples of examples/plugins both ways (python_ops.py against the C++
plugins and numpy), and C++ plugin ops inside If and Loop bodies."""
import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
import models

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples", "plugins")
sys.path.insert(0, EXAMPLES)
import make_models  # noqa: E402
import python_ops  # noqa: E402

# The example plugins CMake builds next to the module (build/python/kiln -> build/plugins).
PLUGIN_DIR = os.environ.get("KILN_TEST_PLUGIN_DIR") or os.path.join(os.path.dirname(kiln.__file__), "..", "..",
                                                                     "plugins")
SQUARE_PLUS = os.path.join(PLUGIN_DIR, "libkiln_square_plus.so")
ROTARY = os.path.join(PLUGIN_DIR, "libkiln_rotary.so")
needs_plugins = pytest.mark.skipif(not os.path.exists(SQUARE_PLUS), reason="the example plugins are not built")

DOMAIN = "pytest.domain"
F = TensorProto.FLOAT


def one_node_model(op, inputs, outputs, domain=DOMAIN, name="custom", **attrs):
    """A model of one `domain::op` node: inputs/outputs are (name, elem_type, dims)."""
    node = helper.make_node(op, [i[0] for i in inputs], [o[0] for o in outputs], name=name, domain=domain, **attrs)
    return models._model([node], [helper.make_tensor_value_info(*i) for i in inputs],
                         [helper.make_tensor_value_info(*o) for o in outputs], domains=[domain]).SerializeToString()


seen_attrs = []


@kiln.custom_op(DOMAIN, "AffineAttrs", inputs=1)
def affine_attrs(x, scale=1.0, shift=(0.0,), mode="add", times=1, tags=()):
    seen_attrs.append(dict(scale=scale, shift=shift, mode=mode, times=times, tags=tags))
    y = x * scale * times
    return y + np.asarray(shift, np.float32) if mode == "add" else y - np.asarray(shift, np.float32)


def test_a_python_op_gets_the_nodes_attributes_and_matches_numpy(rng):
    model = one_node_model("AffineAttrs", [("x", F, ["batch", 3])], [("y", F, ["batch", 3])], scale=2.5,
                           shift=[1.0, -2.0, 0.5], mode="sub", times=3, tags=["a", "b"])
    engine = kiln.build(model, profiles=[{"x": ((1, 3), (2, 3), (8, 3))}])
    assert engine.outputs[0].shape == ("batch", 3)  # the default shape function keeps the symbol
    x = rng.standard_normal((5, 3)).astype(np.float32)
    seen_attrs.clear()
    y = engine.create_context().run({"x": x})["y"]
    np.testing.assert_allclose(y, x * 7.5 - np.array([1.0, -2.0, 0.5], np.float32), rtol=1e-6)
    assert seen_attrs, "the kernel ran"
    a = seen_attrs[-1]
    assert a["mode"] == "sub" and a["times"] == 3 and a["tags"] == ["a", "b"]
    assert a["scale"] == pytest.approx(2.5) and a["shift"] == pytest.approx([1.0, -2.0, 0.5])
    # The layer is marked slow, with its plugin; the engine records plugin "python" and the layer.
    layer = [l for l in engine.inspect()["layers"] if l["op"] == DOMAIN + ".AffineAttrs"][0]
    assert layer["kernel"] == "python.pytest_domain.AffineAttrs"
    assert "slow" in layer["slow"] and "Python" in layer["slow"]
    plugins = engine.inspect()["build"]["plugins"]
    assert [(p["name"], p["slow"], p["layers"]) for p in plugins] == [("python", True, ["custom"])]
    python = [p for p in kiln.loaded_plugins() if p.name == "python"]
    assert python and DOMAIN + "::AffineAttrs" in python[0].ops and python[0].path == "python"


@kiln.custom_op(DOMAIN, "SplitPairs", inputs=1,
                shape=lambda x, **a: [(x[0], x[1] // 2), (x[0], x[1] // 2)],
                dtype=lambda x, **a: [np.float32, np.int64])
def split_pairs(x):
    return x[:, 0::2] + x[:, 1::2], np.argmax(np.stack([x[:, 0::2], x[:, 1::2]]), axis=0)


def test_shape_functions_give_several_outputs_dtypes_and_keep_symbols(rng):
    model = one_node_model("SplitPairs", [("x", F, ["n", 6])], [("s", F, None), ("i", TensorProto.INT64, None)])
    engine = kiln.build(model, profiles=[{"x": ((1, 6), (3, 6), (4, 6))}])
    assert [(o.name, o.shape, o.type) for o in engine.outputs] == [("s", ("n", 3), "tensor(float)"),
                                                                  ("i", ("n", 3), "tensor(int64)")]
    x = rng.standard_normal((4, 6)).astype(np.float32)
    out = engine.create_context().run({"x": x})
    np.testing.assert_allclose(out["s"], x[:, 0::2] + x[:, 1::2], rtol=1e-6)
    np.testing.assert_array_equal(out["i"], (x[:, 1::2] > x[:, 0::2]).astype(np.int64))
    assert out["i"].dtype == np.int64


@kiln.custom_op(DOMAIN, "Fragile", inputs=1)
def fragile(x, limit=10.0):
    if np.abs(x).max() > limit:
        raise ValueError("input too large: %g > %g" % (np.abs(x).max(), limit))
    return x * 2


@kiln.custom_op(DOMAIN, "WrongShape", inputs=1)
def wrong_shape(x):
    return x[:-1]


def test_errors_in_python_kernels_are_kiln_errors_naming_the_node_with_the_traceback():
    engine = kiln.build(one_node_model("Fragile", [("x", F, [4])], [("y", F, [4])], name="fragile_node", limit=5.0))
    ctx = engine.create_context()
    with pytest.raises(kiln.Error) as e:
        ctx.run({"x": np.array([1, 2, 30, 4], np.float32)})
    msg = str(e.value)
    for part in ("fragile_node", "python", "ValueError: input too large: 30 > 5", "Traceback", "test_custom_ops.py",
                 "fragile"):
        assert part in msg, (part, msg)
    # Nothing broke: the context runs again.
    np.testing.assert_array_equal(ctx.run({"x": np.ones(4, np.float32)})["y"], np.full(4, 2, np.float32))
    engine = kiln.build(one_node_model("WrongShape", [("x", F, [4])], [("y", F, [4])], name="short"), verbose=False)
    with pytest.raises(kiln.Error) as e:
        engine.create_context().run({"x": np.ones(4, np.float32)})
    assert "short" in str(e.value) and "output 0 has shape (3,); the shape function gave (4,)" in str(e.value)


def test_a_failing_shape_function_names_the_node():
    @kiln.custom_op(DOMAIN, "BadShape", shape=lambda x, **a: x[5])
    def bad_shape(x):
        return x

    with pytest.raises(kiln.Error) as e:
        kiln.build(one_node_model("BadShape", [("x", F, [2])], [("y", F, [2])], name="bad_shape_node"))
    msg = str(e.value)
    assert "bad_shape_node" in msg and "IndexError" in msg and "shape function" in msg, msg


def test_redefining_a_python_op_replaces_its_kernel():
    @kiln.custom_op(DOMAIN, "Redefined", inputs=1)
    def first(x):
        return x + 1

    model = one_node_model("Redefined", [("x", F, [3])], [("y", F, [3])])
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(kiln.build(model).create_context().run({"x": x})["y"], x + 1)

    @kiln.custom_op(DOMAIN, "Redefined", inputs=1)
    def second(x):
        return x * 10

    np.testing.assert_array_equal(kiln.build(model).create_context().run({"x": x})["y"], x * 10)


def test_an_engine_with_python_ops_loads_only_where_they_are_defined(tmp_path):
    path = str(tmp_path / "affine.kiln")
    kiln.build(one_node_model("AffineAttrs", [("x", F, [2])], [("y", F, [2])], scale=3.0)).save(path)
    x = np.array([1, -2], np.float32)
    np.testing.assert_allclose(kiln.load(path).create_context().run({"x": x})["y"], 3 * x)
    script = (
        "import sys, kiln\n"
        "try:\n    kiln.load(sys.argv[1])\nexcept kiln.UnsupportedError as e:\n    print('ERR1', e)\n"
        "kiln.custom_op('pytest.domain', 'Other')(lambda x: x)\n"
        "try:\n    kiln.load(sys.argv[1])\nexcept kiln.UnsupportedError as e:\n    print('ERR2', e)\n")
    out = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))).stdout
    err1 = [l for l in out.splitlines() if l.startswith("ERR1")]
    err2 = [l for l in out.splitlines() if l.startswith("ERR2")]
    assert err1 and "plugin 'python'" in err1[0] and "pytest.domain::AffineAttrs" in err1[0] \
        and "@kiln.custom_op" in err1[0], out
    assert err2 and "pytest.domain::AffineAttrs" in err2[0] and "not registered" in err2[0] \
        and "@kiln.custom_op" in err2[0], out


def test_inference_session_runs_python_ops(rng):
    model = one_node_model("AffineAttrs", [("x", F, ["batch", 4])], [("y", F, ["batch", 4])], scale=-1.0)
    sess = kiln.InferenceSession(model)
    assert sess.get_inputs()[0].shape == ["batch", 4]
    x = rng.standard_normal((3, 4)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, -x, rtol=1e-6)


@needs_plugins
def test_load_plugin_returns_its_info_and_loaded_plugins_lists_it():
    info = kiln.load_plugin(SQUARE_PLUS)
    assert isinstance(info, kiln.PluginInfo)
    assert (info.name, info.version, info.ops) == ("kiln_example_activation", "1.0.0", ["my.domain::SquarePlus"])
    assert os.path.samefile(info.path, SQUARE_PLUS) and len(info.kernels) == 2
    assert kiln.load_plugin(SQUARE_PLUS).name == info.name  # again: the same plugin
    assert "kiln_example_activation" in [p.name for p in kiln.loaded_plugins()]
    with pytest.raises(kiln.NotFoundError, match="no such file"):
        kiln.load_plugin(os.path.join(PLUGIN_DIR, "libnone.so"))
    with pytest.raises(kiln.Error, match="exports no 'kiln_plugin_init'"):
        kiln.load_plugin(os.path.join(PLUGIN_DIR, "libkiln_test_plugin_no_init.so"))


@needs_plugins
def test_the_examples_in_python_match_the_cpp_plugins_and_numpy(tmp_path, rng):
    """python_ops.py's ops (registered under another domain: the C++ plugins hold my.domain here)
    against libkiln_square_plus.so / libkiln_rotary.so on the same inputs, and against numpy."""
    kiln.load_plugin(SQUARE_PLUS), kiln.load_plugin(ROTARY)
    python_ops.register("py.domain")
    w = make_models.square_plus_model(str(tmp_path / "sp_c.onnx"))
    make_models.square_plus_model(str(tmp_path / "sp_py.onnx"), domain="py.domain")
    x = rng.standard_normal((6, 16)).astype(np.float32)
    y_c = kiln.build(str(tmp_path / "sp_c.onnx"), shapes={"x": (6, 16)}).create_context().run({"x": x})["y"]
    e_py = kiln.build(str(tmp_path / "sp_py.onnx"), shapes={"x": (6, 16)})
    e_py.save(str(tmp_path / "sp_py.kiln"))
    y_py = kiln.load(str(tmp_path / "sp_py.kiln")).create_context().run({"x": x})["y"]
    np.testing.assert_allclose(y_py, y_c, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y_py, make_models.square_plus_ref(x @ w, 1.5), rtol=1e-4, atol=1e-5)

    make_models.rotary_model(str(tmp_path / "rope_c.onnx"), seq=5, heads=2, head_dim=8, base=500.0, max_positions=64)
    make_models.rotary_model(str(tmp_path / "rope_py.onnx"), seq=5, heads=2, head_dim=8, base=500.0, max_positions=64,
                             domain="py.domain")
    q = rng.standard_normal((1, 5, 2, 8)).astype(np.float32)
    pos = np.array([[0, 3, 17, 40, 63]], np.int64)
    y_c = kiln.build(str(tmp_path / "rope_c.onnx")).create_context().run({"q": q, "pos": pos})["y"]
    e_py = kiln.build(str(tmp_path / "rope_py.onnx"))
    e_py.save(str(tmp_path / "rope_py.kiln"))
    ctx = kiln.load(str(tmp_path / "rope_py.kiln")).create_context()
    y_py = ctx.run({"q": q, "pos": pos})["y"]
    np.testing.assert_allclose(y_py, y_c, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y_py, make_models.rotary_ref(q, pos, 500.0).transpose(0, 2, 1, 3), rtol=1e-4,
                               atol=1e-5)
    with pytest.raises(kiln.Error, match=r"rope.*position_ids\[0,4\] = 64 is outside \[0, max_positions = 64\)"):
        ctx.run({"q": q, "pos": np.array([[0, 1, 2, 3, 64]], np.int64)})


def test_the_python_example_script_builds_checks_saves_and_loads(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "python_ops.py"), str(tmp_path)], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert r.returncode == 0 and "FAIL" not in r.stdout and r.stdout.count("ok ") == 5, r.stdout + r.stderr


def control_flow_models(op_domain="my.domain"):
    """SquarePlus (b=2) in an If's then-branch (else: Neg) and in a Loop body applied `n` times."""
    sp = lambda i, o, name: helper.make_node("SquarePlus", [i], [o], name=name, domain=op_domain, b=2.0)  # noqa
    then_g = helper.make_graph([sp("x", "t", "then_sp")], "then", [], [helper.make_tensor_value_info("t", F, [3, 5])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="else_neg")], "else", [],
                               [helper.make_tensor_value_info("e", F, [3, 5])])
    if_node = helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)
    if_model = models._model([if_node], [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                         helper.make_tensor_value_info("x", F, [3, 5])],
                             [helper.make_tensor_value_info("y", F, [3, 5])], domains=[op_domain])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep"), sp("v_in", "v_out", "loop_sp")], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", F, [4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", F, [4])])
    loop = helper.make_node("Loop", ["n", "", "v0"], ["v"], name="loop", body=body)
    loop_model = models._model([loop], [helper.make_tensor_value_info("n", TensorProto.INT64, []),
                                        helper.make_tensor_value_info("v0", F, [4])],
                               [helper.make_tensor_value_info("v", F, [4])], domains=[op_domain])
    return if_model.SerializeToString(), loop_model.SerializeToString()


def sp_ref(x, b=2.0):
    return 0.5 * (x + np.sqrt(x.astype(np.float64) ** 2 + b))


@needs_plugins
@pytest.mark.parametrize("domain", ["my.domain", "py.loops"])
def test_plugin_ops_inside_if_and_loop_bodies(tmp_path, rng, domain):
    """The C++ plugin (my.domain) and the Python version (py.loops) inside an If branch and a Loop body:
    build, run, numpy, and the saved engine."""
    if domain == "my.domain":
        kiln.load_plugin(SQUARE_PLUS)
    else:
        python_ops.register(domain)
    if_model, loop_model = control_flow_models(domain)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    engine = kiln.build(if_model)
    engine.save(str(tmp_path / "if.kiln"))
    for e in (engine, kiln.load(str(tmp_path / "if.kiln"))):
        ctx = e.create_context()
        np.testing.assert_allclose(ctx.run({"c": np.array(True), "x": x})["y"], sp_ref(x), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(ctx.run({"c": np.array(False), "x": x})["y"], -x)
    plugins = engine.inspect()["build"]["plugins"]
    assert len(plugins) == 1 and plugins[0]["layers"] == ["branch/then_branch/then_sp"], plugins
    then_layers = [b for b in engine.inspect()["layers"][0]["bodies"] if b["attribute"] == "then_branch"][0]["layers"]
    # A Python kernel is marked slow inside a body too; the C++ plugin's is not.
    assert ("slow" in then_layers[0]) == (domain != "my.domain"), then_layers

    v0 = rng.standard_normal(4).astype(np.float32)
    engine = kiln.build(loop_model)
    engine.save(str(tmp_path / "loop.kiln"))
    for e in (engine, kiln.load(str(tmp_path / "loop.kiln"))):
        ctx = e.create_context()
        for n in (0, 1, 3):
            want = v0.astype(np.float64)
            for _ in range(n):
                want = sp_ref(want)
            np.testing.assert_allclose(ctx.run({"n": np.array(n, np.int64), "v0": v0})["v"], want, rtol=1e-5,
                                       atol=1e-6)


def test_compare_runs_python_ops_in_the_reference_interpreter(tmp_path):
    path = str(tmp_path / "affine.onnx")
    with open(path, "wb") as f:
        f.write(one_node_model("AffineAttrs", [("x", F, [2, 3])], [("y", F, [2, 3])], scale=0.5, shift=[1.0]))
    report = kiln.compare(path, seed=3)
    assert report.passed, report
    seen_attrs.clear()
    kiln.compare(path, seed=3)
    assert len(seen_attrs) >= 2 and seen_attrs[-1]["scale"] == 0.5  # the engine's and the reference's calls


def test_python_ops_run_from_two_threads_and_threads_build_meanwhile(rng):
    """Contexts of one engine run a Python op on two threads (each callback takes the GIL the run
    released) while a third thread builds: every output right, nothing deadlocks."""
    import threading

    engine = kiln.build(one_node_model("AffineAttrs", [("x", F, [64])], [("y", F, [64])], scale=2.0))
    xs = [rng.standard_normal(64).astype(np.float32) for _ in range(2)]
    errors, done = [], []

    def runner(x):
        try:
            ctx = engine.create_context()
            for _ in range(50):
                np.testing.assert_allclose(ctx.run({"x": x})["y"], 2 * x + 0.0, rtol=1e-6)
            done.append(1)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def builder():
        try:
            for _ in range(3):
                kiln.build(one_node_model("Fragile", [("x", F, [4])], [("y", F, [4])]))
            done.append(1)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=runner, args=(x,)) for x in xs] + [threading.Thread(target=builder)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread is stuck"
    assert not errors and len(done) == 3, errors


def test_python_ops_take_empty_tensors():
    engine = kiln.build(one_node_model("AffineAttrs", [("x", F, [0, 3])], [("y", F, [0, 3])], scale=2.0))
    y = engine.create_context().run({"x": np.zeros((0, 3), np.float32)})["y"]
    assert y.shape == (0, 3) and y.dtype == np.float32


@kiln.custom_op(DOMAIN, "Twice", inputs=1, shape=lambda x, **a: (x[0] * 2,) + x[1:])
def twice(x):
    return np.concatenate([x, x])


def test_arithmetic_on_a_symbolic_dim_gives_an_unknown_dim_known_at_run_time(rng):
    engine = kiln.build(one_node_model("Twice", [("x", F, ["n", 3])], [("y", F, None)]),
                        profiles=[{"x": ((1, 3), (2, 3), (5, 3))}])
    shape = engine.outputs[0].shape
    assert len(shape) == 2 and not isinstance(shape[0], int) and shape[0] != "n" and shape[1] == 3, shape
    x = rng.standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_array_equal(engine.create_context().run({"x": x})["y"], np.concatenate([x, x]))
    assert repr(kiln.SymbolicDim((0, 1))) == "SymbolicDim(input 0, axis 1)"


def test_a_tensor_attribute_is_refused_naming_it():
    @kiln.custom_op(DOMAIN, "TakesTensor", inputs=1)
    def takes_tensor(x, **attrs):
        return x

    model = one_node_model("TakesTensor", [("x", F, [2])], [("y", F, [2])], name="tt",
                           table=numpy_helper.from_array(np.ones(2, np.float32)))
    with pytest.raises(kiln.Error) as e:
        kiln.build(model)
    assert "tt" in str(e.value) and "attribute 'table' is of type TENSOR" in str(e.value), str(e.value)


def test_an_unknown_ops_error_points_to_both_ways_of_adding_it():
    with pytest.raises(kiln.UnsupportedError) as e:
        kiln.build(one_node_model("NobodyHasThis", [("x", F, [2])], [("y", F, [2])], name="nobody"))
    msg = str(e.value)
    for part in ("'nobody': NobodyHasThis", "kiln.load_plugin()", "@kiln.custom_op", "examples/plugins/",
                 "python_ops.py"):
        assert part in msg, (part, msg)
