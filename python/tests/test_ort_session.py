# ONNX Runtime habits on kiln: kiln.InferenceSession against onnxruntime.InferenceSession on the
# same models and batch sizes, profile growth with its message, the disk cache, and the ORT-style
# run(output_names, feeds) on kiln.backend and ExecutionContext.
import numpy as np
import pytest

import kiln
from conftest import assert_close, model_path, require_models

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "kiln-cache"
    monkeypatch.setenv("KILN_CACHE_DIR", str(folder))
    return folder


def small_model(batch="batch"):
    """y = Relu(x @ W + b) and w = y * z, with a symbolic batch (or a fixed one)."""
    rng = np.random.default_rng(0)
    weights = rng.standard_normal(12).astype(np.float32).tolist()
    W = helper.make_tensor("W", TensorProto.FLOAT, (4, 3), weights)
    b = helper.make_tensor("b", TensorProto.FLOAT, (3,), [0.1, -0.2, 0.3])
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["pre"]),
             helper.make_node("Relu", ["pre"], ["y"]), helper.make_node("Mul", ["y", "z"], ["w"])]
    graph = helper.make_graph(
        nodes, "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [batch, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [batch, 3])],
        [W, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def feeds(batch, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, 4), dtype=np.float32),
            "z": rng.standard_normal((batch, 3), dtype=np.float32)}


def test_inference_session_like_onnxruntime_on_two_batch_sizes():
    model = small_model()
    data = model.SerializeToString()
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    sess = kiln.InferenceSession(data, providers=["CPUExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    for mine, theirs in ((sess.get_inputs(), ref.get_inputs()), (sess.get_outputs(), ref.get_outputs())):
        assert [(a.name, a.shape, a.type) for a in mine] == [(a.name, a.shape, a.type) for a in theirs]
    assert sess.get_inputs()[0].shape == ["batch", 4] and sess.get_inputs()[0].type == "tensor(float)"
    for batch in (2, 5):
        f = feeds(batch, seed=batch)
        expected = ref.run(None, f)
        if batch == 2:
            got = sess.run(None, f)
        else:
            with pytest.warns(kiln.KilnWarning, match=r"input 'x' batch 5 outside profile \[2, 2\]"):
                got = sess.run(None, f)
        assert isinstance(got, list) and len(got) == 2
        for g, e, name in zip(got, expected, ("y", "w")):
            assert_close(g, e, f"batch {batch} {name}")
        w, y = sess.run(["w", "y"], f)  # the order asked for
        np.testing.assert_array_equal(w, got[1])
        np.testing.assert_array_equal(y, got[0])
    # ModelProto and path inputs give the same session.
    proto_sess = kiln.InferenceSession(model, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(proto_sess.run(["y"], feeds(3))[0], sess.run(["y"], feeds(3))[0])


def test_vit_tiny_against_onnxruntime_on_two_batch_sizes():
    require_models()
    path = str(model_path("vit_tiny"))
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    sess = kiln.InferenceSession(path, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    assert name == ref.get_inputs()[0].name == "x"
    rng = np.random.default_rng(5)
    with pytest.warns(kiln.KilnWarning, match="input 'x' batch 3 outside profile \\[1, 1\\]"):
        for batch in (1, 3):
            x = rng.uniform(-1, 1, (batch, 3, 224, 224)).astype(np.float32)
            (got,) = sess.run(None, {name: x})
            (expected,) = ref.run(None, {name: x})
            assert got.shape == (batch, 1000)
            assert_close(got, expected, f"vit_tiny batch {batch}")
    assert sess.builds == 2 and sess.profile == {"x": ((1, 3, 224, 224), (3, 3, 224, 224), (3, 3, 224, 224))}


def test_profile_grows_with_a_message_and_the_disk_cache_serves_a_second_session(cache_dir):
    data = small_model().SerializeToString()
    sess = kiln.InferenceSession(data)
    assert sess.builds == 0 and sess.engine is None  # dynamic: nothing to build before the first run
    sess.run(None, feeds(2))
    with pytest.warns(kiln.KilnWarning, match=r"input 'x' batch 4 outside profile \[2, 2\]"):
        sess.run(None, feeds(4))
    assert sess.profile["x"] == ((2, 4), (4, 4), (4, 4))
    message = r"kiln: rebuilding engine for input 'x' batch 8 outside profile \[2, 4\]; input 'z' batch 8"
    with pytest.warns(kiln.KilnWarning, match=message):
        got8 = sess.run(None, feeds(8))
    assert sess.profile["x"] == ((2, 4), (8, 4), (8, 4))
    sess.run(None, feeds(3))  # inside [2, 8]: no rebuild
    assert (sess.builds, sess.cache_hits) == (3, 0)
    cached = sorted(p.name for p in cache_dir.iterdir())
    assert len(cached) == 3 and all(n.startswith("model-cpu-") and n.endswith(".kiln") for n in cached)

    second = kiln.InferenceSession(data)
    for batch in (2, 4, 8):
        np.testing.assert_array_equal(second.run(None, feeds(batch))[0], sess.run(None, feeds(batch))[0])
    assert (second.builds, second.cache_hits) == (0, 3)
    np.testing.assert_array_equal(second.run(None, feeds(8))[1], got8[1])

    # A different model (another weight) must not hit the first one's engines.
    other = small_model()
    other.graph.initializer[1].float_data[0] = 5.0
    third = kiln.InferenceSession(other)
    third.run(None, feeds(2))
    assert (third.builds, third.cache_hits) == (1, 0)


def test_corrupt_cache_file_is_rebuilt_not_fatal(cache_dir):
    model = small_model(batch=2)  # static: built when the session is made
    first = kiln.InferenceSession(model)
    assert first.builds == 1 and first.engine is not None
    path = first.engine_path
    assert path.parent == cache_dir and path.is_file()
    path.write_bytes(path.read_bytes()[:200])  # truncated, as a crash mid-write without rename would leave it
    with pytest.warns(kiln.KilnWarning, match="unusable"):
        second = kiln.InferenceSession(model)
    assert (second.builds, second.cache_hits) == (1, 0)
    assert kiln.Engine.load(path).num_io_tensors == 4  # replaced by a whole engine
    third = kiln.InferenceSession(model)
    assert (third.builds, third.cache_hits) == (0, 1)
    np.testing.assert_array_equal(third.run(None, feeds(2))[0], first.run(None, feeds(2))[0])
    assert not [p for p in cache_dir.iterdir() if p.name.endswith(".tmp")]


def test_provider_fallback_and_feed_errors():
    data = small_model().SerializeToString()
    if kiln.device_available(kiln.Device.CUDA):
        pytest.skip("this build of kiln has CUDA: no fallback to show")
    message = "CUDAExecutionProvider needs kiln's CUDA backend.*falling back to CPUExecutionProvider"
    with pytest.warns(kiln.KilnWarning, match=message):
        sess = kiln.InferenceSession(data, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert kiln.get_available_providers() == ["CPUExecutionProvider"]
    f = feeds(2)
    with pytest.raises(kiln.NotFoundError, match="'q'"):
        sess.run(None, {**f, "q": f["x"]})
    with pytest.raises(kiln.InvalidArgumentError, match="missing input.*z"):
        sess.run(None, {"x": f["x"]})
    with pytest.raises(kiln.InvalidArgumentError, match="'x' has dtype float64"):
        sess.run(None, {**f, "x": f["x"].astype(np.float64)})
    with pytest.raises(kiln.InvalidArgumentError, match="'x' dim 1 is 5.*fixes it at 4"):
        sess.run(None, {**f, "x": np.zeros((2, 5), np.float32)})
    with pytest.raises(kiln.NotFoundError, match="'nope'"):
        sess.run(["nope"], f)
    assert sess.builds == 0  # each bad call was refused before building anything


def test_ort_style_run_on_backend_and_execution_context():
    import kiln.backend

    model = small_model()
    f = feeds(3)
    rep = kiln.backend.prepare(model)
    all_outputs = rep.run([f["x"], f["z"]])
    y, w = rep.run(None, f)
    np.testing.assert_array_equal(y, all_outputs[0])
    (only_w,) = rep.run(["w"], [f["x"], f["z"]])
    np.testing.assert_array_equal(only_w, all_outputs.w)

    engine = rep.engine_for({"x": (3, 4), "z": (3, 3)})
    context = engine.create_execution_context()
    as_dict = context.run([f["x"], f["z"]])
    assert sorted(as_dict) == ["w", "y"]
    listed = context.run(None, f)
    np.testing.assert_array_equal(listed[0], as_dict["y"])
    np.testing.assert_array_equal(context.run(["w"], (f["x"], f["z"]))[0], as_dict["w"])
    with pytest.raises(kiln.InvalidArgumentError, match="2 input"):
        context.run([f["x"]])


def test_session_runs_from_many_threads():
    from concurrent.futures import ThreadPoolExecutor

    sess = kiln.InferenceSession(small_model(batch=3))  # static: built once, shared by the threads
    expected = sess.run(None, feeds(3))[1]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: sess.run(["w"], feeds(3))[0], range(32)))
    for got in results:
        np.testing.assert_array_equal(got, expected)
    assert sess.builds == 1
