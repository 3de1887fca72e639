"""The GIL is released while engines build and run: Python threads run contexts concurrently.

Speed is measured in bench/python_overhead.py --parallel (timings stay out of tests); here the
release is checked functionally: another thread makes progress while run() is in flight, and two
threads running their own contexts get the serial results."""
import threading
import time

import numpy as np

import kiln
import models


def _heavy(tmp_path):
    engine = kiln.build(models.save(models.matmul_chain(512, 8), tmp_path / "chain.onnx"))
    x = np.random.default_rng(2).standard_normal((512, 512)).astype(np.float32)
    return engine, x


def test_other_threads_progress_while_run_is_in_flight(tmp_path):
    engine, x = _heavy(tmp_path)
    ctx = engine.create_context()
    ctx.run({"x": x})  # first run at this shape out of the way
    state = {"running": False, "ticks_during_run": 0, "stop": False}

    def ticker():
        while not state["stop"]:
            if state["running"]:
                state["ticks_during_run"] += 1
            time.sleep(0.0005)

    t = threading.Thread(target=ticker)
    t.start()
    try:
        for _ in range(5):
            state["running"] = True
            ctx.run({"x": x})  # the ticker only advances if run() let go of the GIL
            state["running"] = False
            if state["ticks_during_run"] >= 5:
                break
    finally:
        state["stop"] = True
        t.join()
    assert state["ticks_during_run"] >= 5, state  # with the GIL held: at most one tick per run


def test_two_threads_two_contexts_match_serial(tmp_path):
    engine, x = _heavy(tmp_path)
    xs = [x, x[::-1].copy()]
    serial = [engine.create_context().run({"x": v})["y"] for v in xs]
    results = [None, None]
    errors = []

    def work(i):
        try:
            ctx = engine.create_context()
            for _ in range(3):
                results[i] = ctx.run({"x": xs[i]})["y"]
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for got, want in zip(results, serial):
        np.testing.assert_array_equal(got, want)


def test_build_releases_the_gil(tmp_path):
    path = models.save(models.matmul_chain(256, 4), tmp_path / "chain.onnx")
    state = {"building": True, "ticks": 0}

    def ticker():
        while state["building"]:
            state["ticks"] += 1
            time.sleep(0.0005)

    t = threading.Thread(target=ticker)
    t.start()
    try:
        kiln.build(path)
    finally:
        state["building"] = False
        t.join()
    assert state["ticks"] >= 20, state  # a build of this model takes hundreds of ticker periods


def test_thread_count_is_process_wide():
    """kiln.set_threads in one thread applies to kernels run from every thread (OpenMP alone keeps
    the count per thread)."""
    before = kiln.threads()
    seen = []
    try:
        kiln.set_threads(1)
        t = threading.Thread(target=lambda: seen.append(kiln.threads()))
        t.start()
        t.join()
        assert seen == [1]
    finally:
        kiln.set_threads(before)
