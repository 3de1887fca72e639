"""pytest set-up for kiln's Python tests: kiln from the build tree unless it is installed, a private
engine cache, and the test models (built with python3-onnx's helpers, random weights)."""
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
try:
    import kiln  # noqa: F401  (installed, or PYTHONPATH=build/python)
except ImportError:  # the default build tree
    sys.path.insert(0, os.path.join(HERE, "..", "..", "build", "python"))
    import kiln  # noqa: F401

import models  # noqa: E402


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Each test its own InferenceSession engine cache."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def mlp_path(tmp_path):
    return models.save(models.mlp(), tmp_path / "mlp.onnx")


@pytest.fixture
def rng():
    return np.random.default_rng(0)
