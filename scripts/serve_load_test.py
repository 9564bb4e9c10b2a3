#!/usr/bin/env python3
"""Load test of an engine served by kiln.serve on Ray Serve, on loopback, bounded in requests and time.

  python3 scripts/serve_load_test.py --loadEngine=m.kiln [--replicas=2] [--requests=2000] [--clients=32]
      [--minRows=1] [--maxRows=8] [--maxBatch=32] [--batchWaitMs=2] [--via=http|handle] [--nodes=1]
      [--gpusPerReplica=0] [--contexts=1] [--batchBuckets=B1,..] [--clientProcesses=1] [--distinct=0]
      [--warmup=0] [--killReplicaAfter=N] [--rayPath=actor|grpc] [--rtol=1e-5] [--atol=1e-5]
      [--timeout=600] [--json=F]

Starts a local Ray cluster and deploys the engine (`kiln.serve.deployment`), then `--clients`
threads send `--requests` requests in all (HTTP POSTs of .npz bodies, or with --via=handle Python
DeploymentHandle calls) with minRows..maxRows batch rows and, where the profile lets a dim vary, two
shapes. Every answer is checked against a direct `ExecutionContext.run` of the same input in this
process (within rtol/atol: an FP16 engine's batched run may take other kernels than the direct
one). With --gpusPerReplica=1 each replica has a GPU of its own (Ray's placement); --warmup=N
requests go first, untimed, so that the timing leaves out each replica's first runs. A request that
fails for a reason a replica's death explains (5xx, a dropped connection, a handle's actor error) is
retried, at most 5 times. With --killReplicaAfter=N, one replica is killed once N requests are
answered; Ray Serve starts another. Prints requests sent, answered, refused, lost, retried and
answered twice; throughput; p50/p90/p99 latency; the batches the replicas formed. Exits 1 if any
request is lost, wrong or answered twice. --clientProcesses=P sends from P processes, each its own
Ray driver with --clients threads (one process's handle calls are bound by its interpreter);
--distinct=N makes N distinct requests and repeats them.
"""

import argparse
import collections
import concurrent.futures
import io
import json
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
    p.add_argument("--clients", type=int, default=32, help="concurrent clients (threads) in each client process")
    p.add_argument("--clientProcesses", type=int, default=1,
                   help="processes sending the requests, each its own Ray driver (a Python process's handle calls "
                        "are bound by its interpreter)")
    p.add_argument("--distinct", type=int, default=0, help="distinct requests (0: all); the rest repeat them")
    p.add_argument("--minRows", type=int, default=1)
    p.add_argument("--maxRows", type=int, default=8)
    p.add_argument("--maxBatch", type=int, default=32)
    p.add_argument("--batchWaitMs", type=float, default=2.0)
    p.add_argument("--contexts", type=int, default=1, help="execution contexts (worker threads) in each replica")
    p.add_argument("--batchBuckets", default="", help="B1,B2,..: each batch runs from its bucket's CUDA graph")
    p.add_argument("--killReplicaAfter", type=int, default=0)
    p.add_argument("--via", choices=("http", "handle"), default="http",
                   help="HTTP POSTs of .npz bodies through Ray's proxy, or Python DeploymentHandle calls")
    p.add_argument("--rayPath", choices=("actor", "grpc"), default="actor",
                   help="Ray Serve's request path (kiln.serve.ray_request_path): actor calls (Ray's default), or "
                        "gRPC (RAY_SERVE_THROUGHPUT_OPTIMIZED=1)")
    p.add_argument("--nodes", type=int, default=1, help="Ray nodes on this machine (a local multi-node cluster); "
                   "the replicas spread over them, one a node")
    p.add_argument("--gpusPerReplica", type=float, default=0.0, help="GPUs Ray gives each replica")
    p.add_argument("--warmup", type=int, default=0, help="requests sent first and left out of the figures")
    p.add_argument("--rtol", type=float, default=1e-5)
    p.add_argument("--atol", type=float, default=1e-5)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds the whole load may take")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the summary here")
    return p.parse_args(argv)


def make_requests(engine, n, min_rows, max_rows, seed):
    """n input dicts: batch rows min_rows..max_rows (within profile 0), the other dims min or opt."""
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
                rows = int(rng.integers(max(lo[0], min_rows), min(hi[0], max_rows) + 1))
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


class Load:
    """The requests (the first --distinct of them distinct, then repeated) with their expected
    answers from a direct run, and the counters of sending them."""

    def __init__(self, args, engine):
        self.args = args
        distinct = min(args.requests, args.distinct or args.requests)
        self.pool = make_requests(engine, distinct, args.minRows, args.maxRows, args.seed)
        direct = engine.create_execution_context()
        self.expected = [direct.run(r) for r in self.pool]
        self.answers = collections.Counter()
        self.wrong, self.refused, self.lost, self.latencies = [], [], [], []
        self.retried = 0
        self.lock = threading.Lock()
        self.on_answer = None  # called with the count answered so far (the kill of --killReplicaAfter)

    def request(self, i):
        return self.pool[i % len(self.pool)]

    def one(self, i, send, deadline):
        """Sends request i until it is answered (retrying a failure a replica's death explains, at
        most 5 times), refused, or past the deadline (lost)."""
        want = self.expected[i % len(self.pool)]
        for attempt in range(6):
            if time.monotonic() > deadline:
                break
            t0 = time.monotonic()
            status, out, err = send(self.request(i))
            if status == 200:
                ok = set(out) == set(want) and all(
                    out[k].shape == want[k].shape and np.allclose(out[k], want[k], rtol=self.args.rtol, atol=self.args.atol)
                    for k in out)
                with self.lock:
                    self.latencies.append(time.monotonic() - t0)
                    self.answers[i] += 1
                    if not ok:
                        self.wrong.append(i)
                    count = sum(self.answers.values())
                if self.on_answer is not None:
                    self.on_answer(count)
                return
            if status in (400, 429):  # the request's own fault, or a full queue: not retried
                with self.lock:
                    self.refused.append((i, status, err))
                return
            with self.lock:
                self.retried += 1
            time.sleep(0.2 * (attempt + 1))
        with self.lock:
            self.lost.append(i)

    def result(self):
        return {"answers": dict(self.answers), "wrong": self.wrong, "refused": self.refused, "lost": self.lost,
                "latencies": self.latencies, "retried": self.retried}


def sender(args, url, handle):
    if args.via == "http":
        return lambda r: post_npz(url, r, timeout=60)
    return lambda r: call_handle(handle, r)


def client_process(args, address, name, url, indices, ready, go, results):
    """One of --clientProcesses: its own Ray driver and DeploymentHandle (or HTTP client) and
    threads, sending `indices` once the parent says go; its counters onto `results`."""
    try:
        import kiln
        import kiln.serve

        kiln.serve.ray_request_path(args.rayPath)  # inherited from the parent; this process reads it at import
        import ray
        from ray import serve

        load = Load(args, kiln.Engine.load(args.loadEngine))
        handle = None
        if args.via == "handle":
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            handle = serve.get_app_handle(name)
        send = sender(args, url, handle)
        ready.put(None)
        go.wait()
        deadline = time.monotonic() + args.timeout
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(lambda i: load.one(i, send, deadline), indices))
        results.put(load.result())
    except BaseException as e:  # noqa: BLE001 (reported by the parent)
        ready.put(f"{type(e).__name__}: {e}")
        results.put({"error": f"{type(e).__name__}: {e}"})


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import kiln
    import kiln.serve

    # Ray Serve's request path (actor or grpc), for this driver and the cluster it starts.
    ray_env = kiln.serve.ray_request_path(args.rayPath)
    import ray
    from ray import serve

    engine = kiln.Engine.load(args.loadEngine)
    if args.minRows > args.maxRows:
        raise SystemExit(f"--minRows={args.minRows} is above --maxRows={args.maxRows}")
    if args.clientProcesses > 1 and args.killReplicaAfter:
        raise SystemExit("--killReplicaAfter needs --clientProcesses=1")
    load = Load(args, engine)
    port = kiln.serve._free_local_port()  # outside the ephemeral range Ray's processes take ports from
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
                                             wait_ms=args.batchWaitMs, contexts=args.contexts,
                                             batch_buckets=[int(b) for b in args.batchBuckets.split(",") if b] or None,
                                             gpus_per_replica=args.gpusPerReplica,
                                             max_replicas_per_node=1 if args.nodes > 1 else None),
                       name=name, route_prefix="/" + name)
    url = f"http://127.0.0.1:{port}/{name}"
    send = sender(args, url, handle)
    killed = [None]

    def on_answer(count):
        if count == args.killReplicaAfter and killed[0] is None:
            killed[0] = "pending"
            threading.Thread(target=lambda: killed.__setitem__(0, kill_one_replica(name)), daemon=True).start()

    if args.killReplicaAfter:
        load.on_answer = on_answer

    def replica_stats():
        """{pid: stats} of the replicas the handle reaches (it routes calls among them)."""
        got = {}
        for _ in range(8 * args.replicas):
            s = handle.stats.remote().result(timeout_s=30)
            got.setdefault(s["pid"], s)
        return got

    before = {}
    if args.warmup:  # untimed and unchecked, concurrent: the replicas' first runs of each batch size
        def warm(i):
            status, _, err = send(load.request(i))
            return None if status == 200 else f"warm-up request {i}: {status} {err}"

        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            failed = [m for m in pool.map(warm, range(args.warmup)) if m]
        for m in failed[:3]:
            print(m)
        before = replica_stats()

    order = list(range(args.requests))
    if args.clientProcesses > 1:
        import multiprocessing

        mp = multiprocessing.get_context("spawn")
        ready, results, go = mp.Queue(), mp.Queue(), mp.Event()
        procs = [mp.Process(target=client_process, daemon=True,
                            args=(args, ray.get_runtime_context().gcs_address, name, url, order[k::args.clientProcesses],
                                  ready, go, results)) for k in range(args.clientProcesses)]
        for p in procs:
            p.start()
        for _ in procs:
            r = ready.get(timeout=600)
            if r is not None:
                raise SystemExit(f"a client process failed to start: {r}")
        t_start = time.monotonic()
        go.set()
        parts = [results.get(timeout=args.timeout + 120) for _ in procs]
        elapsed = time.monotonic() - t_start
        for p in procs:
            p.join(timeout=30)
        for part in parts:
            if "error" in part:
                raise SystemExit(f"a client process failed: {part['error']}")
            load.answers.update(part["answers"])
            load.wrong += part["wrong"]
            load.refused += part["refused"]
            load.lost += part["lost"]
            load.latencies += part["latencies"]
            load.retried += part["retried"]
    else:
        deadline = time.monotonic() + args.timeout
        t_start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(lambda i: load.one(i, send, deadline), order))
        elapsed = time.monotonic() - t_start
    answers, wrong, refused, lost, latencies = load.answers, load.wrong, load.refused, load.lost, load.latencies
    rows_sent = sum(next(iter(load.request(i).values())).shape[0] for i in answers)

    # Each replica's counters (the handle routes the calls among them; one report per process).
    # (less what they had counted by the end of the warm-up).
    stats, formed, batched, pids, nodes = collections.Counter(), 0, 0, set(), set()
    compute = queued = engine_s = 0.0
    graphs = collections.Counter()  # the replicas' CUDA graph counters (with --batchBuckets)
    for pid, s in replica_stats().items():
        graphs.update(s.get("cuda_graphs", {}))
        b = before.get(pid, {"batch_rows": {}, "batches": 0, "requests": 0, "refused": 0, "errors": 0,
                             "compute_seconds": 0.0, "queue_seconds": 0.0, "engine_seconds": 0.0})
        compute += s["compute_seconds"] - b["compute_seconds"]
        engine_s += s["engine_seconds"] - b["engine_seconds"]
        queued += s["queue_seconds"] - b["queue_seconds"]
        pids.add(pid)
        nodes.add(s["node"])
        for rows, count in s["batch_rows"].items():
            stats[int(rows)] += count - b["batch_rows"].get(rows, 0)
        formed += s["batches"] - b["batches"]
        batched += (s["requests"] - s["refused"] - s["errors"]) - (b["requests"] - b["refused"] - b["errors"])
    stats = +stats  # drop the sizes the timed load never formed
    lat = np.array(sorted(latencies)) * 1000 if latencies else np.zeros(1)
    summary = {
        "requests": args.requests, "answered": len(answers), "refused": len(refused), "lost": len(lost),
        "retried": load.retried, "answered_twice": sum(1 for c in answers.values() if c > 1), "wrong": len(wrong),
        "killed_replica": killed[0], "seconds": round(elapsed, 3),
        "throughput_rps": round(len(answers) / elapsed, 1) if elapsed else 0.0,
        "throughput_rows_per_s": round(rows_sent / elapsed, 1) if elapsed else 0.0,
        "latency_ms": {"p50": round(float(np.percentile(lat, 50)), 3), "p90": round(float(np.percentile(lat, 90)), 3),
                       "p99": round(float(np.percentile(lat, 99)), 3)},
        "replicas_reporting": len(pids), "replica_nodes": len(nodes), "batches": formed, "batch_rows": dict(sorted(stats.items())),
        "mean_requests_per_batch": round(batched / formed, 2) if formed else 0.0,
        "mean_rows_per_batch": round(sum(r * c for r, c in stats.items()) / formed, 2) if formed else 0.0,
        # A replica's time in a batch's run (stacking the requests, the engine's run with its copies,
        # the split), the engine's run alone, and a request's time queued in its replica before
        # its batch started.
        "replica_run_ms_per_batch": round(1000 * compute / formed, 3) if formed else 0.0,
        "replica_engine_ms_per_batch": round(1000 * engine_s / formed, 3) if formed else 0.0,
        "replica_queue_ms_per_request": round(1000 * queued / batched, 3) if batched else 0.0,
        "cuda_graphs": dict(graphs),
        "ray_env": ray_env,
    }
    print(f"requests {summary['requests']}: answered {summary['answered']}, refused {summary['refused']}, "
          f"lost {summary['lost']}, retried {summary['retried']}, answered twice {summary['answered_twice']}, "
          f"wrong {summary['wrong']}" + (f"; killed {killed[0]}" if killed[0] else ""))
    print("Ray Serve's request path: " + ", ".join(f"{k}={v}" for k, v in ray_env.items()))
    print(f"throughput {summary['throughput_rps']} requests/s ({summary['throughput_rows_per_s']} rows/s) "
          f"over {summary['seconds']} s; latency ms p50 "
          f"{summary['latency_ms']['p50']} p90 {summary['latency_ms']['p90']} p99 {summary['latency_ms']['p99']}")
    print(f"batches formed by the {len(pids)} replicas now running, on {len(nodes)} node(s) (rows: count): "
          f"{summary['batch_rows']}; "
          f"mean requests per batch {summary['mean_requests_per_batch']}, rows {summary['mean_rows_per_batch']}; "
          f"a replica's run of a batch {summary['replica_run_ms_per_batch']} ms (the engine's "
          f"{summary['replica_engine_ms_per_batch']} ms), a request queued in it "
          f"{summary['replica_queue_ms_per_request']} ms")
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
