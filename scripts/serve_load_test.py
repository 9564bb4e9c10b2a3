#!/usr/bin/env python3
"""Load test of an engine served by kiln.serve on Ray Serve, on loopback, bounded in requests and time.

  python3 scripts/serve_load_test.py --loadEngine=m.kiln [--replicas=2] [--requests=2000] [--clients=32]
      [--maxRows=8] [--maxBatch=32] [--batchWaitMs=2] [--via=http|handle] [--nodes=1] [--killReplicaAfter=N]
      [--timeout=600] [--json=F]

Starts a local Ray cluster and deploys the engine (`kiln.serve.deployment`), then `--clients`
threads send `--requests` requests in all (HTTP POSTs of .npz bodies, or with --via=handle Python
DeploymentHandle calls) with 1..maxRows batch rows and, where the profile lets a dim vary, two
shapes. Every answer is checked against a direct
`ExecutionContext.run` of the same input in this process. A request that fails for a reason a
replica's death explains (5xx, a dropped connection, a handle's actor error) is retried, at most
5 times. With
--killReplicaAfter=N, one replica is killed once N requests are answered; Ray Serve starts another.
Prints requests sent, answered, refused, lost, retried and answered twice; throughput; p50/p90/p99
latency; the batches the replicas formed. Exits 1 if any request is lost, wrong or answered twice.
"""

import argparse
import collections
import concurrent.futures
import io
import json
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prefix_chars="-")
    p.add_argument("--loadEngine", required=True)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--maxRows", type=int, default=8)
    p.add_argument("--maxBatch", type=int, default=32)
    p.add_argument("--batchWaitMs", type=float, default=2.0)
    p.add_argument("--killReplicaAfter", type=int, default=0)
    p.add_argument("--via", choices=("http", "handle"), default="http",
                   help="HTTP POSTs of .npz bodies through Ray's proxy, or Python DeploymentHandle calls")
    p.add_argument("--nodes", type=int, default=1, help="Ray nodes on this machine (a local multi-node cluster); "
                   "the replicas spread over them, one a node")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds the whole load may take")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the summary here")
    return p.parse_args(argv)


def make_requests(engine, n, max_rows, seed):
    """n input dicts: batch rows 1..max_rows (within profile 0), the other dims min or opt."""
    import kiln

    rng = np.random.default_rng(seed)
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [m for m in names if engine.tensor_mode(m) == kiln.TensorIOMode.INPUT]
    shapes = {m: engine.profile_shape(m, 0) for m in inputs}
    out = []
    for i in range(n):
        variant = i % 2
        rows = None
        req = {}
        for m in inputs:
            lo, opt, hi = shapes[m]
            if rows is None:
                rows = int(rng.integers(lo[0], min(hi[0], max_rows) + 1))
            shape = (rows, *(opt[1:] if variant else lo[1:]))
            dt = np.dtype(engine.tensor_dtype(m))
            if dt.kind == "f":
                req[m] = rng.uniform(-1, 1, shape).astype(dt)
            elif dt.kind == "b":
                req[m] = rng.integers(0, 2, shape).astype(dt)
            else:
                req[m] = rng.integers(0, 4, shape).astype(dt)
        out.append(req)
    return out


def post_npz(url, inputs, timeout):
    buf = io.BytesIO()
    np.savez(buf, **inputs)
    req = urllib.request.Request(url, data=buf.getvalue(), headers={"Content-Type": "application/x-npz"},
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            with np.load(io.BytesIO(r.read())) as z:
                return r.status, {k: z[k] for k in z.files}, None
    except urllib.error.HTTPError as e:
        return e.code, None, e.read().decode(errors="replace")
    except (urllib.error.URLError, ConnectionError, OSError) as e:
        return None, None, str(e)


def call_handle(handle, inputs):
    """post_npz's (status, outputs, error) for a DeploymentHandle call: 400/429/504 for the
    request's own refusals, None for a failure a replica's death explains."""
    import kiln.serve

    try:
        return 200, handle.infer.remote(inputs).result(timeout_s=60), None
    except kiln.serve.QueueFullError as e:
        return 429, None, str(e)
    except kiln.serve.RequestTimeoutError as e:
        return 504, None, str(e)
    except kiln.InvalidArgumentError as e:
        return 400, None, str(e)
    except Exception as e:  # noqa: BLE001 (Ray's errors for a replica that died)
        return None, None, f"{type(e).__name__}: {e}"


def kill_one_replica(app_name):
    """Kills one of the application's replica actors (Ray Serve starts another); its name."""
    import ray

    for a in ray.util.list_named_actors(all_namespaces=True):
        if a["name"].startswith("SERVE_REPLICA::") and app_name in a["name"]:
            ray.kill(ray.get_actor(a["name"], namespace=a["namespace"]), no_restart=False)
            return a["name"]
    return "none found"


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import kiln
    import kiln.serve
    import ray
    from ray import serve

    engine = kiln.Engine.load(args.loadEngine)
    requests = make_requests(engine, args.requests, args.maxRows, args.seed)
    direct = engine.create_execution_context()
    expected = [direct.run(r) for r in requests]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cluster = None
    if args.nodes > 1:
        # Ray's local multi-node cluster: a head and more raylets of their own resources, one machine.
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
        for _ in range(args.nodes - 1):
            cluster.add_node(num_cpus=2)
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        cluster.wait_for_nodes()
    else:
        ray.init(num_cpus=max(4, args.replicas + 2), include_dashboard=False, logging_level="ERROR",
                 log_to_driver=False)
    # One HTTP proxy (on the head): every node of a local cluster has the same address.
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    name = "loadtest"
    handle = serve.run(kiln.serve.deployment(args.loadEngine, name=name, replicas=args.replicas, max_batch=args.maxBatch,
                                             wait_ms=args.batchWaitMs,
                                             max_replicas_per_node=1 if args.nodes > 1 else None),
                       name=name, route_prefix="/" + name)
    url = f"http://127.0.0.1:{port}/{name}"

    answers = collections.Counter()
    wrong, refused, lost, retried = [], [], [], 0
    latencies = []
    lock = threading.Lock()
    answered = [0]
    killed = [None]
    deadline = time.monotonic() + args.timeout

    def one(i):
        nonlocal retried
        for attempt in range(6):
            if time.monotonic() > deadline:
                break
            t0 = time.monotonic()
            if args.via == "http":
                status, out, err = post_npz(url, requests[i], timeout=60)
            else:
                status, out, err = call_handle(handle, requests[i])
            if status == 200:
                ok = set(out) == set(expected[i]) and all(
                    out[k].shape == expected[i][k].shape and np.allclose(out[k], expected[i][k], rtol=1e-5, atol=1e-5)
                    for k in out)
                with lock:
                    latencies.append(time.monotonic() - t0)
                    answers[i] += 1
                    answered[0] += 1
                    if not ok:
                        wrong.append(i)
                    if args.killReplicaAfter and answered[0] == args.killReplicaAfter and killed[0] is None:
                        killed[0] = "pending"
                        threading.Thread(target=lambda: killed.__setitem__(0, kill_one_replica(name)), daemon=True).start()
                return
            if status in (400, 429):  # the request's own fault, or a full queue: not retried
                with lock:
                    refused.append((i, status, err))
                return
            with lock:
                retried += 1
            time.sleep(0.2 * (attempt + 1))
        with lock:
            lost.append(i)

    order = list(range(len(requests)))
    t_start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
        list(pool.map(one, order))
    elapsed = time.monotonic() - t_start

    # Each replica's counters (the handle routes the calls among them; one report per process).
    stats, formed, batched, pids, nodes = collections.Counter(), 0, 0, set(), set()
    for _ in range(8 * args.replicas):
        s = handle.stats.remote().result(timeout_s=30)
        if s["pid"] in pids:
            continue
        pids.add(s["pid"])
        nodes.add(s["node"])
        for rows, count in s["batch_rows"].items():
            stats[int(rows)] += count
        formed += s["batches"]
        batched += s["requests"] - s["refused"] - s["errors"]
    lat = np.array(sorted(latencies)) * 1000 if latencies else np.zeros(1)
    summary = {
        "requests": len(requests), "answered": len(answers), "refused": len(refused), "lost": len(lost),
        "retried": retried, "answered_twice": sum(1 for c in answers.values() if c > 1), "wrong": len(wrong),
        "killed_replica": killed[0], "seconds": round(elapsed, 3),
        "throughput_rps": round(len(answers) / elapsed, 1) if elapsed else 0.0,
        "latency_ms": {"p50": round(float(np.percentile(lat, 50)), 3), "p90": round(float(np.percentile(lat, 90)), 3),
                       "p99": round(float(np.percentile(lat, 99)), 3)},
        "replicas_reporting": len(pids), "replica_nodes": len(nodes), "batches": formed, "batch_rows": dict(sorted(stats.items())),
        "mean_requests_per_batch": round(batched / formed, 2) if formed else 0.0,
    }
    print(f"requests {summary['requests']}: answered {summary['answered']}, refused {summary['refused']}, "
          f"lost {summary['lost']}, retried {summary['retried']}, answered twice {summary['answered_twice']}, "
          f"wrong {summary['wrong']}" + (f"; killed {killed[0]}" if killed[0] else ""))
    print(f"throughput {summary['throughput_rps']} requests/s over {summary['seconds']} s; latency ms p50 "
          f"{summary['latency_ms']['p50']} p90 {summary['latency_ms']['p90']} p99 {summary['latency_ms']['p99']}")
    print(f"batches formed by the {len(pids)} replicas now running, on {len(nodes)} node(s) (rows: count): "
          f"{summary['batch_rows']}; "
          f"mean requests per batch {summary['mean_requests_per_batch']}")
    for i, status, err in refused[:5]:
        print(f"refused request {i}: {status} {err}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    serve.shutdown()
    ray.shutdown()
    if cluster is not None:
        cluster.shutdown()
    bad = summary["lost"] or summary["wrong"] or summary["answered_twice"] or summary["refused"]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
