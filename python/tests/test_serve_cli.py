# `kiln serve` (python -m kiln.serve; the wheel's `kiln serve` execs it): bad command lines exit 2
# and a bad engine 1 with the reason before Ray starts; a served engine answers HTTP on loopback
# with the direct run's output, and the command exits 0 on Ctrl-C (SIGINT).
import io
import shutil
import signal
import subprocess
import sys
import time
import pathlib
import urllib.error
import urllib.request

import numpy as np
import pytest

from conftest import built_engine, require_models


def serve_cmd(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "kiln.serve", *args], capture_output=True, text=True, timeout=timeout)


def test_help_and_bad_command_lines():
    r = serve_cmd("--help")
    assert r.returncode == 0 and "--loadEngine" in r.stdout and "--maxBatch" in r.stdout and "--rayPath" in r.stdout
    for args, reason in [((), "give --loadEngine or --onnx"),
                         (("--loadEngine=a.kiln", "--onnx=a.onnx"), "give --loadEngine or --onnx"),
                         (("--loadEngine=a.kiln", "--fp16"), "--fp16 is a build flag; it needs --onnx"),
                         (("--loadEngine=a.kiln", "--port=99999"), "--port=99999 is not a port"),
                         (("--loadEngine=a.kiln", "--maxBatch=lots"), "not a number"),
                         (("--loadEngine=a.kiln", "--batchBuckets=8,x"), "not a number"),
                         (("--loadEngine=a.kiln", "--batchBuckets=0,8"), "each bucket is a batch of at least 1"),
                         (("--loadEngine=a.kiln", "--rayPath=http"), "Ray Serve's request path is actor or grpc"),
                         (("--loadEngine=a.kiln", "stray"), "'stray' is not a flag")]:
        r = serve_cmd(*args)
        assert r.returncode == 2 and reason in r.stderr, (args, r.stderr)


def test_a_bad_engine_file_fails_before_ray_starts(tmp_path):
    bad = tmp_path / "bad.kiln"
    bad.write_bytes(b"not an engine")
    r = serve_cmd(f"--loadEngine={bad}", "--port=8123")
    assert r.returncode == 1 and "kiln serve: error:" in r.stderr, r.stderr


def test_batch_buckets_on_a_cpu_engine_fail_before_ray_starts(tmp_path):
    require_models()
    path = tmp_path / "linear.kiln"
    built_engine("testmod_linear").save(str(path))
    r = serve_cmd(f"--loadEngine={path}", "--batchBuckets=2,4", "--port=8123")
    assert r.returncode == 1 and "batch buckets pad runs to replay CUDA graphs; the cpu backend has none" in r.stderr, \
        r.stderr


def test_the_kiln_command_hands_serve_to_python():
    beside = pathlib.Path(sys.executable).parent / "kiln"
    kiln = str(beside) if beside.exists() else shutil.which("kiln")
    if kiln is None:
        pytest.skip("no `kiln` command beside this interpreter or on PATH (pip install . makes one)")
    r = subprocess.run([kiln, "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "usage: kiln serve" in r.stdout, r.stderr


def test_serves_http_until_interrupted(tmp_path):
    require_models()
    pytest.importorskip("ray", reason="Ray Serve is not installed (pip install -r requirements-serve.txt)")
    engine = built_engine("testmod_linear")
    path = tmp_path / "m.kiln"
    engine.save(str(path))
    from kiln.serve import _free_local_port
    port = _free_local_port()
    proc = subprocess.Popen([sys.executable, "-m", "kiln.serve", f"--loadEngine={path}", f"--port={port}",
                             "--route=/m", "--maxBatch=8", "--duration=300"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        x = np.random.default_rng(5).uniform(-1, 1, (2, 3, 16)).astype(np.float32)
        buf = io.BytesIO()
        np.save(buf, x)
        answer, deadline = None, time.monotonic() + 120
        while answer is None and time.monotonic() < deadline and proc.poll() is None:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/m", data=buf.getvalue(),
                                         headers={"Content-Type": "application/x-npy"}, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    answer = np.load(io.BytesIO(r.read()))
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.5)
        assert answer is not None, "no answer from kiln serve"
        np.testing.assert_array_equal(answer, engine.create_execution_context().run({"x": x})["cat"])
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert f"on http://127.0.0.1:{port}/m" in out, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
