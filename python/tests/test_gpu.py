# GPU tensors through DLPack: CUDA arrays (torch, CuPy) in, CUDA arrays out, read and written in
# place, on the caller's stream. The refusals run everywhere; the device tests run where kiln has a
# usable CUDA device and torch sees one (scripts/gpu.sh's "python" part on the GPU host) and skip
# elsewhere, printing why.
import numpy as np
import pytest

import kiln
from conftest import ATOL, RTOL, built_engine, model_path, require_models


class FakeCudaTensor:
    """Claims to live on CUDA device 0 through DLPack, like a torch.cuda tensor would."""

    shape = (1, 1, 16)

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA

    def __dlpack__(self, *args, **kwargs):
        raise AssertionError("kiln must check the device before asking for the data")


def test_device_tensor_for_a_cpu_engine_is_refused_with_reason():
    require_models()
    context = built_engine("testmod_linear").create_execution_context()  # a CPU engine
    with pytest.raises(kiln.Error) as e:
        context.run({"x": FakeCudaTensor()})
    message = str(e.value)
    assert "'x'" in message and "CUDA" in message
    if kiln.device_available(kiln.Device.CUDA):
        assert isinstance(e.value, kiln.InvalidArgumentError) and "runs on the CPU" in message
    else:
        # Built without nvcc, or built with it on a machine with no GPU: the reason is named.
        assert isinstance(e.value, kiln.UnsupportedError) and "cannot run CUDA here" in message
    with pytest.raises(kiln.Error, match="'x'"):
        context.set_tensor_address("x", FakeCudaTensor())


def test_streams_are_for_device_runs():
    require_models()
    context = built_engine("testmod_linear").create_execution_context()
    x = np.zeros((1, 1, 16), np.float32)
    with pytest.raises(kiln.InvalidArgumentError, match="stream"):
        context.run({"x": x}, stream=5)  # host inputs are copied and waited for

    class TorchLikeStream:
        cuda_stream = 7

    class CupyLikeStream:
        ptr = 9

    for stream in (7, TorchLikeStream(), CupyLikeStream()):
        with pytest.raises(kiln.InvalidArgumentError, match="runs on the CPU"):
            context.execute_async_v3(stream)
    with pytest.raises(kiln.InvalidArgumentError, match="expected a CUDA stream"):
        context.execute_async("not a stream")
    with pytest.raises(kiln.InvalidArgumentError, match="non-negative"):
        context.execute_async(-1)
    # The ONNX Runtime spelling keeps its two positional arguments.
    (out,) = context.run(None, {"x": x})
    assert out.shape == (1, 2, 8)


# ---- on a GPU -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch_cuda():
    reasons = []
    if not kiln.device_available(kiln.Device.CUDA):
        reasons.append("kiln has no usable CUDA device here (built without nvcc, or no GPU)")
    try:
        import torch
        if not torch.cuda.is_available():
            reasons.append("torch sees no CUDA device")
    except ImportError:
        reasons.append("torch is not installed")
    if reasons:
        print("GPU tensor tests skipped: " + "; ".join(reasons))
        pytest.skip("; ".join(reasons))
    require_models()
    return torch


@pytest.fixture(scope="module")
def linear_cuda(torch_cuda):
    """testmod_linear for CUDA (strict FP32) beside its CPU engine, the reference."""
    network = kiln.onnx.parse_file(model_path("testmod_linear"))
    config = kiln.BuilderConfig()
    config.clear_flag(kiln.BuilderFlag.TF32)  # on by default, as in TensorRT; the CPU reference is FP32
    profile = kiln.OptimizationProfile()
    profile.set_dimensions("x", (1, 1, 16), (4, 4, 16), (10, 10, 16))
    config.add_profile(profile)
    return kiln.Builder(kiln.Device.CUDA).build(network, config), built_engine("testmod_linear")


def reference(cpu_engine, x):
    return cpu_engine.create_execution_context().run({"x": x})


def test_torch_cuda_run_returns_device_tensors_without_copies(torch_cuda, linear_cuda):
    torch = torch_cuda
    engine, cpu = linear_cuda
    context = engine.create_execution_context()
    x = torch.randn(3, 7, 16, device="cuda")
    out = context.run({"x": x})
    (name,) = out
    y = out[name]
    assert isinstance(y, torch.Tensor) and y.is_cuda and tuple(y.shape) == (3, 8, 8)
    want = reference(cpu, x.cpu().numpy())[name]
    np.testing.assert_allclose(y.cpu().numpy(), want, atol=ATOL, rtol=RTOL)
    # ONNX Runtime's spelling and a list in input order take device tensors too.
    (again,) = context.run(None, [x])
    assert again.is_cuda and torch.equal(again, y)
    # Mixed host and device inputs, wrong dtypes and strided views are refused by name.
    with pytest.raises(kiln.InvalidArgumentError, match="not C-contiguous"):
        context.run({"x": torch.randn(16, 7, 3, device="cuda").permute(2, 1, 0)})
    with pytest.raises(kiln.InvalidArgumentError, match="float16"):
        context.run({"x": x.half()})


def test_run_on_a_non_default_stream_is_ordered_after_the_producer(torch_cuda, linear_cuda):
    torch = torch_cuda
    engine, cpu = linear_cuda
    context = engine.create_execution_context()
    x = torch.randn(2, 5, 16, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        staged = torch.zeros_like(x)
        torch.cuda._sleep(200_000_000)  # the copy below lands long after the run is enqueued
        staged.copy_(x)
        out = context.run({"x": staged}, stream=s)  # a torch.cuda.Stream
        (y,) = out.values()
    s.synchronize()
    (name,) = out
    # Had kiln run on another stream without waiting for `s`, it would have read the zeros.
    np.testing.assert_allclose(y.cpu().numpy(), reference(cpu, x.cpu().numpy())[name], atol=ATOL, rtol=RTOL)
    # An int handle works the same way.
    with torch.cuda.stream(s):
        staged2 = torch.zeros_like(x)
        torch.cuda._sleep(200_000_000)
        staged2.copy_(x)
        (y2,) = context.run({"x": staged2}, stream=s.cuda_stream).values()
    s.synchronize()
    assert torch.equal(y2, y)


def test_stream_zero_is_torchs_default_stream_ordered_both_ways(torch_cuda, linear_cuda):
    """execute_async_v3(0), execute() and run(stream=0), as TensorRT code written for torch's default stream
    calls them: the run waits for the producer queued on stream 0 and the consumer queued there after
    it waits for the run, with no host wait between (kiln runs on its own stream between two events)."""
    torch = torch_cuda
    engine, cpu = linear_cuda
    assert torch.cuda.current_stream().cuda_stream == 0
    context = engine.create_execution_context()
    (name,) = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)
               if engine.get_tensor_mode(engine.get_tensor_name(i)) == kiln.TensorIOMode.OUTPUT]
    x = torch.randn(4, 3, 16, device="cuda")
    want = reference(cpu, x.cpu().numpy())[name]
    staged, y = torch.empty_like(x), torch.empty(4, 4, 8, device="cuda")
    context.set_tensor_address("x", staged)
    context.set_tensor_address(name, y)
    for graphs in (False, True, True):  # the second graph run replays the captured graph
        context.use_cuda_graph = graphs
        staged.zero_()
        y.fill_(float("nan"))
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)  # the input's producer lands long after the run is enqueued
        staged.copy_(x)
        assert context.execute_async_v3(0) is True
        got = y.clone()  # queued on stream 0 after the run: it must wait for it
        np.testing.assert_allclose(got.cpu().numpy(), want, atol=ATOL, rtol=RTOL)
    assert context.cuda_graph_stats["replays"] >= 1
    # The synchronous execute() waits for stream 0's producer too, then for the run itself.
    staged.zero_()
    y.fill_(float("nan"))
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    staged.copy_(x)
    context.execute()
    np.testing.assert_allclose(y.cpu().numpy(), want, atol=ATOL, rtol=RTOL)
    staged = torch.zeros_like(x)
    torch.cuda._sleep(200_000_000)
    staged.copy_(x)
    (y0,) = context.run({"x": staged}, stream=0).values()
    np.testing.assert_allclose(y0.clone().cpu().numpy(), want, atol=ATOL, rtol=RTOL)


def test_set_tensor_address_and_execute_async_on_torch_tensors(torch_cuda, linear_cuda):
    torch = torch_cuda
    engine, cpu = linear_cuda
    context = engine.create_execution_context()
    (out_name,) = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)
                   if engine.get_tensor_mode(engine.get_tensor_name(i)) == kiln.TensorIOMode.OUTPUT]
    x = torch.randn(4, 3, 16, device="cuda")
    y = torch.full((4, 4, 8), float("nan"), device="cuda")
    context.set_tensor_address("x", x)  # a device tensor: it also sets the input shape
    context.set_tensor_address(out_name, y)
    assert context.tensor_address("x") == x.data_ptr() and context.tensor_address(out_name) == y.data_ptr()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    assert context.execute_async(s) is True
    s.synchronize()
    want = reference(cpu, x.cpu().numpy())[out_name]
    np.testing.assert_allclose(y.cpu().numpy(), want, atol=ATOL, rtol=RTOL)
    # TensorRT's spelling with an int handle; a wrongly sized output is caught before the run.
    y.zero_()
    torch.cuda.synchronize()
    assert context.execute_async_v3(s.cuda_stream) is True
    s.synchronize()
    np.testing.assert_allclose(y.cpu().numpy(), want, atol=ATOL, rtol=RTOL)
    context.set_tensor_address(out_name, torch.empty(4, 5, 8, device="cuda"))
    with pytest.raises(kiln.InvalidArgumentError, match="is bound to an array of shape"):
        context.execute_async_v3(s.cuda_stream)
    # Host memory for a CUDA engine's address is refused: kiln would read it as device memory.
    with pytest.raises(kiln.InvalidArgumentError, match="device memory"):
        context.set_tensor_address("x", np.zeros((4, 3, 16), np.float32))


def test_cupy_arrays_and_streams(torch_cuda, linear_cuda):
    try:
        import cupy
    except ImportError:
        print("CuPy part skipped: cupy is not installed")
        pytest.skip("cupy is not installed")
    engine, cpu = linear_cuda
    context = engine.create_execution_context()
    x = cupy.random.standard_normal((2, 9, 16), dtype=cupy.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    (name, y), = context.run({"x": x}, stream=stream).items()
    stream.synchronize()
    assert isinstance(y, cupy.ndarray) and y.shape == (2, 10, 8)
    np.testing.assert_allclose(cupy.asnumpy(y), reference(cpu, cupy.asnumpy(x))[name], atol=ATOL, rtol=RTOL)


def test_the_package_carries_the_cuda_backend_where_nvcc_was_found():
    import os
    import shutil
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    assert isinstance(kiln.built_with_cuda, bool)
    if kiln.device_available(kiln.Device.CUDA):
        assert kiln.built_with_cuda
    if nvcc is None:
        print("CUDA build check skipped: no nvcc on this machine (the package is CPU-only by design)")
        pytest.skip("no nvcc here")
    # pip install . on a machine with nvcc (and cuDNN) builds the CUDA backend into the package.
    assert kiln.built_with_cuda, f"nvcc is at {nvcc}, but this kiln package was built without the CUDA backend"


def test_serving_batches_replay_their_buckets_cuda_graphs(torch_cuda, linear_cuda):
    # kiln.serve on a CUDA engine with batch buckets: host requests of 1..3 rows from concurrent
    # callers form batches of 1..10 rows; each runs from its bucket's graph (2, 4 or 8; 9 and 10
    # run as they are) and every caller gets the CPU reference's rows.
    import concurrent.futures

    import kiln.serve

    engine, cpu = linear_cuda
    rng = np.random.default_rng(11)
    requests = [rng.uniform(-1, 1, (1 + i % 3, 5, 16)).astype(np.float32) for i in range(300)]
    with kiln.serve.DynamicBatcher(engine, wait_ms=3, contexts=2, batch_buckets=[2, 4, 8]) as batcher:
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(lambda x: batcher.run({"x": x}, timeout=60), requests))
        stats, graphs = batcher.stats.snapshot(), batcher.graph_stats()
    name = next(iter(answers[0]))
    for i, (x, got) in enumerate(zip(requests, answers)):
        assert got[name].shape[0] == x.shape[0], i
        np.testing.assert_allclose(got[name], reference(cpu, x)[name], atol=ATOL, rtol=RTOL, err_msg=f"request {i}")
    assert stats["mean_batch_requests"] > 1, stats
    # At most one capture per context for each bucket and for each batch past the last (9, 10 rows,
    # run at their own shape): 10; the batches of up to 8 rows replayed their bucket's graph.
    bucketed = sum(c for rows, c in stats["batch_rows"].items() if rows <= 8)
    assert 0 < graphs["captures"] <= 5 * 2 and graphs["replays"] >= bucketed - 3 * 2, (stats, graphs)


def test_pinned_inputs_run_from_where_they_lie(torch_cuda, linear_cuda):
    # kiln.empty_pinned: page-locked host memory (torch agrees), of the shape and dtype asked; a
    # CUDA engine's run reads it in place of its staging copy and answers as for a plain array,
    # also for a view into a larger pinned buffer (the serving batcher's stacking buffer) and
    # after the buffer's contents change between runs.
    torch = torch_cuda
    engine, cpu = linear_cuda
    context = engine.create_execution_context()
    buf = kiln.empty_pinned(10 * 10 * 16, np.float32)
    assert buf.shape == (1600,) and buf.dtype == np.float32
    assert torch.from_numpy(buf).is_pinned()
    assert kiln.empty_pinned((2, 3), np.float16).shape == (2, 3)
    rng = np.random.default_rng(5)
    for rows in (3, 7, 3):
        x = rng.uniform(-1, 1, (rows, 4, 16)).astype(np.float32)
        view = buf[: x.size].reshape(x.shape)
        np.copyto(view, x)
        got = context.run({"x": view})
        name = next(iter(got))
        np.testing.assert_allclose(got[name], reference(cpu, x)[name], atol=ATOL, rtol=RTOL)
        np.testing.assert_array_equal(got[name], context.run({"x": x})[name])
    with pytest.raises(kiln.InvalidArgumentError):
        kiln.empty_pinned((2, -1))


def test_empty_pinned_says_why_without_a_cuda_device():
    if kiln.device_available(kiln.Device.CUDA):
        pytest.skip("a CUDA device is here (test_pinned_inputs_run_from_where_they_lie runs instead)")
    with pytest.raises(kiln.Error, match="CUDA"):
        kiln.empty_pinned((2, 3))
