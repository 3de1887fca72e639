"""Custom ops in Python, for prototyping: a numpy kernel and a shape function that kiln.build and
kiln.InferenceSession use for an op kiln lacks (the C++ side: python/src/custom_ops.cc).

    @kiln.custom_op("my.domain", "SquarePlus")           # output: the shape and dtype of input 0
    def square_plus(x, b=1.0):                            # inputs positionally, attributes as keywords
        return 0.5 * (x + np.sqrt(x * x + b))

    @kiln.custom_op("my.domain", "Pairs", shape=lambda x, **attrs: (x[0], x[1] // 2, 2), dtype=np.float32)
    def pairs(x, **attrs): ...

The kernel is called as kernel(*inputs, **attrs): inputs are read-only numpy views of kiln's buffers
(None for an absent optional input), valid during the call; attrs are the node's attributes (int,
float, str, and lists of them) as a dict, passed as keywords. It returns an array per output (a tuple
or list for several); each is converted to the output's dtype (same-kind casting: float64 into
float32 is fine) and must have the shape the shape function gave.

shape(*input_shapes, **attrs) returns the output's shape (a tuple) or a list of shapes, one per
output. Input shapes are tuples of ints; at build time a dim may be unknown (symbolic): a SymbolicDim,
which, returned as it is, keeps its symbol (so `shape=lambda x, **a: x` keeps a dynamic batch), and
becomes an unknown dim after arithmetic. None stands for an absent input (or an unknown rank). The
default shape function gives every output the shape of input 0. dtype: a numpy dtype for every output,
a list (one per output), or a function dtype(*input_dtypes, **attrs); default: input 0's.

Python ops are slow (the GIL is taken for every call): `kiln inspect` and Engine.inspect() mark their
layers "slow". An engine with Python ops loads only in a process that defined them again (the error
names the op). Redefining an op (the same domain and op type) replaces its functions everywhere.
"""

import sys as _sys
import traceback as _traceback

import numpy as _np

from . import _kiln

__all__ = ["custom_op", "SymbolicDim"]


class SymbolicDim:
    """An unknown dim in a shape function: input `source` = (input, axis) when it is one input's dim
    (returning it keeps that symbol), None after arithmetic (an unknown dim of the output)."""

    __slots__ = ("source",)

    def __init__(self, source=None):
        self.source = source

    def __repr__(self):
        return "SymbolicDim(input %d, axis %d)" % self.source if self.source else "SymbolicDim(?)"

    def _unknown(self, *_):
        return SymbolicDim()

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _unknown
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __neg__ = _unknown


def _where(fn):
    code = getattr(fn, "__code__", None)
    name = getattr(fn, "__qualname__", repr(fn))
    return "%s (%s:%d)" % (name, code.co_filename, code.co_firstlineno) if code else name


def _failure(what, fn):
    """The current exception as kiln's failure message: what failed, where, the exception, and the
    traceback (from the user's function on: the adapter's own frame left out)."""
    t, v, tb = _sys.exc_info()
    head = "".join(_traceback.format_exception_only(t, v)).strip()
    trace = "".join(_traceback.format_exception(t, v, tb.tb_next or tb)).rstrip()
    return "Python %s %s raised %s\n%s" % (what, _where(fn), head, trace)


def _is_shape(v):
    return isinstance(v, (tuple, list)) and all(isinstance(d, (int, _np.integer, SymbolicDim)) or d is None
                                                for d in v)


def _infer_adapter(shape_fn, dtype, op):
    """(inputs [(dtype, dims) or None], attrs) -> [(dtype, dims)] with dims entries an int, -1 (unknown)
    or (input, axis); a str on failure."""

    def infer(inputs, attrs):
        try:
            shapes = [None if i is None or i[1] is None else
                      tuple(int(d) if d >= 0 else SymbolicDim((k, a)) for a, d in enumerate(i[1]))
                      for k, i in enumerate(inputs)]
            dtypes = [None if i is None else i[0] for i in inputs]
            if shape_fn is None:
                if not shapes or shapes[0] is None:
                    return "%s: the default shape function copies input 0, which is absent or of unknown rank " \
                           "(give shape=...)" % op
                out = [shapes[0]]
            else:
                out = shape_fn(*shapes, **attrs)
                out = [out] if _is_shape(out) else list(out)
            if dtype is None:
                dts = [dtypes[0] if dtypes else None] * len(out)
            elif callable(dtype) and not isinstance(dtype, type):
                dts = dtype(*dtypes, **attrs)
                dts = list(dts) if isinstance(dts, (list, tuple)) else [dts] * len(out)
            elif isinstance(dtype, (list, tuple)):
                dts = list(dtype)
            else:
                dts = [dtype] * len(out)
            if len(dts) != len(out):
                return "%s: %d dtypes for %d output shapes" % (op, len(dts), len(out))
            result = []
            for o, (s, dt) in enumerate(zip(out, dts)):
                if not _is_shape(s):
                    return "%s: the shape function's output %d is %r, not a tuple of ints" % (op, o, s)
                if dt is None:
                    return "%s: output %d's dtype is unknown (input 0's dtype is not known yet: give dtype=...)" \
                           % (op, o)
                dims = []
                for d in s:
                    if isinstance(d, SymbolicDim):
                        dims.append(d.source if d.source else -1)
                    elif d is None:
                        dims.append(-1)
                    elif int(d) < 0:
                        return "%s: the shape function's output %d has a negative dim %d" % (op, o, int(d))
                    else:
                        dims.append(int(d))
                result.append((_np.dtype(dt), dims))
            return result
        except BaseException:  # noqa: B902  (kiln reports it, naming the node)
            return _failure("shape function", shape_fn or infer)

    return infer


def _kernel_adapter(fn):
    """(inputs, attrs, expected [(dtype, shape) or None]) -> [C-contiguous arrays]; a str on failure."""

    def kernel(inputs, attrs, expected):
        try:
            r = fn(*inputs, **attrs)
            outs = list(r) if isinstance(r, (tuple, list)) else [r]
            if len(outs) < len(expected):
                return "Python kernel %s returned %d output(s); the node has %d" % (_where(fn), len(outs),
                                                                                   len(expected))
            result = []
            for o, (a, want) in enumerate(zip(outs, expected)):
                if want is None:
                    result.append(None)
                    continue
                dt, shape = want
                a = _np.asarray(a)
                if a.shape != shape:
                    return ("Python kernel %s: output %d has shape %s; the shape function gave %s"
                            % (_where(fn), o, a.shape, shape))
                if not _np.can_cast(a.dtype, dt, casting="same_kind"):
                    return ("Python kernel %s: output %d has dtype %s, which does not cast to the output's %s "
                            "(same kind) — return .astype(np.%s)" % (_where(fn), o, a.dtype, dt, dt))
                result.append(_np.ascontiguousarray(a, dtype=dt))
            return result
        except BaseException:  # noqa: B902
            return _failure("kernel", fn)

    return kernel


def custom_op(domain, op_type, *, shape=None, dtype=None, inputs=None, since_opset=1, until_opset=0):
    """Decorator: registers the numpy function it decorates as the kernel of custom op
    domain::op_type (see this module's doc). inputs: the input count (an int, or (min, max) with max
    -1 for any); since_opset/until_opset: the op's opset range in its domain (0: no upper bound).
    Returns the function unchanged (with .kiln_op, the op's "domain::OpType")."""
    if inputs is None:
        lo, hi = 0, -1
    elif isinstance(inputs, int):
        lo = hi = inputs
    else:
        lo, hi = inputs
    if shape is not None and not callable(shape):
        raise _kiln.InvalidArgumentError("custom_op %s::%s: shape must be a function (*input_shapes, **attrs) -> "
                                         "shape(s), not %r" % (domain, op_type, shape))

    def register(fn):
        if not callable(fn):
            raise _kiln.InvalidArgumentError("custom_op %s::%s decorates a function, not %r" % (domain, op_type, fn))
        name = "%s::%s" % (domain or "ai.onnx", op_type)
        _kiln._register_custom_op(domain, op_type, int(since_opset), int(until_opset), int(lo), int(hi),
                                  _infer_adapter(shape, dtype, name), _kernel_adapter(fn))
        fn.kiln_op = name
        return fn

    return register

