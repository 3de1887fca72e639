"""kiln.InferenceSession, the ONNX Runtime drop-in: ONNX Runtime's own Python usage examples for CPU
inference run unchanged with `import kiln as onnxruntime` (only the import line differs)."""
import os
import threading
import warnings

import numpy as np
import pytest

import kiln
import models


@pytest.fixture
def mlp_and_input(mlp_path, rng):
    return mlp_path, rng.standard_normal((5, 64)).astype(np.float32)


def test_get_started_example(mlp_and_input):
    # ONNX Runtime's "Get started with Python" inference lines (feeds by name, run(None, ...)).
    model_path, x = mlp_and_input
    import kiln as ort

    ort_sess = ort.InferenceSession(model_path)
    outputs = ort_sess.run(None, {"x": x})
    np.testing.assert_allclose(outputs[0], models.mlp_reference(x), rtol=1e-4, atol=1e-5)


def test_api_summary_example(mlp_and_input):
    # ONNX Runtime's API summary example: providers from get_available_providers(), names, shapes and
    # types from get_inputs()/get_outputs(), run with output names.
    model_path, X_test = mlp_and_input
    import numpy
    import kiln as rt

    sess = rt.InferenceSession(model_path, providers=rt.get_available_providers())
    input_name = sess.get_inputs()[0].name
    input_shape = sess.get_inputs()[0].shape
    input_type = sess.get_inputs()[0].type
    output_name = sess.get_outputs()[0].name
    output_shape = sess.get_outputs()[0].shape
    pred_onx = sess.run([output_name], {input_name: X_test.astype(numpy.float32)})[0]
    assert input_name == "x" and input_shape == ["batch", 64] and input_type == "tensor(float)"
    assert output_name == "y" and output_shape == ["batch", 32]
    np.testing.assert_allclose(pred_onx, models.mlp_reference(X_test), rtol=1e-4, atol=1e-5)


def test_session_options_and_all_inputs_loop(tmp_path, rng):
    import kiln as onnxruntime

    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = onnxruntime.InferenceSession(models.save(models.two_inputs(), tmp_path / "m.onnx"), so,
                                        providers=["CPUExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    feeds = {}
    for inp in sess.get_inputs():
        shape = [d if isinstance(d, int) else 3 for d in inp.shape]
        feeds[inp.name] = rng.standard_normal(shape).astype(np.float32)
    out_sum, out_idx = sess.run(None, feeds)
    np.testing.assert_allclose(out_sum, feeds["a"] + feeds["b"], rtol=1e-6)
    np.testing.assert_array_equal(out_idx, feeds["a"].argmax(axis=1))
    only = sess.run(["idx"], feeds)
    assert len(only) == 1 and only[0].dtype == np.int64
    assert [o.type for o in sess.get_outputs()] == ["tensor(float)", "tensor(int64)"]
    kiln.set_threads(0)


def test_bytes_lists_and_unknown_provider(mlp_path):
    with open(mlp_path, "rb") as f:
        data = f.read()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        sess = kiln.InferenceSession(data, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert any("CUDAExecutionProvider" in str(x.message) for x in w)
    x = [[0.5] * 64]  # a nested list (ONNX Runtime takes those too); float64 must be converted
    with pytest.raises(kiln.InvalidArgumentError, match="expects dtype float32, got float64"):
        sess.run(None, {"x": x})
    y = sess.run(None, {"x": np.asarray(x, np.float32)})[0]
    assert y.shape == (1, 32)
    with pytest.raises(kiln.InvalidArgumentError, match="'nope' is not an output"):
        sess.run(["nope"], {"x": np.asarray(x, np.float32)})


def test_engine_cache_keyed_by_model_and_options(mlp_path, tmp_path, monkeypatch):
    cache = tmp_path / "kc"
    monkeypatch.setenv("KILN_CACHE_DIR", str(cache))
    first = kiln.InferenceSession(mlp_path)
    assert not first.cache_hit and os.path.dirname(first.cache_file) == str(cache / "engines")
    second = kiln.InferenceSession(mlp_path)
    assert second.cache_hit and second.cache_file == first.cache_file
    other = kiln.InferenceSession(models.save(models.mlp(64, 16), tmp_path / "other.onnx"))
    assert not other.cache_hit and other.cache_file != first.cache_file
    # A corrupt cached engine is rebuilt with a warning.
    with open(first.cache_file, "wb") as f:
        f.write(b"garbage")
    with pytest.warns(UserWarning, match="rebuilding"):
        again = kiln.InferenceSession(mlp_path)
    assert not again.cache_hit
    x = np.ones((2, 64), np.float32)
    np.testing.assert_allclose(again.run(None, {"x": x})[0], models.mlp_reference(x), rtol=1e-4, atol=1e-5)


def test_run_from_two_threads(mlp_path, rng):
    sess = kiln.InferenceSession(mlp_path)
    xs = [rng.standard_normal((8, 64)).astype(np.float32) for _ in range(2)]
    want = [models.mlp_reference(x) for x in xs]
    errors = []

    def work(i):
        try:
            for _ in range(20):
                np.testing.assert_allclose(sess.run(None, {"x": xs[i]})[0], want[i], rtol=1e-4, atol=1e-5)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors


def test_disabled_optimizations_warn(mlp_path):
    so = kiln.SessionOptions()
    so.graph_optimization_level = kiln.GraphOptimizationLevel.ORT_DISABLE_ALL
    with pytest.warns(UserWarning, match="always builds its optimized engine"):
        kiln.InferenceSession(mlp_path, sess_options=so)
    with pytest.raises(AttributeError):
        so.no_such_option = 1
