"""kiln's Python API: build, save, load, run, inspect, compare, profiles, errors, zero-copy."""
import os

import numpy as np
import pytest

import kiln
import models


def test_build_run_matches_numpy(mlp_path, rng):
    engine = kiln.build(mlp_path, shapes={"x": (3, 64)})
    x = rng.standard_normal((3, 64)).astype(np.float32)
    out = engine.create_context().run({"x": x})
    assert list(out) == ["y"]
    assert out["y"].dtype == np.float32 and out["y"].shape == (3, 32)
    np.testing.assert_allclose(out["y"], models.mlp_reference(x), rtol=1e-4, atol=1e-5)


def test_inputs_outputs_describe_names_dtypes_symbolic_shapes(tmp_path):
    engine = kiln.build(models.save(models.two_inputs(), tmp_path / "m.onnx"))
    ins, outs = engine.inputs, engine.outputs
    assert [t.name for t in ins] == ["a", "b"] and [t.name for t in outs] == ["sum", "idx"]
    assert ins[0].shape == ("n", 8) and outs[1].shape == ("n",)
    assert ins[0].dtype == np.float32 and outs[1].dtype == np.int64
    assert ins[0].type == "tensor(float)" and outs[1].type == "tensor(int64)"
    a = np.arange(16, dtype=np.float32).reshape(2, 8)[:, ::-1].copy()
    out = engine.create_context().run({"a": a, "b": np.ones((2, 8), np.float32)})
    np.testing.assert_array_equal(out["sum"], a + 1)
    np.testing.assert_array_equal(out["idx"], [0, 0])


def test_build_from_bytes_and_fixed_shapes_specialize(mlp_path):
    with open(mlp_path, "rb") as f:
        engine = kiln.build(f.read(), shapes={"x": (2, 64)})
    assert engine.inputs[0].shape == (2, 64)  # the fixed dim is specialized


def test_save_load_serialize(mlp_path, tmp_path, rng):
    engine = kiln.build(mlp_path, shapes={"x": (4, 64)})
    path = tmp_path / "mlp.kiln"
    engine.save(path)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    want = engine.create_context().run({"x": x})["y"]
    for loaded in (kiln.load(path), kiln.Engine.load(str(path)), kiln.Engine.deserialize(engine.serialize())):
        np.testing.assert_array_equal(loaded.create_context().run({"x": x})["y"], want)


def test_inspect_is_the_cli_json(mlp_path):
    info = kiln.build(mlp_path, shapes={"x": (1, 64)}).inspect()
    assert isinstance(info, dict)
    text = repr(info)
    assert "matmul" in text and "layers" in info


def test_profiles_select_and_reject(mlp_path, rng):
    engine = kiln.build(mlp_path, profiles=[{"x": ((1, 64), (2, 64), (4, 64))},
                                            {"name": "large", "x": ((8, 64), (16, 64), (32, 64))}])
    profiles = engine.profiles
    assert [p["name"] for p in profiles] == ["profile0", "large"]
    assert profiles[1]["inputs"]["x"] == ((8, 64), (16, 64), (32, 64))
    assert profiles[0]["memory_max"] >= profiles[0]["memory_min"] > 0
    ctx = engine.create_context()
    for batch, index in ((3, 0), (20, 1)):
        x = rng.standard_normal((batch, 64)).astype(np.float32)
        np.testing.assert_allclose(ctx.run({"x": x})["y"], models.mlp_reference(x), rtol=1e-4, atol=1e-5)
        assert ctx.profile_index == index
    with pytest.raises(kiln.ShapeError, match=r"input 'x' .* outside profile 0 .*dim 0"):
        ctx.run({"x": np.zeros((6, 64), np.float32)})
    # A profile in the CLI's --profile syntax.
    e2 = kiln.build(mlp_path, profiles=["x:1x64/2x64/4x64"])
    assert e2.profiles[0]["inputs"]["x"] == ((1, 64), (2, 64), (4, 64))


def test_errors_map_to_categories_with_cli_messages(tmp_path, mlp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not a protobuf")
    with pytest.raises(kiln.InvalidModelError):
        kiln.build(bad)
    with pytest.raises(kiln.Error, match="no-such.onnx"):
        kiln.build(tmp_path / "no-such.onnx")
    with pytest.raises(kiln.UnsupportedError, match="MyOp"):
        kiln.build(models.save(models.custom_op(), tmp_path / "custom.onnx"))
    with pytest.raises(kiln.InvalidArgumentError, match="'nonsense' is not a dimension"):
        kiln.build(mlp_path, profiles=["x:nonsense"])
    with pytest.raises(kiln.InvalidArgumentError, match="precision"):
        kiln.build(mlp_path, precision="fp7")
    ctx = kiln.build(mlp_path, shapes={"x": (1, 64)}).create_context()
    with pytest.raises(kiln.InvalidArgumentError, match="'nope' is not an input"):
        ctx.run({"nope": np.zeros((1, 64), np.float32)})
    with pytest.raises(kiln.InvalidArgumentError, match="input 'x' expects dtype float32, got float64"):
        ctx.run({"x": np.zeros((1, 64))})
    with pytest.raises(kiln.ShapeError, match=r"has shape \[2,64\] outside profile 0"):
        ctx.run({"x": np.zeros((2, 64), np.float32)})
    tiny = kiln.build(models.save(models.tiny(), tmp_path / "tiny.onnx")).create_context()
    with pytest.raises(kiln.ShapeError, match=r"input 'x' expects shape \[1,4\], got \[2,4\]"):
        tiny.run({"x": np.zeros((2, 4), np.float32)})
    with pytest.raises(kiln.InvalidModelError):
        kiln.Engine.deserialize(b"not an engine")
    # ValueError / OSError catch them too.
    assert issubclass(kiln.InvalidArgumentError, ValueError) and issubclass(kiln.IOError, OSError)
    assert issubclass(kiln.ShapeError, kiln.Error) and issubclass(kiln.Error, RuntimeError)


def test_noncontiguous_and_list_inputs_are_converted(mlp_path, rng):
    ctx = kiln.build(mlp_path, shapes={"x": (2, 64)}).create_context()
    big = rng.standard_normal((2, 128)).astype(np.float32)
    x = big[:, ::2]  # strided: copied in C order
    assert not x.flags.c_contiguous
    np.testing.assert_allclose(ctx.run({"x": x})["y"], models.mlp_reference(np.ascontiguousarray(x)),
                               rtol=1e-4, atol=1e-5)


def test_zero_copy_in_and_out(tmp_path):
    """An aligned input is read in place, and a view output aliases the engine's memory: with an
    Identity model the output view is the caller's own buffer."""
    ctx = kiln.build(models.save(models.passthrough(), tmp_path / "id.onnx")).create_context()
    x = kiln.aligned_empty((64, 64), np.float32)
    x[...] = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    out = ctx.run({"x": x}, copy=False)
    assert np.shares_memory(out["x"], x)  # zero-copy in and out
    assert not out["x"].flags.writeable and not out["y"].flags.writeable
    np.testing.assert_array_equal(out["y"], x + 1)
    copied = ctx.run({"x": x})
    assert not np.shares_memory(copied["x"], x) and copied["x"].flags.writeable
    np.testing.assert_array_equal(copied["x"], x)
    # An unaligned input is copied (the engine never holds the caller's memory).
    raw = np.zeros(64 * 64 + 1, np.float32)
    unaligned = raw[1:].reshape(64, 64)
    assert unaligned.ctypes.data % 64
    assert not np.shares_memory(ctx.run({"x": unaligned}, copy=False)["x"], unaligned)


def test_inputs_unchanged_by_repeated_runs(mlp_path, rng):
    ctx = kiln.build(mlp_path, shapes={"x": (4, 64)}).create_context()
    x = kiln.aligned_empty((4, 64))
    x[...] = rng.standard_normal((4, 64))
    before = x.copy()
    first = ctx.run({"x": x})["y"]
    second = ctx.run({"x": x})["y"]
    np.testing.assert_array_equal(x, before)
    np.testing.assert_array_equal(first, second)


def test_compare_returns_the_cli_report(mlp_path, tmp_path):
    rep = kiln.compare(mlp_path, shapes={"x": (2, 64)}, seed=3)
    assert rep.passed and rep["pass"] is True
    assert [o["name"] for o in rep["outputs"]] == ["y"]
    assert rep["outputs"][0]["stats"]["abs_err"]["max"] < 1e-4
    # Given inputs and framework outputs that disagree: a failing report, not an error.
    x = np.ones((2, 64), np.float32)
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, y=models.mlp_reference(x) + 1)
    bad = kiln.compare(mlp_path, inputs={"x": x}, ref=wrong)
    assert not bad.passed and bad["outputs"][0]["pass"] is False
    # An engine file, with find_divergence.
    engine_file = tmp_path / "mlp.kiln"
    kiln.build(mlp_path, shapes={"x": (2, 64)}).save(engine_file)
    rep = kiln.compare(mlp_path, engine=engine_file, inputs={"x": x}, find_divergence=True)
    assert rep.passed and rep["divergence"]["first"] is None
    with pytest.raises(kiln.InvalidArgumentError, match="--check-error-stat"):
        kiln.compare(mlp_path, extra_args=["--check-error-stat", "worst"])
    with pytest.raises(kiln.Error, match="missing.onnx"):
        kiln.compare(tmp_path / "missing.onnx")


def test_threads_setting_round_trips():
    before = kiln.threads()
    kiln.set_threads(1)
    assert kiln.threads() == 1
    kiln.set_threads(before)
    assert kiln.__version__ == kiln.version() and kiln.version().count(".") == 2


def test_int8_calibration_and_timing_cache(mlp_path, tmp_path, rng):
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=rng.standard_normal((64, 64)).astype(np.float32))
    cache = tmp_path / "tc.json"
    engine = kiln.build(mlp_path, precision="int8", calib_data=calib, calib_batch_size=16,
                        shapes={"x": (16, 64)}, timing_cache=cache, threads=1)
    assert engine.inspect()["build"]["config"]["precision"] == "int8"
    assert cache.exists() and cache.stat().st_size > 0
    x = rng.standard_normal((16, 64)).astype(np.float32)
    y = engine.create_context().run({"x": x})["y"]
    ref = models.mlp_reference(x)
    assert np.abs(y - ref).max() < 0.1 * np.abs(ref).max()  # INT8: within a few quantization steps
    kiln.set_threads(0)


def test_device_inputs_need_a_cuda_engine(mlp_path):
    ctx = kiln.build(mlp_path, shapes={"x": (1, 64)}).create_context()
    buf = np.zeros((1, 64), np.float32)
    with pytest.raises(kiln.InvalidArgumentError, match="runs on the CPU"):
        ctx.set_input_device("x", buf.ctypes.data, [1, 64], 1, buf.nbytes)
    with pytest.raises(kiln.InvalidArgumentError, match="bytes given"):
        ctx.set_input_device("x", buf.ctypes.data, [1, 64], 1, buf.nbytes - 4)
    ctx.run({"x": buf})
    assert ctx.arena_bytes >= ctx.activation_bytes > 0
