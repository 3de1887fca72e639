"""kiln: an ONNX inference compiler and runtime (Python API over the C++ API, include/kiln/*.h).

    import kiln
    engine = kiln.build("model.onnx", precision="fp32", shapes={"images": (1, 3, 224, 224)})
    engine.save("model.kiln")
    ctx = kiln.load("model.kiln").create_context()       # one context per thread
    outputs = ctx.run({"images": images})                 # dict name -> numpy array

Ops kiln lacks: ``kiln.load_plugin("libmyops.so")`` (C plugins, kiln/plugin.h), or, to prototype, a
numpy kernel decorated with ``@kiln.custom_op("my.domain", "MyOp", shape=...)`` (kiln/custom_op.py).
ONNX Runtime users: ``import kiln as onnxruntime`` (kiln.InferenceSession, see kiln/onnxruntime.py).
Errors raise kiln.Error subclasses carrying the CLI's messages. The GIL is released while an engine
builds, loads or runs, so threads run their contexts concurrently.
"""

import json as _json
import os as _os
import tempfile as _tempfile

import numpy as _np

from . import _kiln
from ._kiln import (  # noqa: F401  (re-exported)
    DeadlineExceededError,
    Engine,
    Error,
    ExecutionContext,
    InternalError,
    InvalidArgumentError,
    InvalidModelError,
    IOError,
    NotFoundError,
    PluginInfo,
    ShapeError,
    TensorInfo,
    UnsupportedError,
    set_threads,
    threads,
    version,
)

__version__ = version()

_PRECISIONS = ("fp32", "fp16", "bf16", "int8", "best")


def _dims(d):
    """(1, 3, 224, 224) -> '1x3x224x224' (a CLI dims string passes through)."""
    if isinstance(d, str):
        return d
    return "x".join(str(int(v)) for v in d)


def _profile_flag(p):
    """One profile (the CLI's --profile syntax): a string as it is, or a dict input -> dims (fixed)
    or (min, opt, max), optionally with the key 'name'."""
    if isinstance(p, str):
        return p
    if not isinstance(p, dict):
        raise InvalidArgumentError(
            "a profile is a dict {input: (min, opt, max) or dims} or a --profile string, not %r" % (p,))
    name = p.get("name")
    parts = []
    for inp, r in p.items():
        if inp == "name":
            continue
        if isinstance(r, str):
            parts.append("%s:%s" % (inp, r))
        elif len(r) == 3 and all(not isinstance(x, (int, _np.integer)) for x in r):
            parts.append("%s:%s" % (inp, "/".join(_dims(x) for x in r)))
        else:
            parts.append("%s:%s" % (inp, _dims(r)))
    return ("%s=" % name if name else "") + ",".join(parts)


def _shapes_flag(shapes):
    if shapes is None:
        return ""
    if isinstance(shapes, str):
        return shapes
    return ",".join("%s:%s" % (k, _dims(v)) for k, v in shapes.items())


def _build_flags(precision="fp32", shapes=None, profiles=None, calib_data=None, calib_cache=None,
                 calibrator=None, calib_batches=None, calib_batch_size=None, calib_percentile=None,
                 timing_cache=None, tactics=None, strict_tactics=False, disabled_passes=None,
                 workspace=None, activation_memory=None, isa=None, layout_block=None,
                 layer_precisions=None, precision_constraints=None, strongly_typed=False, device=None,
                 tf32=False, exact_gelu=False, verbose=False, min_shapes=None, opt_shapes=None, max_shapes=None):
    """The keyword arguments of build() as kiln build's flags (tools/build_flags.h's BuildFlags)."""
    f = {}
    precs = [precision] if isinstance(precision, str) else list(precision or ["fp32"])
    for p in precs:
        if p not in _PRECISIONS:
            raise InvalidArgumentError("precision %r: expected one of %s (or a list of them)"
                                       % (p, ", ".join(_PRECISIONS)))
        f[p] = True
    if shapes is not None:
        f["build_shapes"] = _shapes_flag(shapes)
    for key, v in (("min_shapes", min_shapes), ("opt_shapes", opt_shapes), ("max_shapes", max_shapes)):
        if v is not None:
            f[key] = _shapes_flag(v)
    if profiles:
        f["profiles"] = [_profile_flag(p) for p in profiles]
    for key, v in (("calib_data", calib_data), ("calib_cache", calib_cache), ("calibrator", calibrator),
                   ("timing_cache", timing_cache), ("isa", isa), ("device", device),
                   ("precision_constraints", precision_constraints)):
        if v is not None:
            f[key] = _os.fspath(v) if key in ("calib_data", "calib_cache", "timing_cache") else str(v)
    for key, v in (("calib_batches", calib_batches), ("calib_batch_size", calib_batch_size)):
        if v is not None:
            f[key] = int(v)
    if calib_percentile is not None:
        f["calib_percentile"] = float(calib_percentile)
    for key, v in (("workspace", workspace), ("activation_memory", activation_memory)):
        if v is not None:
            f[key] = str(v) if isinstance(v, str) else "%dB" % int(v)
    if layout_block is not None:
        f["layout_block"] = str(layout_block)
    if tactics is not None:
        f["tactics"] = [tactics] if isinstance(tactics, str) else list(tactics)
    if disabled_passes is not None:
        f["disabled_passes"] = list(disabled_passes)
    if layer_precisions is not None:
        f["layer_precisions"] = (layer_precisions if isinstance(layer_precisions, str) else
                                 ",".join("%s:%s" % kv for kv in layer_precisions.items()))
    f["strict_tactics"] = bool(strict_tactics)
    f["strongly_typed"] = bool(strongly_typed)
    f["tf32"] = bool(tf32)
    f["exact_gelu"] = bool(exact_gelu)
    f["verbose"] = bool(verbose)
    return f


def build(model, *, precision="fp32", shapes=None, profiles=None, calib_data=None, timing_cache=None,
          threads=None, **options):
    """Builds an engine from an ONNX model (a path, or the model's bytes) as `kiln build` does.

    precision: "fp32" (default), "fp16", "bf16", "int8", "best", or a list ("bf16", "int8") allowing each.
    shapes: {input: dims} fixes inputs (kiln build --shapes). profiles: a list of optimization
    profiles, each {input: (min, opt, max)} or {input: dims} (optionally "name": ...), or a --profile
    string ("x:1x3x224x224/4x3x224x224/8x3x224x224"). calib_data: INT8 calibration data (a directory of
    .npy/.npz or one stacked .npz). timing_cache: the auto-tuner's timing cache file. threads: kiln's
    kernel threads for this process (kiln.set_threads; the engine is tuned for that count).
    Other keywords, as kiln build's flags: calib_cache, calibrator, calib_batches, calib_batch_size,
    calib_percentile, tactics, strict_tactics, disabled_passes, workspace, activation_memory, isa,
    layout_block, layer_precisions ({glob: precision} or the flag's string), precision_constraints,
    strongly_typed, device ("cpu", "cuda:0"), tf32, exact_gelu, verbose, min_shapes/opt_shapes/max_shapes.
    """
    flags = _build_flags(precision=precision, shapes=shapes, profiles=profiles, calib_data=calib_data,
                         timing_cache=timing_cache, **options)
    if threads is not None:
        set_threads(int(threads))
    if isinstance(model, (bytes, bytearray, memoryview)):
        return _kiln._build(bytes(model), True, _json.dumps(flags))
    return _kiln._build(_os.fspath(model), False, _json.dumps(flags))


def load(path):
    """Loads a .kiln engine file (Engine.load)."""
    return Engine.load(_os.fspath(path))


def load_plugin(path):
    """Loads a custom-op plugin, a shared library implementing kiln/plugin.h (what `kiln build --plugin`
    and KILN_PLUGIN_PATH load), and registers its ops; returns its PluginInfo (name, version, path, ops,
    kernels). Loading the same file again returns its info. Errors name the file and the fault."""
    return _kiln.load_plugin(_os.fspath(path))


def loaded_plugins():
    """Every plugin loaded so far, as PluginInfo; the ops of @kiln.custom_op are plugin "python"."""
    return _kiln.loaded_plugins()


def _engine_inspect(self):
    """Layers, kernels, memory plan, pass counts and build target: `kiln inspect --format json`."""
    return _json.loads(self._inspect_json())


def _engine_profiles(self):
    """The optimization profiles: [{"name", "inputs": {input: (min, opt, max)}, "memory_min", ...}]."""
    return self._profiles()


def _engine_save(self, path):
    return self._save(_os.fspath(path))


Engine.inspect = _engine_inspect
Engine.profiles = property(_engine_profiles)
Engine._save = Engine.save
Engine.save = _engine_save


def aligned_empty(shape, dtype=_np.float32):
    """An uninitialized C-order array whose data is 64-byte aligned: context.run() reads it without
    copying (numpy's own arrays are 16-byte aligned; kiln copies those)."""
    dtype = _np.dtype(dtype)
    n = int(_np.prod(shape, dtype=_np.int64)) * dtype.itemsize
    raw = _np.empty(n + 64, dtype=_np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off:off + n].view(dtype).reshape(shape)


class CompareReport(dict):
    """kiln compare's report (what `kiln compare --json` writes) as a dict; .passed is report["pass"]."""

    @property
    def passed(self):
        return bool(self.get("pass"))


def _tol_flags(flag, v):
    if v is None:
        return []
    if isinstance(v, dict):
        out = []
        for name, x in v.items():
            out += [flag, "%s:%r" % (name, float(x))]
        return out
    return [flag, repr(float(v))]


def compare(model=None, *, engine=None, ref="onnx", ref_engine=None, test=None, inputs=None, shapes=None,
            seed=None, input_ranges=None, random_inputs=None, atol=None, rtol=None, find_divergence=False,
            check_numerics=False, threads=None, extra_args=(), **build_options):
    """Runs `kiln compare` in-process and returns its report (a CompareReport dict).

    model: the ONNX model (path). engine: test this .kiln file instead of building one. ref: "onnx"
    (the reference interpreter, default), "engine" (the FP32 engine; or ref_engine=FILE), or a .npz of
    framework outputs. inputs: a dict {name: array}, or a .npz / directory path; with random_inputs
    (default: True when inputs is None or a dict) inputs it lacks get seeded random values of `shapes`
    ({input: dims}). atol, rtol: a number or {output: number}. Build keywords as build() takes them
    (precision, profiles, timing_cache, ...; fixed shapes as build_shapes). extra_args: more CLI flags.
    Tolerance failures are a report with passed False; errors raise kiln.Error subclasses.
    """
    args = [_os.fspath(model)] if model is not None else []
    tmp = None
    try:
        if isinstance(inputs, dict):
            tmp = _tempfile.NamedTemporaryFile(suffix=".npz", delete=False)
            tmp.close()
            _np.savez(tmp.name, **{k: _np.asarray(v) for k, v in inputs.items()})
            args += ["--inputs", tmp.name]
        elif inputs is not None:
            args += ["--inputs", _os.fspath(inputs)]
        if random_inputs is None:
            random_inputs = inputs is None or isinstance(inputs, dict)
        if random_inputs:
            args.append("--random-inputs")
        if engine is not None:
            args += ["--engine", _os.fspath(engine)]
        if ref_engine is not None:
            args += ["--ref-engine", _os.fspath(ref_engine)]
        args += ["--ref", _os.fspath(ref)]
        if test is not None:
            args += ["--test", test]
        if shapes is not None:
            args += ["--shapes", _shapes_flag(shapes)]
        if seed is not None:
            args += ["--seed", str(int(seed))]
        for name, r in (input_ranges or {}).items():
            args += ["--input-range", "%s:%r,%r" % (name, float(r[0]), float(r[1]))]
        args += _tol_flags("--atol", atol) + _tol_flags("--rtol", rtol)
        if find_divergence:
            args.append("--find-divergence")
        if check_numerics:
            args.append("--check-numerics")
        if build_options:
            build_shapes = build_options.pop("build_shapes", None)
            if build_shapes is not None:
                args += ["--build-shapes", _shapes_flag(build_shapes)]
            args += _cli_build_args(_build_flags(**build_options))
        args += [str(a) for a in extra_args]
        if threads is not None:
            set_threads(int(threads))
        return CompareReport(_json.loads(_kiln._compare_json(args)))
    finally:
        if tmp is not None:
            _os.unlink(tmp.name)


def _cli_build_args(f):
    """build()'s flags dict as command-line flags (for compare)."""
    names = {"min_shapes": "--min-shapes", "opt_shapes": "--opt-shapes", "max_shapes": "--max-shapes",
             "calib_data": "--calib-data", "calib_cache": "--calib-cache", "calibrator": "--calibrator",
             "timing_cache": "--timing-cache", "isa": "--isa", "device": "--device",
             "precision_constraints": "--precision-constraints", "calib_batches": "--calib-batches",
             "calib_batch_size": "--calib-batch-size", "calib_percentile": "--calib-percentile",
             "workspace": "--workspace", "activation_memory": "--activation-memory",
             "layout_block": "--layout-block", "layer_precisions": "--layer-precisions"}
    args = []
    for p in _PRECISIONS:
        if f.get(p) and p != "fp32":
            args.append("--" + p)
    for key, flag in names.items():
        if key in f:
            args += [flag, str(f[key])]
    for p in f.get("profiles", []):
        args += ["--profile", p]
    for t in f.get("tactics", []):
        args += ["--tactics", t]
    for d in f.get("disabled_passes", []):
        args += ["--disable-pass", d]
    for key, flag in (("strict_tactics", "--strict-tactics"), ("strongly_typed", "--strongly-typed"),
                      ("tf32", "--tf32"), ("exact_gelu", "--exact-gelu"), ("verbose", "--verbose")):
        if f.get(key):
            args.append(flag)
    return args


from .custom_op import SymbolicDim, custom_op  # noqa: E402,F401  (Python custom ops)
from .onnxruntime import (  # noqa: E402,F401  (the ONNX Runtime drop-in)
    GraphOptimizationLevel,
    InferenceSession,
    NodeArg,
    SessionOptions,
    get_available_providers,
    get_device,
)
