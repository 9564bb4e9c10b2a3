#!/usr/bin/env python3
"""Ray Serve's own cost a request beside kiln's: a deployment that returns its input (no engine, no
batching) and a kiln.serve deployment of ENGINE (one input), each sent the same handle calls (the
input at 8 rows and its profile's opt shape otherwise, `threads` callers) on one local Ray cluster,
alternately `rounds` times.

  python3 bench/serve_floor.py ENGINE [requests=1500] [threads=16] [rounds=2] [gpus=0]

KILN_RAY_PATH=grpc takes Ray Serve's gRPC request path (kiln.serve.ray_request_path) for both.
(gpus: the GPUs Ray gives kiln's replica; a CUDA engine needs 1, as Ray hides the GPUs from a
replica that asks for none.)

Prints requests a second for each, every round. Where the two are close, a replica's ceiling is
Ray Serve's handling of a request, not kiln's batcher or engine."""

import concurrent.futures
import os
import sys
import time

import numpy as np


def main(argv):
    import kiln
    import kiln.serve

    print("Ray Serve's request path:", kiln.serve.ray_request_path(os.environ.get("KILN_RAY_PATH", "actor")))
    import ray
    from ray import serve

    engine_path = argv[0]
    n = int(argv[1]) if len(argv) > 1 else 1500
    threads = int(argv[2]) if len(argv) > 2 else 16
    rounds = int(argv[3]) if len(argv) > 3 else 2
    gpus = float(argv[4]) if len(argv) > 4 else 0.0
    engine = kiln.Engine.load(engine_path)
    name = engine.get_tensor_name(0)
    if engine.num_io_tensors - sum(1 for i in range(engine.num_io_tensors)
                                   if engine.tensor_mode(engine.get_tensor_name(i)) == kiln.TensorIOMode.OUTPUT) != 1:
        raise SystemExit("serve_floor.py: the engine must have one input")
    _, opt, hi = engine.profile_shape(name, 0)
    x = {name: np.ones((min(8, hi[0]), *opt[1:]), np.dtype(engine.tensor_dtype(name)))}

    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR", log_to_driver=False)

    @serve.deployment(max_ongoing_requests=1024, ray_actor_options={"num_cpus": 1})
    class Echo:
        async def infer(self, inputs):
            return dict(inputs)

    def load(handle):
        for _ in range(50):
            handle.infer.remote(x).result()
        t = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda i: handle.infer.remote(x).result(), range(n)))
        return n / (time.monotonic() - t)

    results = {"echo": [], "kiln": []}
    for _ in range(rounds):
        results["echo"].append(load(serve.run(Echo.bind(), name="echo", route_prefix="/echo")))
        serve.delete("echo")
        app = kiln.serve.deployment(engine_path, name="kiln", replicas=1, max_batch=64, wait_ms=2,
                                    gpus_per_replica=gpus)
        results["kiln"].append(load(serve.run(app, name="kiln", route_prefix="/kiln")))
        serve.delete("kiln")
    serve.shutdown()
    ray.shutdown()
    for k, v in results.items():
        print(f"{k}: " + ", ".join(f"{r:.1f}" for r in v) + " requests/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
