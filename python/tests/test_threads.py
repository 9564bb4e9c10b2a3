# One engine, four threads each running its own context: same results as one thread, and the GIL
# is released while kiln runs (another Python thread keeps going).
import threading
import time

import numpy as np

import kiln
from conftest import built_engine, require_models


def test_four_threads_match_one_thread():
    require_models()
    engine = built_engine("mobilenet_v3_small")
    rng = np.random.default_rng(3)
    batches = [rng.uniform(-1, 1, (b, 3, 224, 224)).astype(np.float32) for b in (1, 2, 3, 4)]
    serial = engine.create_execution_context()
    expected = [serial.run({"x": x})["linear_1"] for x in batches]
    results = [[None] * 3 for _ in range(4)]
    errors = []

    def worker(t):
        try:
            context = engine.create_execution_context()
            for r in range(3):  # rotate through batches so threads run different shapes at once
                results[t][r] = context.run({"x": batches[(t + r) % 4]})["linear_1"]
        except BaseException as e:  # noqa: BLE001 (reported below, from the main thread)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for t in range(4):
        for r in range(3):
            np.testing.assert_array_equal(results[t][r], expected[(t + r) % 4])


def test_gil_is_released_while_running():
    require_models()
    engine = built_engine("vit_tiny")
    context = engine.create_execution_context()
    x = np.zeros((8, 3, 224, 224), np.float32)
    context.run({"x": x})  # warm up, so the timed run is the steady state
    ticks = 0
    done = threading.Event()

    def run():
        context.run({"x": x})
        done.set()

    worker = threading.Thread(target=run)
    start = time.perf_counter()
    worker.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    worker.join()
    elapsed = time.perf_counter() - start
    # With the GIL held for the whole run the loop could not tick until run() returned.
    assert ticks >= max(3, int(elapsed * 1000 * 0.2)), (ticks, elapsed)


def test_one_context_shared_by_threads_is_refused_not_raced():
    require_models()
    engine = built_engine("vit_tiny")
    context = engine.create_execution_context()
    x = np.zeros((16, 3, 224, 224), np.float32)
    ran = []

    def run():
        while not ran:  # the main thread may hold the context at the moment this one arrives
            try:
                ran.append(context.run({"x": x})["linear_16"].shape)
            except kiln.InvalidArgumentError:
                time.sleep(0.001)

    worker = threading.Thread(target=run)
    refused = 0
    worker.start()
    while worker.is_alive():
        try:
            context.set_input_shape("x", (1, 3, 224, 224))
        except kiln.InvalidArgumentError as e:
            assert "in use by another thread" in str(e)
            refused += 1
        time.sleep(0.002)
    worker.join()
    assert ran == [(16, 1000)]
    assert refused > 0, "a second thread entered a context that was running"
    assert context.run({"x": x[:2]})["linear_16"].shape == (2, 1000)  # usable afterwards
