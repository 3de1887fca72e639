"""A drop-in for ONNX Runtime's Python inference API: switch with one import line,

    import kiln as onnxruntime          # or: from kiln import InferenceSession

    sess = onnxruntime.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    out = sess.run(None, {name: x})[0]

Behind the scenes the session builds a kiln engine for the model (fixed input sizes as the model
declares them; dynamic dims planned per shape at run time) and caches it on disk, keyed by the
model's SHA-256, the session's options and kiln's version, in $KILN_CACHE_DIR, else
$XDG_CACHE_HOME/kiln, else ~/.cache/kiln (engines/<key>.kiln). A cached engine that no longer loads
(another CPU, another kiln) is rebuilt with a warning. run() may be called from several threads at
once (each takes an execution context of its own).
"""

import hashlib
import json
import os
import tempfile
import threading
import warnings

from . import _kiln


class GraphOptimizationLevel:
    """ONNX Runtime's levels; kiln always builds its optimized engine (see SessionOptions)."""
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_ALL = 99


class ExecutionMode:
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class SessionOptions:
    """ONNX Runtime's session options. kiln honours intra_op_num_threads (kiln's kernel threads,
    process-wide, as kiln.set_threads; 0: the default) and accepts the others: graph optimization
    levels below ORT_ENABLE_ALL warn once (kiln's engine is always optimized)."""

    __slots__ = ("intra_op_num_threads", "inter_op_num_threads", "graph_optimization_level", "execution_mode",
                 "execution_order", "log_severity_level", "log_verbosity_level", "logid", "enable_profiling",
                 "profile_file_prefix", "optimized_model_filepath", "enable_mem_pattern", "enable_cpu_mem_arena",
                 "enable_mem_reuse", "use_deterministic_compute", "_config")

    def __init__(self):
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.execution_order = 0
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.enable_profiling = False
        self.profile_file_prefix = "onnxruntime_profile_"
        self.optimized_model_filepath = ""
        self.enable_mem_pattern = True
        self.enable_cpu_mem_arena = True
        self.enable_mem_reuse = True
        self.use_deterministic_compute = False
        self._config = {}

    def add_session_config_entry(self, key, value):
        self._config[str(key)] = str(value)

    def get_session_config_entry(self, key):
        return self._config[str(key)]


class RunOptions:
    """Accepted by run() for ONNX Runtime compatibility; nothing in it changes a kiln run."""

    def __init__(self):
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.terminate = False


class NodeArg:
    """An input or output as ONNX Runtime describes it: .name, .shape (ints, and str for symbolic dims,
    None for unnamed dynamic ones) and .type ('tensor(float)')."""

    __slots__ = ("name", "shape", "type")

    def __init__(self, name, shape, type):
        self.name = name
        self.shape = shape
        self.type = type

    def __repr__(self):
        return "NodeArg(name=%r, type=%r, shape=%r)" % (self.name, self.type, self.shape)


_PROVIDERS = ["CPUExecutionProvider"]


def get_available_providers():
    """kiln runs on the CPU here: ['CPUExecutionProvider'] (what ONNX Runtime's CPU build says)."""
    return list(_PROVIDERS)


def get_device():
    return "CPU"


def cache_dir():
    """Where InferenceSession keeps its engines: $KILN_CACHE_DIR, $XDG_CACHE_HOME/kiln or ~/.cache/kiln."""
    d = os.environ.get("KILN_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "kiln")
    return d


_warned_levels = set()


class InferenceSession:
    """ONNX Runtime's InferenceSession over a kiln engine (built once per model and options, cached)."""

    def __init__(self, path_or_bytes, sess_options=None, providers=None, provider_options=None, **kwargs):
        self._options = sess_options if sess_options is not None else SessionOptions()
        self._providers = self._check_providers(providers)
        level = self._options.graph_optimization_level
        if level != GraphOptimizationLevel.ORT_ENABLE_ALL and level not in _warned_levels:
            _warned_levels.add(level)
            warnings.warn("kiln.InferenceSession: graph_optimization_level %r is accepted, but kiln always "
                          "builds its optimized engine (outputs match the unoptimized model within kiln "
                          "compare's tolerances)" % (level,), stacklevel=2)
        threads = int(self._options.intra_op_num_threads or 0)
        if threads > 0:
            _kiln.set_threads(threads)
        if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
            model_bytes, path = bytes(path_or_bytes), None
        else:
            path = os.fspath(path_or_bytes)
            with open(path, "rb") as f:
                model_bytes = f.read()
        self._model_path = path
        self._engine = self._cached_engine(model_bytes, path, _kiln.threads())
        self._inputs = [NodeArg(t.name, list(t.shape), t.type) for t in self._engine.inputs]
        self._outputs = [NodeArg(t.name, list(t.shape), t.type) for t in self._engine.outputs]
        self._output_names = [o.name for o in self._outputs]
        self._contexts = []  # idle execution contexts, one taken per run() in flight
        self._lock = threading.Lock()

    @staticmethod
    def _check_providers(providers):
        if not providers:
            return list(_PROVIDERS)
        names = [p[0] if isinstance(p, (tuple, list)) else p for p in providers]
        others = [p for p in names if p not in _PROVIDERS]
        if others:
            warnings.warn("kiln.InferenceSession: providers %s are not available; running on kiln's CPU engine "
                          "(CPUExecutionProvider)" % ", ".join(map(str, others)), stacklevel=3)
        return list(_PROVIDERS)

    def _cached_engine(self, model_bytes, path, threads):
        # What changes the engine: the model, the thread count it is tuned for, kiln's version.
        key_src = json.dumps({"model": hashlib.sha256(model_bytes).hexdigest(), "threads": threads,
                              "kiln": _kiln.version(), "precision": "fp32"}, sort_keys=True)
        key = hashlib.sha256(key_src.encode()).hexdigest()[:32]
        d = os.path.join(cache_dir(), "engines")
        file = os.path.join(d, key + ".kiln")
        self.cache_file = file
        self.cache_hit = False
        if os.path.exists(file):
            try:
                engine = _kiln.Engine.load(file)
                self.cache_hit = True
                return engine
            except _kiln.Error as e:
                warnings.warn("kiln.InferenceSession: cached engine %s does not load (%s); rebuilding it" % (file, e),
                              stacklevel=3)
        # A path keeps the model's external data next to it reachable.
        flags = json.dumps({"fp32": True})
        engine = (_kiln._build(path, False, flags) if path is not None else _kiln._build(model_bytes, True, flags))
        try:
            os.makedirs(d, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=key, suffix=".tmp", dir=d)
            os.close(fd)
            try:
                engine.save(tmp)
                os.replace(tmp, file)  # atomic: concurrent sessions never see half a file
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        except OSError as e:
            warnings.warn("kiln.InferenceSession: cannot cache the engine in %s (%s)" % (d, e), stacklevel=3)
        return engine

    def get_inputs(self):
        return list(self._inputs)

    def get_outputs(self):
        return list(self._outputs)

    def get_overridable_initializers(self):
        return []

    def get_providers(self):
        return list(self._providers)

    def get_provider_options(self):
        return {p: {} for p in self._providers}

    def get_session_options(self):
        return self._options

    def set_providers(self, providers=None, provider_options=None):
        self._providers = self._check_providers(providers)

    def run(self, output_names, input_feed, run_options=None):
        """Runs the model: output_names (None: all, in the model's order), input_feed {name: array};
        returns a list of numpy arrays."""
        if output_names:
            for n in output_names:
                if n not in self._output_names:
                    raise _kiln.InvalidArgumentError(
                        "'%s' is not an output of the model (outputs: %s)" % (n, ", ".join(self._output_names)))
        with self._lock:
            ctx = self._contexts.pop() if self._contexts else None
        if ctx is None:
            ctx = self._engine.create_context()
        try:
            out = ctx.run(input_feed)
        finally:
            with self._lock:
                self._contexts.append(ctx)
        return [out[n] for n in (output_names or self._output_names)]

    @property
    def engine(self):
        """The kiln Engine behind the session."""
        return self._engine
