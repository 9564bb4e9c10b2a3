# kiln.serve.DynamicBatcher on the shared testmod_linear (x: [batch_size, seq_len, 16], batch 1..10):
# batches form across callers, each caller gets exactly its rows (equal to a direct run of its own
# input), and what no profile holds, malformed requests and a full queue are refused at once.
import concurrent.futures
import os
import threading

import numpy as np
import pytest

import kiln
import kiln.serve
from conftest import built_engine, require_models


def test_concurrent_callers_share_batches_and_get_their_own_rows():
    require_models()
    engine = built_engine("testmod_linear")
    direct = engine.create_execution_context()
    rng = np.random.default_rng(40)
    requests = [rng.uniform(-1, 1, (1 + i % 4, (3, 5)[i % 2], 16)).astype(np.float32) for i in range(240)]
    expected = [direct.run({"x": x})["cat"] for x in requests]
    answers = [None] * len(requests)
    with kiln.serve.DynamicBatcher(engine, wait_ms=5, contexts=2) as batcher:
        assert batcher.plan.batch_symbol == "batch_size"

        def client(c):
            for i in range(c, len(requests), 16):
                answers[i] = batcher.submit({"x": requests[i]}).result(timeout=60)["cat"]

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(client, range(16)))
        stats = batcher.stats.snapshot()
    for i, (got, want) in enumerate(zip(answers, expected)):
        assert got.shape == want.shape, i
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"request {i}")
    assert stats["requests"] == 240 and stats["refused"] == 0 and stats["errors"] == 0
    # Batches of one shape only, never past the profile's 10 rows, and several callers per batch.
    assert max(stats["batch_rows"]) <= 10
    assert stats["mean_batch_requests"] > 1.5, stats


def test_refusals_name_what_was_wrong():
    require_models()
    engine = built_engine("testmod_linear")
    with kiln.serve.DynamicBatcher(engine) as batcher:
        with pytest.raises(kiln.InvalidArgumentError, match=r"dim 0 \(batch_size\) = 11 is outside the range \[1, 10\]"):
            batcher.submit({"x": np.zeros((11, 2, 16), np.float32)})
        with pytest.raises(kiln.InvalidArgumentError, match=r"unknown input\(s\) \['y'\]"):
            batcher.submit({"x": np.zeros((1, 2, 16), np.float32), "y": np.zeros(1)})
        with pytest.raises(kiln.InvalidArgumentError, match=r"missing input\(s\) \['x'\]"):
            batcher.submit({})
        with pytest.raises(kiln.InvalidArgumentError, match="is bool, the engine takes float32"):
            batcher.submit({"x": np.zeros((1, 2, 16), bool)})
        with pytest.raises(kiln.InvalidArgumentError, match="dim 2"):
            batcher.submit({"x": np.zeros((1, 2, 17), np.float32)})
        assert batcher.stats.snapshot()["refused"] == 5
        # The batcher still serves after refusals.
        assert batcher.run({"x": np.ones((2, 2, 16), np.float32)}, timeout=30)["cat"].shape == (2, 3, 8)


def test_a_full_queue_refuses_and_close_answers_what_was_queued():
    require_models()
    engine = built_engine("testmod_linear")
    # A long wait: the worker holds the oldest request back for more, so the queue stays full.
    batcher = kiln.serve.DynamicBatcher(engine, wait_ms=60_000, queue_size=2)
    x = np.ones((1, 4, 16), np.float32)
    first, second = batcher.submit({"x": x}), batcher.submit({"x": x})
    with pytest.raises(kiln.serve.QueueFullError, match="the queue holds 2 requests"):
        batcher.submit({"x": x})
    closer = threading.Thread(target=batcher.close)
    closer.start()
    closer.join(timeout=30)
    assert not closer.is_alive()
    want = engine.create_execution_context().run({"x": x})["cat"]
    for f in (first, second):
        np.testing.assert_allclose(f.result(timeout=1)["cat"], want, rtol=1e-6, atol=1e-6)
    assert batcher.stats.snapshot()["batch_rows"] == {2: 1}  # the two formed one batch
    with pytest.raises(kiln.Error, match="closed"):
        batcher.submit({"x": x})


def test_a_request_larger_than_max_batch_runs_alone():
    require_models()
    engine = built_engine("testmod_linear")
    x = np.random.default_rng(1).uniform(-1, 1, (7, 3, 16)).astype(np.float32)
    with kiln.serve.DynamicBatcher(engine, max_batch=2) as batcher:
        got = batcher.run({"x": x}, timeout=30)["cat"]
        assert batcher.plan.max_batch(((3, 16),)) == 10
    np.testing.assert_allclose(got, engine.create_execution_context().run({"x": x})["cat"], rtol=1e-6, atol=1e-6)


def test_queued_requests_past_their_timeout_or_cancelled_are_dropped_unrun():
    require_models()
    engine = built_engine("testmod_linear")
    batcher = kiln.serve.DynamicBatcher(engine, wait_ms=60_000)  # holds the oldest back for more
    x = np.ones((1, 4, 16), np.float32)
    late = batcher.submit({"x": x}, timeout=0.2)
    with pytest.raises(kiln.serve.RequestTimeoutError, match="past its timeout; it did not run"):
        late.result(timeout=30)
    cancelled = batcher.submit({"x": x})
    assert cancelled.cancel()
    kept = batcher.submit({"x": x})
    with pytest.raises(kiln.InvalidArgumentError, match="timeout must be positive"):
        batcher.submit({"x": x}, timeout=0)
    batcher.close()  # answers what is still queued
    np.testing.assert_allclose(kept.result(timeout=1)["cat"], engine.create_execution_context().run({"x": x})["cat"],
                               rtol=1e-6, atol=1e-6)
    stats = batcher.stats.snapshot()
    assert stats["dropped"] == 2 and stats["batch_rows"] == {1: 1}, stats


def test_answers_outlive_the_reused_stacking_buffer():
    # An engine whose outputs are the input passed through (Identity) or viewed (Reshape): if an
    # output aliased the worker's stacking buffer, which it reuses for the next batch, an answer
    # already given would change under its caller. Batches of 1..8 rows, growing and shrinking.
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [-1, 12])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["same"]), helper.make_node("Reshape", ["x", "shape"], ["flat"])],
        "views", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 4])],
        [helper.make_tensor_value_info("same", TensorProto.FLOAT, ["n", 3, 4]),
         helper.make_tensor_value_info("flat", TensorProto.FLOAT, ["n", 12])], initializer=[shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    config = kiln.BuilderConfig()
    profile = kiln.OptimizationProfile()
    profile.set_dimensions("x", (1, 3, 4), (4, 3, 4), (8, 3, 4))
    config.add_profile(profile)
    engine = kiln.Builder(kiln.Device.CPU).build(kiln.onnx.parse_bytes(model), config)
    rng = np.random.default_rng(7)
    requests = [rng.uniform(-1, 1, (1 + i % 3, 3, 4)).astype(np.float32) for i in range(120)]
    answers = []
    with kiln.serve.DynamicBatcher(engine, wait_ms=5, contexts=1) as batcher:
        start, burst = 0, 0
        while start < len(requests):  # bursts of 1..6 requests: batches form, the next reuses the buffer
            burst = burst % 6 + 1
            futures = [batcher.submit({"x": x}) for x in requests[start:start + burst]]
            answers += [f.result(timeout=60) for f in futures]
            start += burst
        stats = batcher.stats.snapshot()
    for i, (x, got) in enumerate(zip(requests, answers)):
        np.testing.assert_array_equal(got["same"], x, err_msg=f"request {i}")
        np.testing.assert_array_equal(got["flat"], x.reshape(-1, 12), err_msg=f"request {i}")
    assert len(stats["batch_rows"]) > 1 and max(stats["batch_rows"]) <= 8, stats
    assert stats["mean_batch_requests"] > 1.5, stats
    assert 0 < stats["engine_seconds"] <= stats["compute_seconds"], stats


class RecordingSink:
    """What RayMetrics is told, recorded (the same calls, no Ray)."""

    def __init__(self):
        self.events = []

    def request(self, outcome):
        self.events.append(("request", outcome))

    def dropped(self):
        self.events.append(("dropped",))

    def failed(self, requests):
        self.events.append(("failed", requests))

    def formed(self, rows, queued, compute, engine):
        assert len(queued) >= 1 and all(q >= 0 for q in queued) and 0 <= engine <= compute
        self.events.append(("formed", rows, len(queued)))


def test_metrics_are_told_every_outcome_and_batch():
    require_models()
    engine = built_engine("testmod_linear")
    sink = RecordingSink()
    batcher = kiln.serve.DynamicBatcher(engine, wait_ms=60_000, queue_size=3, metrics=sink)
    x = np.ones((1, 4, 16), np.float32)
    with pytest.raises(kiln.InvalidArgumentError):
        batcher.submit({"x": np.zeros((11, 2, 16), np.float32)})
    late = batcher.submit({"x": x}, timeout=0.2)
    with pytest.raises(kiln.serve.RequestTimeoutError):
        late.result(timeout=30)
    kept = [batcher.submit({"x": x}) for _ in range(3)]
    with pytest.raises(kiln.serve.QueueFullError):
        batcher.submit({"x": x})
    batcher.close()
    with pytest.raises(kiln.Error, match="closed"):
        batcher.submit({"x": x})
    assert all(f.result(timeout=1)["cat"].shape[0] == 1 for f in kept)
    assert sink.events == [("request", "invalid"), ("request", "accepted"), ("dropped",)] + \
        [("request", "accepted")] * 3 + [("request", "queue_full"), ("formed", 3, 3), ("request", "closed")]
    stats = batcher.stats.snapshot()
    assert stats["requests"] == 7 and stats["refused"] == 3 and stats["dropped"] == 1, stats

    # A run that raises: every caller gets the error, and the sink counts its requests.
    sink = RecordingSink()
    with kiln.serve.DynamicBatcher(engine, wait_ms=50, metrics=sink) as failing:
        def broken(*args, **kwargs):
            raise kiln.Error("the engine failed")

        failing.plan.run = broken
        futures = [failing.submit({"x": x}) for _ in range(2)]
        for f in futures:
            with pytest.raises(kiln.Error, match="the engine failed"):
                f.result(timeout=30)
    assert ("failed", 2) in sink.events or sink.events.count(("failed", 1)) == 2, sink.events
    assert failing.stats.snapshot()["errors"] == 2


def test_batch_buckets_are_refused_with_the_reason_where_there_are_no_graphs():
    require_models()
    engine = built_engine("testmod_linear")  # CPU: no CUDA graphs to pad for
    with pytest.raises(kiln.InvalidArgumentError, match="the cpu backend has none"):
        kiln.serve.DynamicBatcher(engine, batch_buckets=[2, 4])


def test_a_sink_that_raises_fails_no_request_and_stops_no_worker():
    require_models()
    engine = built_engine("testmod_linear")

    class Broken:
        def __getattr__(self, name):
            def fail(*args):
                raise RuntimeError("the metrics backend is down")
            return fail

    x = np.ones((2, 3, 16), np.float32)
    want = engine.create_execution_context().run({"x": x})["cat"]
    with kiln.serve.DynamicBatcher(engine, wait_ms=1, metrics=Broken()) as batcher:
        for _ in range(3):
            np.testing.assert_allclose(batcher.run({"x": x}, timeout=30)["cat"], want, rtol=1e-6, atol=1e-6)
        stats = batcher.stats.snapshot()
    assert stats["requests"] == 3 and stats["batches"] == 3 and stats["sink_errors"] == 6, stats


@pytest.mark.filterwarnings("ignore::kiln.KilnWarning")  # ray.serve may be imported by an earlier test
def test_ray_request_path_sets_rays_variables_and_keeps_the_users(monkeypatch):
    limit = "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH"
    for key in ["RAY_SERVE_THROUGHPUT_OPTIMIZED", "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP", limit]:
        monkeypatch.delenv(key, raising=False)
    # actor (Ray's default path): only gRPC's 4 MB message limit is raised
    assert kiln.serve.ray_request_path("actor") == {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "",
                                                    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "", limit: "2147483647"}
    assert "RAY_SERVE_THROUGHPUT_OPTIMIZED" not in os.environ
    monkeypatch.setenv(limit, "1000")  # the user's own
    assert kiln.serve.ray_request_path("grpc") == {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
                                                   "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "1", limit: "1000"}
    assert os.environ["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1" and os.environ[limit] == "1000"
    with pytest.raises(kiln.InvalidArgumentError, match="'actor' or 'grpc', not 'http'"):
        kiln.serve.ray_request_path("http")
