"""Serving one kiln engine to many callers: dynamic batching fitted to the engine's profiles.

A ``DynamicBatcher`` owns an engine's execution contexts and a bounded queue. ``submit`` checks a
request against the engine at once (a shape no profile holds is refused with the engine's own
error, never queued), then queues it; worker threads form batches of requests whose shapes agree
but for the batch dim, up to the largest batch a profile allows for that shape (and ``max_batch``),
waiting at most ``wait_ms`` after the oldest request for more. The context picks the profile as
Triton does: among those that hold the batch, the one whose opt shapes are nearest. Each caller
gets exactly its own rows back: outputs are split along the batch dim in request order.

A request can join a batch only where the engine says the batch dim is one: every input and output
has the same symbol as its first dim and nowhere else (``Engine.tensor_symbolic_shape``). Other
engines still serve, one request a run.

    batcher = kiln.serve.DynamicBatcher(engine, max_batch=32, wait_ms=2, contexts=2)
    future = batcher.submit({"x": x})          # concurrent.futures.Future
    outputs = future.result()                   # {"out": array of x's batch}
    batcher.close()

On Ray Serve (``pip install kiln[serve]``), ``deployment`` makes an application whose replicas
each load the engine once and run a batcher: Python handles (``await handle.infer.remote(inputs)``)
and HTTP POSTs of JSON, KServe v2 JSON, .npy or .npz bodies, answered in kind. Each replica's
counters go to Ray's metrics (``RayMetrics``: Ray's Prometheus endpoint).

    kiln.serve.ray_request_path("actor")        # before Ray starts: see there
    from ray import serve
    handle = serve.run(kiln.serve.deployment("model.kiln", replicas=2, max_batch=32))
    outputs = handle.infer.remote({"x": x}).result()
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import re
import threading
import time
from typing import Any, Mapping

import numpy as np

from . import _kiln
from ._errors import Error, InvalidArgumentError

__all__ = ["BatchPlan", "DynamicBatcher", "QueueFullError", "RayMetrics", "Replica", "RequestTimeoutError", "ServeStats",
           "decode_request", "deployment", "encode_response", "main"]

_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _free_local_port() -> int:
    """A loopback TCP port that is free now and outside the ranges others draw from while we start.

    A port the kernel hands out for ``bind(0)`` lies in its ephemeral range (32768-60999 on Linux),
    from which Ray's own processes also take ports as they start, so it may be gone by the time
    Serve's proxy binds it. This draws at random from 20000-32767, below the ephemeral range and
    above Ray's worker ports (10002-19999), and checks each candidate binds.
    """
    import random
    import socket

    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(20000, 32768)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise OSError("no free loopback port in 20000-32767 after 200 tries")


# Ray Serve's two request paths (Ray 2.56 and later). "actor" (Ray's default): a handle call is a
# Ray actor call, and a large array travels through the object store without a copy. "grpc"
# (RAY_SERVE_THROUGHPUT_OPTIMIZED=1): handle calls go to the replica over gRPC, which runs them on
# its own event loop, with the request path's logs buffered; each request is one gRPC message.
# Measured (scripts/serve_load_test.py --via=handle, 8-row requests, one replica): testmod_linear
# on 2 CPU cores (512-byte requests) 334 requests/s on grpc against 244 on actor; ResNet-50 FP16 on
# an H200 host (4.8 MB requests, 8 client processes) 242 against 457. So grpc is for small
# requests and actor stays the default. RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=1 keeps handles usable
# from plain threads (`.result()`) on grpc; without it a handle must be called from a running
# event loop. Either way the replica's gRPC message limit is raised from gRPC's 4 MB (Ray's
# default, which refuses an 8-row ResNet-50 request with RESOURCE_EXHAUSTED) to gRPC's largest.
RAY_PATH_ENV = {
    "grpc": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "1"},
    "actor": {},
}
_RAY_MESSAGE_LIMIT = {"RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": str(2**31 - 1)}


def ray_request_path(path: str = "actor") -> dict[str, str]:
    """Sets Ray Serve's request path ("actor" or "grpc", RAY_PATH_ENV) in this process's environment,
    leaving any of those variables the user set as they are, and returns the ones in force. Call it
    before this process imports ray.serve and before it starts Ray (the cluster's processes
    inherit the environment): `kiln serve --rayPath=` and scripts/serve_load_test.py do. A cluster
    joined by address keeps the environment it was started with."""
    import os
    import sys

    if path not in RAY_PATH_ENV:
        raise InvalidArgumentError(f"Ray Serve's request path is 'actor' or 'grpc', not {path!r}")
    wanted = {**RAY_PATH_ENV[path], **_RAY_MESSAGE_LIMIT}
    for key, value in wanted.items():
        os.environ.setdefault(key, value)
    if "ray.serve._private.constants" in sys.modules:
        import warnings

        from .session import KilnWarning

        warnings.warn("kiln.serve.ray_request_path: ray.serve was imported before it; this process keeps "
                      "the request path it read then", KilnWarning, stacklevel=2)
    keys = ["RAY_SERVE_THROUGHPUT_OPTIMIZED", *RAY_PATH_ENV["grpc"], *_RAY_MESSAGE_LIMIT]
    return {key: os.environ.get(key, "") for key in dict.fromkeys(keys)}


class QueueFullError(Error):
    """The batcher's queue holds ``queue_size`` requests already (HTTP 429)."""


class RequestTimeoutError(Error):
    """A request waited in the queue past its timeout and was dropped unrun (HTTP 504)."""


class BatchPlan:
    """What an engine allows a batcher: its inputs and outputs, the batch symbol, the batch limits."""

    def __init__(self, engine: Any):
        self.engine = engine
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.inputs = [n for n in names if engine.tensor_mode(n) == _kiln.TensorIOMode.INPUT]
        self.outputs = [n for n in names if engine.tensor_mode(n) == _kiln.TensorIOMode.OUTPUT]
        self.dtypes = {n: np.dtype(engine.tensor_dtype(n)) for n in self.inputs}
        self.batch_symbol = self._batch_symbol()
        self._checker = engine.create_execution_context()
        self._check_lock = threading.Lock()
        # A CUDA engine's batches are stacked into page-locked memory, which its run copies to the
        # device from where it lies (one host copy a batch instead of two).
        self._pinned = engine.device == _kiln.Device.CUDA

    def _buffer(self, count: int, dtype: np.dtype) -> np.ndarray:
        """A stacking buffer of `count` elements: page-locked for a CUDA engine where the memory is
        there to have, else a plain array."""
        if self._pinned:
            from . import empty_pinned

            try:
                return empty_pinned(count, dtype)
            except Error:
                self._pinned = False
        return np.empty(count, dtype=dtype)

    def _batch_symbol(self) -> str | None:
        if not self.inputs:
            return None
        symbol = None
        for name in self.inputs + self.outputs:
            if self.engine.is_shape_inference_io(name):
                return None
            dims = self.engine.tensor_symbolic_shape(name)
            if not dims or not _SYMBOL.fullmatch(dims[0]):
                return None
            if symbol is None:
                symbol = dims[0]
            if dims[0] != symbol:
                return None
            for d in dims[1:]:
                if symbol in _SYMBOL.findall(d):
                    return None
        return symbol

    def arrays(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The request's inputs as arrays of the engine's dtypes; refuses unknown or missing names."""
        unknown = sorted(set(inputs) - set(self.inputs))
        if unknown:
            raise InvalidArgumentError(f"unknown input(s) {unknown}; the engine's inputs are {self.inputs}")
        missing = [n for n in self.inputs if n not in inputs]
        if missing:
            raise InvalidArgumentError(f"missing input(s) {missing}; the engine's inputs are {self.inputs}")
        out = {}
        for name in self.inputs:
            a = np.asarray(inputs[name])
            if a.dtype != self.dtypes[name]:
                want = self.dtypes[name]
                numeric_to_float = a.dtype.kind in "iuf" and (want.kind == "f" or want.name == "bfloat16")
                if a.dtype.kind != want.kind and not numeric_to_float and not (a.dtype.kind in "iu" and want.kind in "iu"):
                    raise InvalidArgumentError(f"input '{name}' is {a.dtype}, the engine takes {self.dtypes[name]}")
                a = a.astype(self.dtypes[name])
            out[name] = np.ascontiguousarray(a)
        return out

    def check(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Raises the engine's own error when no profile holds these shapes."""
        with self._check_lock:
            for name, a in arrays.items():
                self._checker.set_input_shape(name, a.shape)
            self._checker.infer_shapes()

    def rows(self, arrays: Mapping[str, np.ndarray]) -> int:
        """The request's batch rows (1 where the engine has no batch dim)."""
        if self.batch_symbol is None:
            return 1
        return int(arrays[self.inputs[0]].shape[0]) if arrays[self.inputs[0]].ndim else 1

    def key(self, arrays: Mapping[str, np.ndarray]) -> tuple | None:
        """Requests of one key can share a batch; None: this one runs alone."""
        if self.batch_symbol is None:
            return None
        shapes = []
        for name in self.inputs:
            a = arrays[name]
            if a.ndim == 0 or a.shape[0] != arrays[self.inputs[0]].shape[0]:
                return None
            shapes.append(tuple(a.shape[1:]))
        return tuple(shapes)

    def max_batch(self, key: tuple) -> int:
        """The largest batch any profile holds for requests of this key (each input's other dims)."""
        best = 0
        for p in range(self.engine.num_profiles):
            limit = None
            for name, rest in zip(self.inputs, key):
                lo, _, hi = self.engine.profile_shape(name, p)
                if len(lo) != len(rest) + 1 or any(not (a <= d <= b) for a, d, b in zip(lo[1:], rest, hi[1:])):
                    limit = 0
                    break
                limit = hi[0] if limit is None else min(limit, hi[0])
            best = max(best, limit or 0)
        return best

    def run(self, context: Any, batch: list[dict[str, np.ndarray]], sizes: list[int],
            scratch: dict[str, np.ndarray] | None = None, times: list[float] | None = None) -> list[dict[str, np.ndarray]]:
        """One run of the requests of `batch` stacked along the batch dim; each one's rows back.
        `scratch` (one a worker) keeps the stacking buffers from run to run (grown, never shrunk;
        page-locked for a CUDA engine) instead of a new array a batch. `times` gets the seconds of the engine's run alone."""
        if len(batch) == 1:
            t0 = time.monotonic()
            out = context.run(batch[0])
            if times is not None:
                times.append(time.monotonic() - t0)
            return [out]
        stacked = {}
        for n in self.inputs:
            parts = [r[n] for r in batch]
            shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
            if scratch is None:
                stacked[n] = np.concatenate(parts, axis=0)
                continue
            count = int(np.prod(shape))
            buf = scratch.get(n)
            if buf is None or buf.size < count or buf.dtype != parts[0].dtype:
                buf = scratch[n] = self._buffer(count, parts[0].dtype)
            stacked[n] = np.concatenate(parts, axis=0, out=buf[:count].reshape(shape))
        t0 = time.monotonic()
        outputs = context.run(stacked)
        if times is not None:
            times.append(time.monotonic() - t0)
        total = sum(sizes)
        results: list[dict[str, np.ndarray]] = [{} for _ in batch]
        for name, value in outputs.items():
            if value.ndim == 0 or value.shape[0] != total:
                raise Error(f"output '{name}' of shape {value.shape} does not have the batch's {total} rows")
            start = 0
            for i, n in enumerate(sizes):
                results[i][name] = value[start:start + n]
                start += n
        return results


class ServeStats:
    """Counters of a batcher: requests, refusals, errors, requests dropped unrun (past their timeout
    or cancelled), the batches it formed (rows: count), and seconds: requests queued before their
    batch started (summed over requests), batches in a worker (stacking, the run, the split), and
    the engine's runs alone (ExecutionContext.run with its copies)."""

    def __init__(self, sink: Any = None):
        self.lock = threading.Lock()
        self.sink = sink  # also told of each event (RayMetrics on Ray Serve)
        self.requests = 0
        self.refused = 0
        self.errors = 0
        self.dropped = 0
        self.batches: collections.Counter[int] = collections.Counter()
        self.queue_seconds = 0.0
        self.compute_seconds = 0.0
        self.engine_seconds = 0.0
        self.sink_errors = 0

    def request(self, outcome: str) -> None:
        """A request submitted: "accepted", or refused: "invalid", "queue_full", "closed"."""
        with self.lock:
            self.requests += 1
            if outcome != "accepted":
                self.refused += 1
        self._tell("request", outcome)

    def dropped_one(self) -> None:
        """A queued request dropped unrun (its timeout passed, or its caller cancelled it)."""
        with self.lock:
            self.dropped += 1
        self._tell("dropped")

    def failed(self, requests: int) -> None:
        """A batch of `requests` whose run raised (each caller got the error)."""
        with self.lock:
            self.errors += requests
        self._tell("failed", requests)

    def formed(self, rows: int, queued: list[float], compute: float, engine: float) -> None:
        """A batch run: its rows, each request's seconds queued, the worker's and the engine's seconds."""
        with self.lock:
            self.batches[rows] += 1
            self.compute_seconds += compute
            self.engine_seconds += engine
            self.queue_seconds += sum(queued)
        self._tell("formed", rows, queued, compute, engine)

    def _tell(self, event: str, *args: Any) -> None:
        """The sink's method for `event`; a sink that raises is counted (sink_errors), never passed
        on: metrics must not fail a request or stop a worker."""
        if self.sink is None:
            return
        try:
            getattr(self.sink, event)(*args)
        except Exception:  # noqa: BLE001
            with self.lock:
                self.sink_errors += 1

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            formed = sum(self.batches.values())
            return {
                "requests": self.requests,
                "refused": self.refused,
                "errors": self.errors,
                "dropped": self.dropped,
                "batches": formed,
                "batch_rows": dict(sorted(self.batches.items())),
                "mean_batch_requests": (self.requests - self.refused - self.errors - self.dropped) / formed
                if formed else 0.0,
                "queue_seconds": self.queue_seconds,
                "compute_seconds": self.compute_seconds,
                "engine_seconds": self.engine_seconds,
                "sink_errors": self.sink_errors,
            }


_MS_BOUNDS = [0.25, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]


class RayMetrics:
    """A batcher's counters on Ray's metrics (its Prometheus endpoint, `ray_` before each name,
    tagged with the application, deployment and replica by Ray Serve):

    - kiln_requests_total{outcome}: accepted, invalid (no profile holds it, malformed), queue_full,
      closed;
    - kiln_requests_dropped_total: dropped unrun past their timeout or cancelled;
    - kiln_request_errors_total: requests whose batch's run raised;
    - kiln_batch_rows, kiln_batch_requests: histograms of the batches formed;
    - kiln_queue_ms: each request's time queued in the replica before its batch ran;
    - kiln_batch_ms, kiln_engine_ms: a batch's time in a worker (stacking, run, split) and the
      engine's run alone."""

    def __init__(self):
        from ray.serve.metrics import Counter, Histogram

        self._requests = Counter("kiln_requests", description="requests submitted, by outcome", tag_keys=("outcome",))
        self._dropped = Counter("kiln_requests_dropped", description="requests dropped unrun (timeout or cancelled)")
        self._errors = Counter("kiln_request_errors", description="requests whose batch's run raised")
        self._rows = Histogram("kiln_batch_rows", description="rows of each batch run",
                               boundaries=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512])
        self._per_batch = Histogram("kiln_batch_requests", description="requests in each batch run",
                                    boundaries=[1, 2, 4, 8, 16, 32, 64, 128])
        self._queue = Histogram("kiln_queue_ms", description="ms a request waited in the replica's queue",
                                boundaries=_MS_BOUNDS)
        self._batch = Histogram("kiln_batch_ms", description="ms of a batch in a worker (stack, run, split)",
                                boundaries=_MS_BOUNDS)
        self._engine = Histogram("kiln_engine_ms", description="ms of the engine's run of a batch",
                                 boundaries=_MS_BOUNDS)

    def request(self, outcome: str) -> None:
        self._requests.inc(tags={"outcome": outcome})

    def dropped(self) -> None:
        self._dropped.inc()

    def failed(self, requests: int) -> None:
        self._errors.inc(requests)

    def formed(self, rows: int, queued: list[float], compute: float, engine: float) -> None:
        self._rows.observe(rows)
        self._per_batch.observe(len(queued))
        for q in queued:
            self._queue.observe(1000.0 * q)
        self._batch.observe(1000.0 * compute)
        self._engine.observe(1000.0 * engine)


class _Request:
    __slots__ = ("arrays", "rows", "key", "future", "arrived", "deadline")

    def __init__(self, arrays, rows, key, timeout):
        self.arrays = arrays
        self.rows = rows
        self.key = key
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.arrived = time.monotonic()
        self.deadline = None if timeout is None else self.arrived + timeout


class DynamicBatcher:
    """Batches requests to one engine across ``contexts`` worker threads (one context each)."""

    def __init__(self, engine: Any, *, max_batch: int | None = None, wait_ms: float = 2.0, contexts: int = 1,
                 queue_size: int = 1024, batch_buckets: list[int] | None = None, metrics: Any = None):
        if contexts < 1 or queue_size < 1 or wait_ms < 0 or (max_batch is not None and max_batch < 1):
            raise InvalidArgumentError("contexts and queue_size must be at least 1, wait_ms at least 0, "
                                       "max_batch at least 1")
        made = [engine.create_execution_context() for _ in range(contexts)]
        if batch_buckets:
            # Each batch runs at its bucket from a CUDA graph (ExecutionContext.batch_buckets: the
            # inputs padded with zero rows, only the batch's own rows copied back); refused, with
            # the reason, where the engine or its backend cannot.
            for c in made:
                c.use_cuda_graph = True
                c.batch_buckets = [int(b) for b in batch_buckets]
        self.batch_buckets = list(batch_buckets or [])
        self.plan = BatchPlan(engine)
        self.max_batch = max_batch
        self.wait = wait_ms / 1000.0
        self.queue_size = queue_size
        self.stats = ServeStats(metrics)
        self._queue: collections.deque[_Request] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._limits: dict[tuple, int] = {}
        self._graphs: dict[int, dict[str, int]] = {}  # each worker's context's CUDA graph counters
        self._workers = [threading.Thread(target=self._work, args=(c, i), name=f"kiln-serve-{i}", daemon=True)
                         for i, c in enumerate(made)]
        for w in self._workers:
            w.start()

    def submit(self, inputs: Mapping[str, Any], timeout: float | None = None) -> concurrent.futures.Future:
        """Queues one request; refuses at once (raising) what no profile holds or a full queue. A
        request still queued `timeout` seconds later is dropped (RequestTimeoutError), and so is
        one whose future the caller cancelled; a request already running is answered."""
        if timeout is not None and not timeout > 0:
            raise InvalidArgumentError(f"timeout must be positive seconds, not {timeout!r}")
        try:
            arrays = self.plan.arrays(inputs)
            self.plan.check(arrays)
        except Error:
            self.stats.request("invalid")
            raise
        key = self.plan.key(arrays)
        request = _Request(arrays, self.plan.rows(arrays), key, timeout)
        with self._cond:
            outcome = "closed" if self._closed else "queue_full" if len(self._queue) >= self.queue_size else "accepted"
            if outcome == "accepted":
                self._queue.append(request)
                self._cond.notify()
        self.stats.request(outcome)
        if outcome == "closed":
            raise Error("the batcher is closed")
        if outcome == "queue_full":
            raise QueueFullError(f"the queue holds {self.queue_size} requests; try again later")
        return request.future

    def run(self, inputs: Mapping[str, Any], timeout: float | None = None) -> dict[str, np.ndarray]:
        """submit, then wait for the answer (a queue timeout of `timeout` too)."""
        return self.submit(inputs, timeout).result(timeout)

    def close(self) -> None:
        """Stops taking requests, answers every queued one, and joins the workers."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for w in self._workers:
            w.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _limit(self, key: tuple | None) -> int:
        if key is None:
            return 1
        if key not in self._limits:
            limit = self.plan.max_batch(key)
            self._limits[key] = max(1, min(limit, self.max_batch) if self.max_batch else limit)
        return self._limits[key]

    def _take(self) -> list[_Request] | None:
        """The next batch: the oldest request and the later ones of its key that fit, once the batch
        is full or the oldest has waited `wait`; None when closed and empty."""
        with self._cond:
            while True:
                if not self._queue:
                    if self._closed:
                        return None
                    self._cond.wait()
                    continue
                self._drop_expired()
                if not self._queue:
                    continue
                first = self._queue[0]
                limit = self._limit(first.key)
                # The oldest always goes, even with more rows than max_batch (a profile holds it).
                rows, batch = first.rows, [first]
                if first.key is not None:
                    for r in itertools.islice(self._queue, 1, None):
                        if rows >= limit:
                            break
                        if r.key == first.key and rows + r.rows <= limit:
                            batch.append(r)
                            rows += r.rows
                waited = time.monotonic() - first.arrived
                if rows >= limit or waited >= self.wait or self._closed or first.key is None:
                    for r in batch:
                        self._queue.remove(r)
                    # A caller that cancelled since keeps its cancellation; the rest are running.
                    return [r for r in batch if r.future.set_running_or_notify_cancel()]
                # Wake for the batch's wait or the first queued deadline, whichever comes first.
                now = time.monotonic()
                wake = min([self.wait - waited] + [r.deadline - now for r in self._queue if r.deadline is not None])
                self._cond.wait(max(wake, 0.0))

    def _drop_expired(self) -> None:
        """Drops queued requests past their deadline or cancelled (under the lock)."""
        now = time.monotonic()
        for r in [r for r in self._queue if r.future.cancelled() or (r.deadline is not None and now >= r.deadline)]:
            self._queue.remove(r)
            self.stats.dropped_one()
            if not r.future.cancelled():
                r.future.set_exception(RequestTimeoutError(
                    f"the request waited {now - r.arrived:.3f} s in the queue, past its timeout; it did not run"))

    def graph_stats(self) -> dict[str, int]:
        """The workers' CUDA graph counters summed (captures, replays, evictions, cached), as of
        each one's last batch; zeros without batch buckets."""
        total = {"captures": 0, "replays": 0, "evictions": 0, "cached": 0}
        with self.stats.lock:
            for g in self._graphs.values():
                for k in total:
                    total[k] += g.get(k, 0)
        return total

    def _work(self, context: Any, index: int) -> None:
        scratch: dict[str, np.ndarray] = {}
        times: list[float] = []
        while True:
            batch = self._take()
            if batch is None:
                return
            if not batch:  # every request of it was cancelled
                continue
            start = time.monotonic()
            try:
                times.clear()
                results = self.plan.run(context, [r.arrays for r in batch], [r.rows for r in batch], scratch, times)
            except BaseException as e:  # noqa: BLE001 (every caller of the batch gets the error)
                self.stats.failed(len(batch))
                for r in batch:
                    r.future.set_exception(e)
                continue
            self.stats.formed(sum(r.rows for r in batch), [start - r.arrived for r in batch],
                              time.monotonic() - start, sum(times))
            if self.batch_buckets:  # read by this worker, which alone runs the context
                graphs = dict(context.cuda_graph_stats)
                with self.stats.lock:
                    self._graphs[index] = graphs
            for r, out in zip(batch, results):
                r.future.set_result(out)


# ---- Ray Serve ----

_V2_TYPES = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
             "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
             "FP32": np.float32, "FP64": np.float64}
_V2_NAMES = {np.dtype(t): n for n, t in _V2_TYPES.items()}


def decode_request(body: bytes, content_type: str) -> tuple[dict[str, np.ndarray], str]:
    """The inputs of an HTTP body and the form to answer in: "v2" (KServe v2 / Triton JSON:
    {"inputs": [{"name", "shape", "datatype", "data"}]}), "json" ({"inputs": {name: nested lists}}),
    "npy" (one input, numpy's .npy) or "npz" (named arrays, numpy's .npz). Raises
    InvalidArgumentError naming what is malformed."""
    import io
    import json

    kind = content_type.split(";")[0].strip().lower()
    try:
        if kind in ("application/x-npy", "application/npy"):
            return {"": np.load(io.BytesIO(body), allow_pickle=False)}, "npy"
        if kind in ("application/x-npz", "application/npz", "application/octet-stream"):
            with np.load(io.BytesIO(body), allow_pickle=False) as z:
                return {k: z[k] for k in z.files}, "npz"
        doc = json.loads(body)
    except Exception as e:  # noqa: BLE001 (numpy and json raise many types for a bad body)
        raise InvalidArgumentError(f"the request body is not valid {kind or 'JSON'}: {e}") from None
    if not isinstance(doc, dict) or "inputs" not in doc:
        raise InvalidArgumentError('a JSON request is {"inputs": {name: values}} or KServe v2\'s {"inputs": [...]}')
    inputs = doc["inputs"]
    if isinstance(inputs, dict):
        try:
            return {str(k): np.asarray(v) for k, v in inputs.items()}, "json"
        except Exception as e:  # noqa: BLE001
            raise InvalidArgumentError(f"an input is not a rectangular array: {e}") from None
    if not isinstance(inputs, list):
        raise InvalidArgumentError('"inputs" must be an object of arrays or a KServe v2 list')
    out = {}
    for i, t in enumerate(inputs):
        if not isinstance(t, dict) or not {"name", "shape", "datatype", "data"} <= set(t):
            raise InvalidArgumentError(f"inputs[{i}] needs name, shape, datatype and data (KServe v2)")
        if t["datatype"] not in _V2_TYPES:
            raise InvalidArgumentError(f"inputs[{i}] ('{t['name']}'): datatype {t['datatype']!r} is not one of {sorted(_V2_TYPES)}")
        try:
            shape = [int(d) for d in t["shape"]]
            a = np.asarray(t["data"], dtype=_V2_TYPES[t["datatype"]])
            out[str(t["name"])] = a.reshape(shape)
        except Exception as e:  # noqa: BLE001
            raise InvalidArgumentError(f"inputs[{i}] ('{t.get('name')}'): {e}") from None
    return out, "v2"


def encode_response(outputs: Mapping[str, np.ndarray], form: str) -> tuple[bytes, str]:
    """The body and content type of an answer in the request's form."""
    import io
    import json

    if form == "npy" and len(outputs) == 1:
        buf = io.BytesIO()
        np.save(buf, next(iter(outputs.values())), allow_pickle=False)
        return buf.getvalue(), "application/x-npy"
    if form in ("npy", "npz"):
        buf = io.BytesIO()
        np.savez(buf, **outputs)
        return buf.getvalue(), "application/x-npz"
    if form == "v2":
        doc = {"outputs": [{"name": n, "shape": list(a.shape), "datatype": _V2_NAMES.get(a.dtype, str(a.dtype)),
                            "data": a.reshape(-1).tolist()} for n, a in outputs.items()]}
    else:
        doc = {"outputs": {n: a.tolist() for n, a in outputs.items()}}
    return json.dumps(doc).encode(), "application/json"


class Replica:
    """One serving replica: the engine loaded once, a DynamicBatcher over its contexts, HTTP and
    Python entry points. Ray Serve runs it as a deployment (``deployment()``); it also runs alone."""

    def __init__(self, engine: Any, *, max_batch: int | None = None, wait_ms: float = 2.0, contexts: int = 1,
                 queue_size: int = 1024, batch_buckets: list[int] | None = None):
        from ._kiln import Engine

        if isinstance(engine, (bytes, bytearray, memoryview)):
            engine = Engine.deserialize(bytes(engine))
        elif not isinstance(engine, Engine):
            engine = Engine.load(str(engine))
        metrics = None
        try:
            import ray

            if ray.is_initialized():  # a replica of Ray Serve (alone, Replica has no metrics)
                metrics = RayMetrics()
        except ImportError:
            pass
        self.batcher = DynamicBatcher(engine, max_batch=max_batch, wait_ms=wait_ms, contexts=contexts,
                                      queue_size=queue_size, batch_buckets=batch_buckets, metrics=metrics)

    async def infer(self, inputs: Mapping[str, Any], timeout_ms: float | None = None) -> dict[str, np.ndarray]:
        """The Python handle's call: ``handle.infer.remote({"x": array}).result()``; a request still
        queued after timeout_ms is dropped unrun (RequestTimeoutError)."""
        import asyncio

        timeout = None if timeout_ms is None else timeout_ms / 1000.0
        return await asyncio.wrap_future(self.batcher.submit(inputs, timeout))

    async def __call__(self, request: Any) -> Any:
        """HTTP: POST a body decode_request reads (header X-Kiln-Timeout-Ms: the most it may wait
        queued); 400 for a malformed request or shape, 429 when the queue is full, 504 past its
        timeout, 503 once closed, 500 for an error while running."""
        from starlette.responses import JSONResponse, Response

        try:
            if request.method != "POST":
                return JSONResponse({"error": "POST the inputs (JSON, KServe v2 JSON, .npy or .npz)"}, status_code=405)
            inputs, form = decode_request(await request.body(), request.headers.get("content-type", "application/json"))
            if form == "npy":
                if len(self.batcher.plan.inputs) != 1:
                    raise InvalidArgumentError(f"a .npy body holds one input; the engine takes {self.batcher.plan.inputs}")
                inputs = {self.batcher.plan.inputs[0]: inputs[""]}
            header = request.headers.get("x-kiln-timeout-ms")
            try:
                timeout_ms = None if header is None else float(header)
            except ValueError:
                raise InvalidArgumentError(f"X-Kiln-Timeout-Ms: {header!r} is not a number of milliseconds") from None
            outputs = await self.infer(inputs, timeout_ms)
        except QueueFullError as e:
            return JSONResponse({"error": str(e)}, status_code=429)
        except RequestTimeoutError as e:
            return JSONResponse({"error": str(e)}, status_code=504)
        except InvalidArgumentError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        except Error as e:
            return JSONResponse({"error": str(e)}, status_code=503 if "closed" in str(e) else 500)
        body, content_type = encode_response(outputs, form)
        return Response(body, media_type=content_type)

    def stats(self) -> dict[str, Any]:
        """The batcher's counters, this replica's process id (a replica Ray restarts has another) and
        its Ray node."""
        import os

        node = None
        try:
            import ray

            node = ray.get_runtime_context().get_node_id()
        except Exception:  # noqa: BLE001 (outside Ray: no node)
            pass
        return {**self.batcher.stats.snapshot(), "cuda_graphs": self.batcher.graph_stats(), "pid": os.getpid(),
                "node": node}

    def check_health(self) -> None:
        """Ray Serve's health check: every worker thread alive."""
        if not all(w.is_alive() for w in self.batcher._workers):
            raise RuntimeError("a kiln worker thread has stopped")


def deployment(engine: Any, *, name: str = "kiln", replicas: int | str = 1, gpus_per_replica: float = 0,
               max_batch: int | None = None, wait_ms: float = 2.0, contexts: int = 1, queue_size: int = 1024,
               max_replicas_per_node: int | None = None, batch_buckets: list[int] | None = None):
    """A Ray Serve application serving `engine` (a path every node reads, or the engine file's
    bytes, which Ray keeps in its object store): ``serve.run(kiln.serve.deployment("m.kiln"))``.
    replicas: a count, or "auto" (Ray's autoscaling, 1 to 8 replicas by queued requests);
    max_replicas_per_node spreads them over the cluster's nodes; batch_buckets (CUDA engines) runs
    each batch from the CUDA graph of its bucket, padded (DynamicBatcher)."""
    from ray import serve

    options: dict[str, Any] = {"name": name, "max_ongoing_requests": queue_size,
                               "ray_actor_options": {"num_gpus": gpus_per_replica, "num_cpus": 1}}
    if max_replicas_per_node is not None:
        options["max_replicas_per_node"] = int(max_replicas_per_node)
    if replicas == "auto":
        options["autoscaling_config"] = {"min_replicas": 1, "max_replicas": 8, "target_ongoing_requests": 2 * (max_batch or 8)}
    else:
        if int(replicas) < 1:
            raise InvalidArgumentError(f"replicas must be at least 1 or 'auto', not {replicas!r}")
        options["num_replicas"] = int(replicas)
    cls = serve.deployment(**options)(Replica)
    return cls.bind(engine, max_batch=max_batch, wait_ms=wait_ms, contexts=contexts, queue_size=queue_size,
                    batch_buckets=batch_buckets)


# ---- kiln serve ----

_USAGE = """usage: kiln serve (--loadEngine=m.kiln | --onnx=m.onnx [kiln build flags]) [--replicas=N|auto]
                  [--gpusPerReplica=G] [--maxBatch=B] [--batchWaitMs=T] [--contexts=C] [--queueSize=Q]
                  [--batchBuckets=B1,B2,..] [--host=127.0.0.1] [--port=8000] [--route=/] [--name=kiln]
                  [--address=RAY_ADDRESS] [--duration=SECONDS] [--rayPath=actor|grpc]

Serves an engine on Ray Serve: starts a local Ray cluster (or joins --address), deploys the replicas
and answers HTTP POSTs on http://HOST:PORT/ROUTE (JSON, KServe v2 JSON, .npy or .npz bodies) until
interrupted (or for --duration seconds). With --onnx, `kiln build` makes the engine first from the
build flags given (--minShapes/--optShapes/--maxShapes, --fp16, ...). --batchBuckets (a CUDA
engine) runs each batch from the CUDA graph of the next bucket up, padded with zero rows, as
`kiln bench --batchBuckets` does. --rayPath=grpc takes Ray Serve's throughput-optimized request
path (gRPC to the replicas: faster for small requests, slower for large arrays, which the default
"actor" path passes through Ray's object store)."""


def _kiln_binary() -> str:
    import os
    import shutil
    from pathlib import Path

    packaged = Path(__file__).resolve().parent / "bin" / "kiln"
    if packaged.is_file():
        return str(packaged)
    found = os.environ.get("KILN_BINARY") or shutil.which("kiln")
    if not found:
        raise InvalidArgumentError("--onnx needs the kiln command-line tool to build the engine (not found)")
    return found


def main(argv: list[str] | None = None) -> int:
    """`kiln serve` (and `python -m kiln.serve`): returns the exit status (0 ok, 1 failure, 2 usage)."""
    import os
    import signal
    import subprocess
    import sys
    import tempfile

    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(_USAGE)
        return 0
    own = {"loadEngine": None, "onnx": None, "replicas": "1", "gpusPerReplica": "0", "maxBatch": None,
           "batchWaitMs": "2", "contexts": "1", "queueSize": "1024", "host": "127.0.0.1", "port": "8000",
           "route": "/", "name": "kiln", "address": None, "duration": None, "batchBuckets": None,
           "rayPath": "actor"}
    build_flags = []
    for a in args:
        key, eq, value = a[2:].partition("=")
        if not a.startswith("--") or (key in own and not eq):
            sys.stderr.write(f"kiln serve: '{a}' is not a flag this command takes (--name=value)\n\n{_USAGE}\n")
            return 2
        if key in own:
            own[key] = value
        else:
            build_flags.append(a)  # for kiln build, which checks it
    if (own["loadEngine"] is None) == (own["onnx"] is None):
        sys.stderr.write(f"kiln serve: give --loadEngine or --onnx (one of them)\n\n{_USAGE}\n")
        return 2
    if build_flags and own["onnx"] is None:
        sys.stderr.write(f"kiln serve: {build_flags[0]} is a build flag; it needs --onnx\n\n{_USAGE}\n")
        return 2
    try:
        numbers = {k: float(own[k]) for k in ("gpusPerReplica", "batchWaitMs")}
        ints = {k: int(own[k]) for k in ("contexts", "queueSize", "port") if own[k] is not None}
        max_batch = int(own["maxBatch"]) if own["maxBatch"] else None
        duration = float(own["duration"]) if own["duration"] else None
        replicas = own["replicas"] if own["replicas"] == "auto" else int(own["replicas"])
        buckets = [int(b) for b in own["batchBuckets"].split(",")] if own["batchBuckets"] else None
    except ValueError as e:
        sys.stderr.write(f"kiln serve: a number flag has a value that is not a number: {e}\n")
        return 2
    if buckets is not None and any(b < 1 for b in buckets):
        sys.stderr.write(f"kiln serve: --batchBuckets={own['batchBuckets']}: each bucket is a batch of at least 1\n")
        return 2
    if own["rayPath"] not in RAY_PATH_ENV:
        sys.stderr.write(f"kiln serve: --rayPath={own['rayPath']}: Ray Serve's request path is actor or grpc\n")
        return 2
    if not 0 < ints["port"] < 65536:
        sys.stderr.write(f"kiln serve: --port={ints['port']} is not a port (1..65535)\n")
        return 2
    engine = own["loadEngine"]
    try:
        if engine is None:
            tmp = tempfile.mkdtemp(prefix="kiln-serve-")
            engine = os.path.join(tmp, "engine.kiln")
            cmd = [_kiln_binary(), "build", f"--onnx={own['onnx']}", f"--saveEngine={engine}", *build_flags]
            print("kiln serve: building:", " ".join(cmd), flush=True)
            if subprocess.run(cmd).returncode != 0:
                sys.stderr.write("kiln serve: kiln build failed (above)\n")
                return 1
        # The engine is checked here, before Ray starts: a bad file fails fast with its reason.
        from ._kiln import Engine

        loaded = Engine.load(engine)
        if buckets:  # refused here, with the engine's reason, rather than in every replica
            probe = loaded.create_execution_context()
            probe.use_cuda_graph = True
            probe.batch_buckets = buckets
            del probe
        ray_request_path(own["rayPath"])
        import ray
        from ray import serve

        ray.init(address=own["address"], include_dashboard=False, logging_level="ERROR")
        # Ctrl-C and SIGTERM stop serving cleanly, also while the deployment starts (installed
        # after ray.init, which sets handlers of its own).
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        serve.start(http_options={"host": own["host"], "port": ints["port"]})
        app = deployment(engine, name=own["name"], replicas=replicas, gpus_per_replica=numbers["gpusPerReplica"],
                         max_batch=max_batch, wait_ms=numbers["batchWaitMs"], contexts=ints["contexts"],
                         queue_size=ints["queueSize"], batch_buckets=buckets)
        serve.run(app, name=own["name"], route_prefix=own["route"])
        print(f"kiln serve: {own['name']} on http://{own['host']}:{ints['port']}{own['route']} "
              f"({replicas} replica(s)); Ctrl-C stops", flush=True)
        deadline = None if duration is None else time.monotonic() + duration
        while not stop.wait(0.2) and (deadline is None or time.monotonic() < deadline):
            pass
        print("kiln serve: stopping", flush=True)
        serve.shutdown()
        ray.shutdown()
        return 0
    except ImportError as e:
        sys.stderr.write(f"kiln serve: Ray Serve is not installed ({e}); pip install 'kiln[serve]'\n")
        return 1
    except Error as e:
        sys.stderr.write(f"kiln serve: error: {e}\n")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
