#!/usr/bin/env python3
"""The two example ops of examples/plugins in Python, for prototyping: @kiln.custom_op numpy kernels
and shape functions that do what square_plus.c and rotary_embedding.cc do (kiln/custom_op.py).

    import python_ops; python_ops.register()          # my.domain::SquarePlus, my.domain::RotaryEmbedding
    engine = kiln.build("square_plus.onnx")          # or kiln.InferenceSession("square_plus.onnx")

Run as a script, it builds make_models.py's models with them, checks the outputs against the numpy
references, saves and reloads the engines (python/tests/test_custom_ops.py runs it):

    PYTHONPATH=build/python python3 examples/plugins/python_ops.py OUTDIR

A process registers an op once, either way: these and the shared libraries (kiln.load_plugin) both
claim my.domain, so register(domain=...) takes another domain to run next to them.
"""
import os
import sys

import numpy as np

import kiln

DOMAIN = "my.domain"


def square_plus(x, b=4.0):
    """y = (x + sqrt(x^2 + b)) / 2: SquarePlus (square_plus.c), b defaulting to 4 as there."""
    if b < 0:
        raise ValueError("attribute 'b' must be >= 0, got %g" % b)
    return 0.5 * (x + np.sqrt(x.astype(np.float64) ** 2 + b))


def rotary_shape(x, pos, head_dim, max_positions=2048, base=10000.0):
    """RotaryEmbedding's shape function: y has X's shape (symbols kept); the checks of its infer."""
    if x is None or len(x) != 4:
        raise ValueError("input X must have rank 4 [batch, seq, heads, head_dim]")
    if pos is not None and len(pos) != 2:
        raise ValueError("input position_ids must have rank 2 [batch, seq]")
    if isinstance(x[3], int) and x[3] != head_dim:
        raise ValueError("X's last dim is %d; attribute head_dim is %d" % (x[3], head_dim))
    return x


def rotary_embedding(x, pos, head_dim, max_positions=2048, base=10000.0):
    """LLaMA's rotate-half rotary embedding of x [batch, seq, heads, head_dim] at position_ids
    [batch, seq] (rotary_embedding.cc; its table is recomputed per call here)."""
    bad = np.argwhere((pos < 0) | (pos >= max_positions))
    if len(bad):
        b, t = bad[0]
        raise ValueError("position_ids[%d,%d] = %d is outside [0, max_positions = %d)"
                         % (b, t, pos[b, t], max_positions))
    half = head_dim // 2
    inv_freq = float(base) ** (-np.arange(half, dtype=np.float64) * 2.0 / head_dim)
    angle = pos.astype(np.float64)[:, :, None, None] * inv_freq
    cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def register(domain=DOMAIN):
    """Registers both ops in `domain` (again: replaces their functions)."""
    kiln.custom_op(domain, "SquarePlus", inputs=1)(square_plus)
    kiln.custom_op(domain, "RotaryEmbedding", shape=rotary_shape, dtype=np.float32, inputs=2)(rotary_embedding)


def main(out):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_models

    register()
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    w = make_models.square_plus_model(os.path.join(out, "square_plus.onnx"))
    engine = kiln.build(os.path.join(out, "square_plus.onnx"), profiles=[{"x": ((1, 16), (4, 16), (9, 16))}])
    x = rng.standard_normal((5, 16)).astype(np.float32)
    want = make_models.square_plus_ref(x @ w, 1.5)
    y = engine.create_context().run({"x": x})["y"]
    check(y.shape == (5, 8) and np.allclose(y, want, rtol=1e-4, atol=1e-5), "SquarePlus in Python matches numpy")
    engine.save(os.path.join(out, "sp_py.kiln"))
    y2 = kiln.load(os.path.join(out, "sp_py.kiln")).create_context().run({"x": x})["y"]
    check(np.array_equal(y, y2), "its saved engine loads and gives the same outputs")

    make_models.rotary_model(os.path.join(out, "rotary.onnx"), seq=7, heads=3, head_dim=16, base=10000.0,
                             max_positions=256)
    sess = kiln.InferenceSession(os.path.join(out, "rotary.onnx"))
    q = rng.standard_normal((1, 7, 3, 16)).astype(np.float32)
    pos = np.array([[0, 1, 2, 3, 100, 200, 255]], dtype=np.int64)
    (y,) = sess.run(None, {"q": q, "pos": pos})
    want = make_models.rotary_ref(q, pos, 10000.0).transpose(0, 2, 1, 3)
    check(y.shape == (1, 3, 7, 16) and np.allclose(y, want, rtol=1e-4, atol=1e-5),
          "RotaryEmbedding in Python matches numpy (through kiln.InferenceSession)")
    engine = kiln.build(os.path.join(out, "rotary.onnx"))
    engine.save(os.path.join(out, "rope_py.kiln"))
    y2 = kiln.load(os.path.join(out, "rope_py.kiln")).create_context().run({"q": q, "pos": pos})["y"]
    check(np.allclose(y2, want, rtol=1e-4, atol=1e-5), "its saved engine loads and matches numpy")
    slow = [l for l in engine.inspect()["layers"] if "slow" in l]
    check([l["name"] for l in slow] == ["rope"], "inspect marks the Python layer slow: %s" % slow)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "python_ops_out"))
