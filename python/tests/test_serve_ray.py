# kiln.serve on Ray Serve (requirements-serve.txt): the shared testmod_linear engine file deployed
# with 2 replicas on a local Ray cluster, on loopback. Python handles and HTTP (JSON, KServe v2
# JSON, .npy, .npz) from concurrent clients each get the direct run's answer for their own input;
# replicas form batches; malformed requests and shapes outside the profile get 400 with the reason;
# the replicas' counters reach Ray's Prometheus endpoint. All on Ray Serve's gRPC request path
# (`kiln serve --rayPath=grpc`); test_serve_load.py runs the default (actor) path.
import concurrent.futures
import contextlib
import io
import json
import os
import urllib.error
import urllib.request
import warnings

import numpy as np
import pytest

import kiln
import kiln.serve
from conftest import built_engine, require_models



@contextlib.contextmanager
def grpc_request_path():
    """Ray Serve's gRPC request path (`kiln serve --rayPath=grpc`) in the environment while Ray reads
    it (ray.serve's import here, ray.init's processes), then the environment as it was, so that
    other tests' subprocesses keep Ray's default path."""
    saved = dict(os.environ)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kiln.KilnWarning)  # at ray.init, ray.serve is imported
        kiln.serve.ray_request_path("grpc")
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


with grpc_request_path():
    ray = pytest.importorskip("ray", reason="Ray Serve is not installed (pip install -r requirements-serve.txt)")
    serve = pytest.importorskip("ray.serve")


METRICS = {}  # the port of Ray's Prometheus endpoint, set by the app fixture


free_port = kiln.serve._free_local_port


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    require_models()
    engine = built_engine("testmod_linear")
    path = tmp_path_factory.mktemp("serve") / "testmod_linear.kiln"
    engine.save(str(path))
    port = free_port()
    METRICS["port"] = free_port()
    with grpc_request_path():
        ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                 _metrics_export_port=METRICS["port"], _system_config={"metrics_report_interval_ms": 500})
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    handle = serve.run(kiln.serve.deployment(str(path), name="linear", replicas=2, wait_ms=5, contexts=1),
                       name="linear", route_prefix="/linear")
    yield engine, handle, f"http://127.0.0.1:{port}/linear"
    serve.shutdown()
    ray.shutdown()


def post(url, body, content_type):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers.get("Content-Type"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read()


def test_handles_from_concurrent_clients_get_their_own_rows(app):
    engine, handle, _ = app
    direct = engine.create_execution_context()
    rng = np.random.default_rng(7)
    requests = [rng.uniform(-1, 1, (1 + i % 4, (2, 6)[i % 2], 16)).astype(np.float32) for i in range(200)]
    expected = [direct.run({"x": x})["cat"] for x in requests]

    def call(i):
        return handle.infer.remote({"x": requests[i]}).result(timeout_s=60)["cat"]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(call, range(len(requests))))
    for i, (got, want) in enumerate(zip(answers, expected)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"request {i}")
    stats = [handle.stats.remote().result(timeout_s=30) for _ in range(8)]
    assert max(s["batches"] for s in stats) > 0
    assert any(s["mean_batch_requests"] > 1 for s in stats), stats


def test_http_forms_answer_in_kind(app):
    engine, _, url = app
    x = np.random.default_rng(3).uniform(-1, 1, (3, 4, 16)).astype(np.float32)
    want = engine.create_execution_context().run({"x": x})["cat"]

    status, ctype, body = post(url, json.dumps({"inputs": {"x": x.tolist()}}).encode(), "application/json")
    assert status == 200 and ctype == "application/json", body
    np.testing.assert_allclose(np.asarray(json.loads(body)["outputs"]["cat"], np.float32), want, rtol=1e-6, atol=1e-6)

    v2 = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1).tolist()}]}
    status, _, body = post(url, json.dumps(v2).encode(), "application/json")
    out = json.loads(body)["outputs"][0]
    assert status == 200 and out["name"] == "cat" and out["datatype"] == "FP32" and out["shape"] == list(want.shape)
    np.testing.assert_allclose(np.asarray(out["data"], np.float32).reshape(out["shape"]), want, rtol=1e-6, atol=1e-6)

    buf = io.BytesIO()
    np.save(buf, x)
    status, ctype, body = post(url, buf.getvalue(), "application/x-npy")
    assert status == 200 and ctype == "application/x-npy"
    np.testing.assert_array_equal(np.load(io.BytesIO(body)), want)

    buf = io.BytesIO()
    np.savez(buf, x=x)
    status, ctype, body = post(url, buf.getvalue(), "application/x-npz")
    assert status == 200 and ctype == "application/x-npz"
    np.testing.assert_array_equal(np.load(io.BytesIO(body))["cat"], want)


@pytest.mark.parametrize("body, content_type, reason", [
    (b"{not json", "application/json", "not valid application/json"),
    (b'{"x": [1]}', "application/json", '{"inputs"'),
    (json.dumps({"inputs": {"x": np.zeros((11, 2, 16)).tolist()}}).encode(), "application/json",
     r"dim 0 \(batch_size\) = 11 is outside the range \[1, 10\]"),
    (json.dumps({"inputs": {"y": [1.0]}}).encode(), "application/json", r"unknown input\(s\) \['y'\]"),
    (json.dumps({"inputs": [{"name": "x", "shape": [1, 2, 16], "datatype": "FP99", "data": [0]}]}).encode(),
     "application/json", "datatype 'FP99'"),
    (json.dumps({"inputs": [{"name": "x", "shape": [1, 2, 16], "datatype": "FP32", "data": [0, 1]}]}).encode(),
     "application/json", "cannot reshape"),
    (b"\x93NUMPY garbage", "application/x-npy", "not valid application/x-npy"),
])
def test_malformed_requests_get_400_with_the_reason(app, body, content_type, reason):
    _, _, url = app
    status, ctype, answer = post(url, body, content_type)
    assert status == 400 and ctype == "application/json", (status, answer)
    assert pytest.importorskip("re").search(reason, json.loads(answer)["error"]), answer


def scrape(port):
    """{(name, frozenset of label pairs but Ray's own): value} of the kiln_ series Ray exports."""
    import re

    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    series = {}
    for line in body.splitlines():
        m = re.match(r"(ray_kiln_\w+)\{(.*)\} (\S+)$", line)
        if m:
            labels = frozenset((k, v) for k, v in re.findall(r'(\w+)="([^"]*)"', m.group(2))
                               if k in ("outcome", "le", "deployment"))
            series[(m.group(1), labels)] = series.get((m.group(1), labels), 0.0) + float(m.group(3))
    return series


def total(series, name, **labels):
    want = set(labels.items())
    return sum(v for (n, ls), v in series.items() if n == name and want <= set(ls))


def test_replica_counters_reach_rays_prometheus_endpoint(app):
    import time

    _, handle, url = app

    def read():
        series = scrape(METRICS["port"])
        return {"accepted": total(series, "ray_kiln_requests_total", outcome="accepted"),
                "invalid": total(series, "ray_kiln_requests_total", outcome="invalid"),
                "queue_full": total(series, "ray_kiln_requests_total", outcome="queue_full"),
                "all": total(series, "ray_kiln_requests_total", deployment="linear"),
                "batches": total(series, "ray_kiln_batch_rows_count"),
                # (Ray's histogram sums are of bucket midpoints: the buckets tell the rows.)
                "one_row": total(series, "ray_kiln_batch_rows_bucket", le="1.0"),
                "two_rows": total(series, "ray_kiln_batch_rows_bucket", le="2.0"),
                "queued": total(series, "ray_kiln_queue_ms_count"),
                "batch_ms": total(series, "ray_kiln_batch_ms_count"),
                "engine_ms": total(series, "ray_kiln_engine_ms_count")}

    def settled(want=None):
        """Counters once they agree with each other and stay the same over two reads 1.2 s apart
        (Ray reports every 500 ms here, each replica on its own) and, given `want`, once
        want(counters) holds."""
        deadline = time.monotonic() + 60
        last = None
        while True:
            got = read()
            ok = (got == last and got["queued"] == got["accepted"] and got["batch_ms"] == got["engine_ms"] == got["batches"]
                  and got["all"] == got["accepted"] + got["invalid"] + got["queue_full"])
            if (ok and (want is None or want(got))) or time.monotonic() > deadline:
                return got
            last = got
            time.sleep(1.2)

    before = settled()
    x = np.ones((2, 3, 16), np.float32)
    for _ in range(20):  # one after another: each is a batch of its 2 rows
        handle.infer.remote({"x": x}).result(timeout_s=60)
    status, _, _ = post(url, json.dumps({"inputs": {"x": np.zeros((11, 2, 16)).tolist()}}).encode(), "application/json")
    assert status == 400
    after = settled(lambda got: got["accepted"] >= before["accepted"] + 20 and got["invalid"] > before["invalid"])
    d = {k: after[k] - before[k] for k in after}
    # Every request accepted was queued and ran in a batch with both its times; the 20 requests made
    # 20 batches of 2 rows; the invalid one is counted as such.
    assert d["accepted"] == 20 and d["invalid"] == 1 and d["queue_full"] == 0, (before, after)
    assert d["batches"] == 20 and d["one_row"] == 0 and d["two_rows"] == 20, (before, after)
    assert d["queued"] == 20 and d["batch_ms"] == d["engine_ms"] == 20, (before, after)
