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


class _Ticker:
    """A thread counting its iterations while `active` is set. With the GIL held by a C++ call it gets
    at most one iteration in (between the flag being set and the call, at a GIL switch); with the
    GIL released it ticks every ~0.5 ms while the call runs."""

    def __init__(self):
        self.active = False
        self.ticks = 0
        self.stop = False
        self.thread = threading.Thread(target=self._loop)

    def _loop(self):
        while not self.stop:
            if self.active:
                self.ticks += 1
            time.sleep(0.0005)

    def during(self, call, attempts=5):
        """The most ticks seen during one of `attempts` calls (stops at 3)."""
        best = 0
        self.thread.start()
        try:
            for _ in range(attempts):
                self.ticks = 0
                self.active = True
                call()
                self.active = False
                best = max(best, self.ticks)
                if best >= 3:
                    break
        finally:
            self.stop = True
            self.thread.join()
        return best


def test_other_threads_progress_while_run_is_in_flight(tmp_path):
    engine, x = _heavy(tmp_path)
    ctx = engine.create_context()
    ctx.run({"x": x})  # first run at this shape out of the way
    assert _Ticker().during(lambda: ctx.run({"x": x})) >= 3


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
    assert _Ticker().during(lambda: kiln._kiln._build(path, False, "{}")) >= 3


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
