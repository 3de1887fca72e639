#!/usr/bin/env python3
"""The plugin examples through the CLI (ctest e2e_plugins): each model builds into an engine with its
plugin, runs, matches its numpy reference, and its saved engine loads again; without the plugin (or with
another major version of it) loading fails with the documented error; an unknown op's error points to
examples/plugins; the reference interpreter runs plugin ops (kiln compare).

    test_plugins.py KILN WORKDIR PLUGIN_DIR
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "e2e"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_util import WORK, check, finish, kiln, make_workdir  # noqa: E402
import make_models  # noqa: E402

PLUGINS = sys.argv[3]
SQUARE_PLUS = os.path.join(PLUGINS, "libkiln_square_plus.so")
SQUARE_PLUS_V2 = os.path.join(PLUGINS, "libkiln_square_plus_v2.so")
ROTARY = os.path.join(PLUGINS, "libkiln_rotary.so")
ABI_MAJOR = os.path.join(PLUGINS, "libkiln_test_plugin_abi_major.so")

make_workdir(clean=True)
W = lambda *p: os.path.join(WORK, *p)  # noqa: E731
w = make_models.square_plus_model(W("square_plus.onnx"))
make_models.rotary_model(W("rotary.onnx"), seq=7, heads=3, head_dim=16, base=10000.0, max_positions=256)

# --- SquarePlus: build (dynamic batch), run, numpy, save/load
rc, out = kiln("build", W("square_plus.onnx"), "-o", W("sp.kiln"), "--plugin", SQUARE_PLUS,
               "--profile", "x:1x16/4x16/9x16")
check(rc == 0, "square_plus builds with --plugin: " + out[-400:])
x = np.random.default_rng(1).standard_normal((5, 16)).astype(np.float32)
np.savez(W("sp_in.npz"), x=x)
rc, out = kiln("run", W("sp.kiln"), "--plugin", SQUARE_PLUS, "--inputs", W("sp_in.npz"), "--save-outputs",
               W("sp_out.npz"))
check(rc == 0, "the square_plus engine loads and runs with --plugin: " + out[-400:])
if rc == 0:
    y = np.load(W("sp_out.npz"))["y"]
    want = make_models.square_plus_ref(x @ w, 1.5)
    check(y.shape == (5, 8) and np.allclose(y, want, rtol=1e-4, atol=1e-5),
          f"square_plus matches numpy (max err {np.abs(y - want).max():.2e})")
# KILN_PLUGIN_PATH instead of --plugin
env = dict(os.environ, KILN_PLUGIN_PATH=SQUARE_PLUS + ":" + ROTARY)
rc, out = kiln("run", W("sp.kiln"), "--inputs", W("sp_in.npz"), env=env)
check(rc == 0, "KILN_PLUGIN_PATH loads the plugin: " + out[-300:])
# KILN_PLUGIN_PATH naming a directory: every .so in it
os.makedirs(W("plugin_dir"), exist_ok=True)
for lib in (SQUARE_PLUS, ROTARY):
    os.symlink(os.path.abspath(lib), W("plugin_dir", os.path.basename(lib)))
rc, out = kiln("run", W("sp.kiln"), "--inputs", W("sp_in.npz"), env=dict(os.environ, KILN_PLUGIN_PATH=W("plugin_dir")))
check(rc == 0, "KILN_PLUGIN_PATH with a directory loads its plugins: " + out[-300:])
# The timing cache keeps plugin kernels' timings like built-in tactics'
for i in range(2):
    rc, out = kiln("build", W("square_plus.onnx"), "-o", W(f"sp_cached{i}.kiln"), "--plugin", SQUARE_PLUS,
                   "--shapes", "x:4x16", "--timing-cache", W("timing.cache"))
    check(rc == 0, f"build {i} with a timing cache: " + out[-300:])
rc, out = kiln("inspect", W("sp_cached1.kiln"), "--plugin", SQUARE_PLUS, "--format", "json")
if rc == 0:
    j = json.loads(out[out.index("{"):])
    act = [l for l in j["layers"] if l["op"] == "my.domain.SquarePlus"]
    check(act and len(act[0]["candidates"]) == 2 and all(c["cached"] for c in act[0]["candidates"]),
          "the second build takes both plugin kernels' timings from the cache: " + json.dumps(act[0]["candidates"]))
# inspect: both kernels timed, the winner one of them, the plugin recorded
rc, out = kiln("inspect", W("sp.kiln"), "--plugin", SQUARE_PLUS, "--format", "json")
check(rc == 0, "inspect with the plugin: " + out[-300:])
if rc == 0:
    j = json.loads(out[out.index("{"):])
    act = [l for l in j["layers"] if l["op"] == "my.domain.SquarePlus"]
    check(len(act) == 1 and act[0]["kernel"].startswith("kiln_example_activation.square_plus_f32_"),
          "the SquarePlus layer runs a plugin kernel: " + (act[0]["kernel"] if act else "no layer"))
    cands = act[0]["candidates"] if act else []
    check(len(cands) == 2 and all(c["state"] == "timed" for c in cands),
          "the auto-tuner timed both plugin kernels: " + json.dumps(cands))
    rec = j["build"].get("plugins", [])
    check(len(rec) == 1 and rec[0]["name"] == "kiln_example_activation" and rec[0]["version"] == "1.0.0"
          and rec[0]["layers"] == ["act"], "the engine records the plugin, its version and its layers: " + json.dumps(rec))
rc, out = kiln("inspect", W("sp.kiln"), "--plugin", SQUARE_PLUS)
check(rc == 0 and "kiln_example_activation 1.0.0" in out, "inspect's text names the plugin: " + out[-600:])
# Without the plugin: the documented error (exit 4, unsupported)
rc, out = kiln("run", W("sp.kiln"), "--inputs", W("sp_in.npz"))
check(rc == 4 and "plugin 'kiln_example_activation' 1.0.0" in out and "not loaded" in out and "--plugin" in out
      and "'act'" in out, "loading without the plugin names it and how to load it: " + out[-500:])
# Another major version of the plugin
rc, out = kiln("run", W("sp.kiln"), "--plugin", SQUARE_PLUS_V2, "--inputs", W("sp_in.npz"))
check(rc == 4 and "another major version" in out and "2.0.0" in out,
      "a plugin of another major version is refused: " + out[-500:])
# An unknown op at import: the error points to the examples
rc, out = kiln("build", W("square_plus.onnx"), "-o", W("none.kiln"))
check(rc == 4 and "examples/plugins" in out and "SquarePlus" in out, "an unknown op's error points to examples/plugins: "
      + out[-500:])
# A plugin of another ABI major version
rc, out = kiln("build", W("square_plus.onnx"), "-o", W("none.kiln"), "--plugin", ABI_MAJOR)
check(rc != 0 and "ABI 2.0" in out, "a plugin of another ABI major version is refused: " + out[-400:])
# The reference interpreter runs the plugin op (kiln compare: engine against it)
rc, out = kiln("compare", W("square_plus.onnx"), "--plugin", SQUARE_PLUS, "--random-inputs", "--shapes", "x:3x16")
check(rc == 0, "kiln compare (reference interpreter vs engine) passes: " + out[-400:])

# --- RotaryEmbedding: build, run, numpy; the engine stores the cos/sin table
rc, out = kiln("build", W("rotary.onnx"), "-o", W("rope.kiln"), "--plugin", ROTARY)
check(rc == 0, "rotary builds: " + out[-400:])
rng = np.random.default_rng(2)
q = rng.standard_normal((1, 7, 3, 16)).astype(np.float32)
pos = np.array([[0, 1, 2, 3, 100, 200, 255]], dtype=np.int64)
np.savez(W("rope_in.npz"), q=q, pos=pos)
rc, out = kiln("run", W("rope.kiln"), "--plugin", ROTARY, "--inputs", W("rope_in.npz"), "--save-outputs",
               W("rope_out.npz"))
check(rc == 0, "the rotary engine runs: " + out[-400:])
if rc == 0:
    y = np.load(W("rope_out.npz"))["y"]
    want = make_models.rotary_ref(q, pos, 10000.0).transpose(0, 2, 1, 3)
    check(y.shape == (1, 3, 7, 16) and np.allclose(y, want, rtol=1e-4, atol=1e-5),
          f"rotary matches numpy (max err {np.abs(y - want).max():.2e})")
np.savez(W("rope_far.npz"), q=q, pos=np.array([[0, 1, 2, 3, 4, 5, 256]], dtype=np.int64))
rc, out = kiln("run", W("rope.kiln"), "--plugin", ROTARY, "--inputs", W("rope_far.npz"))
check(rc == 3 and "outside [0, max_positions = 256)" in out and "rope" in out,
      "a kernel's failure is an error naming the layer: " + out[-400:])
rc, out = kiln("compare", W("rotary.onnx"), "--plugin", ROTARY, "--random-inputs")
check(rc == 0, "kiln compare on the rotary model passes: " + out[-400:])
rc, out = kiln("run", W("rope.kiln"), "--inputs", W("rope_in.npz"))
check(rc == 4 and "kiln_example_rotary" in out, "the rotary engine without its plugin names it: " + out[-300:])
finish()
