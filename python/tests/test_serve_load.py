# scripts/serve_load_test.py against a 2-replica Ray Serve deployment of the shared testmod_linear
# (built for batch 1..64): 2,000 requests from 32 concurrent clients with 1..8 rows, each answer
# equal to the direct run; then the same with one replica killed mid-run (Ray Serve starts another,
# the requests it held are retried): nothing lost, nothing answered twice; and the same on Ray's
# local two-node cluster (a second raylet on this machine), one replica on each node; and through
# Python DeploymentHandles with a replica killed. The steady run has 200 untimed warm-up requests
# first, which the figures (and the batch histogram) leave out. Ray Serve's default (actor) request
# path, and its gRPC path (--rayPath=grpc) for handles with a replica killed.
import json
import os
import pathlib
import subprocess
import sys

import pytest

import kiln
from conftest import model_path, require_models

pytest.importorskip("ray", reason="Ray Serve is not installed (pip install -r requirements-serve.txt)")
SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "serve_load_test.py"


@pytest.fixture(scope="module")
def engine_file(tmp_path_factory):
    require_models()
    network = kiln.onnx.parse_file(model_path("testmod_linear"))
    config = kiln.BuilderConfig()
    profile = kiln.OptimizationProfile()
    profile.set_dimensions("x", (1, 1, 16), (8, 4, 16), (64, 10, 16))
    config.add_profile(profile)
    path = tmp_path_factory.mktemp("load") / "linear64.kiln"
    kiln.Builder(kiln.Device.CPU).build(network, config).save(str(path))
    return path


@pytest.mark.parametrize("kill, nodes, via, path", [(0, 1, "http", "actor"), (600, 1, "http", "actor"), (0, 2, "http", "actor"),
                                                   (600, 1, "handle", "actor"), (600, 1, "handle", "grpc")],
                         ids=["steady", "replica_killed", "two_nodes", "handles_replica_killed", "grpc_handles_replica_killed"])
def test_load_loses_nothing(engine_file, tmp_path, kill, nodes, via, path):
    out = tmp_path / "summary.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_SERVE_")}  # the path the flag asks for
    r = subprocess.run([sys.executable, str(SCRIPT), f"--loadEngine={engine_file}", "--replicas=2", "--requests=2000",
                        "--clients=32", "--maxRows=8", "--batchWaitMs=10", f"--killReplicaAfter={kill}", f"--nodes={nodes}", f"--via={via}",
                        f"--rayPath={path}", "--timeout=900", f"--json={out}"]
                       + (["--warmup=200"] if not kill and nodes == 1 and via == "http" else []),
                       capture_output=True, text=True, timeout=1200, env=env)
    summary = json.loads(out.read_text()) if out.exists() else {}
    print(r.stdout[-2000:])
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert summary["answered"] == 2000 and summary["lost"] == 0 and summary["wrong"] == 0
    assert summary["answered_twice"] == 0 and summary["refused"] == 0
    rows = summary["batch_rows"]
    mean_rows = sum(int(k) * v for k, v in rows.items()) / sum(rows.values())
    assert mean_rows > 2, rows
    assert summary["mean_requests_per_batch"] > 1, summary
    assert summary["batches"] <= 2000 and sum(rows.values()) == summary["batches"], summary  # no warm-up batch counted
    if kill:
        assert summary["killed_replica"].startswith("SERVE_REPLICA::"), summary
    assert summary["replica_nodes"] == nodes, summary
    assert summary["ray_env"]["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == ("1" if path == "grpc" else ""), summary
    assert summary["ray_env"]["RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH"] == str(2**31 - 1), summary
