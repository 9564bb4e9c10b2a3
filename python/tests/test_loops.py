# Loops that run at run time (issue 15, item 3) from Python, against ONNX Runtime: a while loop
# whose trip count and condition are data (the numbers of iterations differ per run), a decoding
# loop that appends a column per iteration until its condition fails (its output as long as the
# run made it), and an RNN-style Scan over a sequence length that changes per run, its outputs
# stacked in reverse.
import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="onnx is not installed")
ort = pytest.importorskip("onnxruntime", reason="ONNX Runtime is not installed")
from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402

import kiln  # noqa: E402


def serialized(graph):
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.checker.check_model(m)
    return m.SerializeToString()


def while_model():
    # y = tanh(y @ w) + 0.1 * i while sum(|y|) > limit and i < m, counting the iterations.
    body = h.make_graph(
        [h.make_node("MatMul", ["y_in", "w"], ["yw"]),
         h.make_node("Tanh", ["yw"], ["t"]),
         h.make_node("Cast", ["i"], ["fi"], to=T.FLOAT),
         h.make_node("Mul", ["fi", "tenth"], ["step"]),
         h.make_node("Add", ["t", "step"], ["y_out"]),
         h.make_node("Abs", ["y_out"], ["a"]),
         h.make_node("ReduceSum", ["a"], ["s"], keepdims=0),
         h.make_node("Greater", ["s", "limit"], ["c_out"]),
         h.make_node("Add", ["k_in", "one"], ["k_out"])],
        "body",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c", T.BOOL, []),
         h.make_tensor_value_info("y_in", T.FLOAT, ["b", 4]), h.make_tensor_value_info("k_in", T.INT64, [])],
        [h.make_tensor_value_info("c_out", T.BOOL, []), h.make_tensor_value_info("y_out", T.FLOAT, ["b", 4]),
         h.make_tensor_value_info("k_out", T.INT64, [])],
        [h.make_tensor("tenth", T.FLOAT, [], [0.1]), h.make_tensor("one", T.INT64, [], [1])])
    g = h.make_graph(
        [h.make_node("Loop", ["m", "go", "x", "zero"], ["y", "k"], body=body, name="decode")],
        "while",
        [h.make_tensor_value_info("x", T.FLOAT, ["b", 4]), h.make_tensor_value_info("m", T.INT64, []),
         h.make_tensor_value_info("go", T.BOOL, [])],
        [h.make_tensor_value_info("y", T.FLOAT, ["b", 4]), h.make_tensor_value_info("k", T.INT64, [])],
        [h.make_tensor("w", T.FLOAT, [4, 4], np.random.default_rng(0).standard_normal(16).astype(np.float32)),
         h.make_tensor("limit", T.FLOAT, [], [2.5]), h.make_tensor("zero", T.INT64, [], [0])])
    return serialized(g)


def decode_model():
    # Greedy decoding's shape: seq [b, t] gains a column per iteration (half of each row's mean)
    # while some row's new value is above 0.5, for at most 8 iterations.
    body = h.make_graph(
        [h.make_node("ReduceMean", ["seq_in"], ["mean"], axes=[1], keepdims=1),
         h.make_node("Mul", ["mean", "decay"], ["col"]),
         h.make_node("Concat", ["seq_in", "col"], ["seq_out"], axis=1),
         h.make_node("ReduceMax", ["col"], ["top"], keepdims=0),
         h.make_node("Greater", ["top", "half"], ["c_out"])],
        "step",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c", T.BOOL, []),
         h.make_tensor_value_info("seq_in", T.FLOAT, ["b", None])],
        [h.make_tensor_value_info("c_out", T.BOOL, []), h.make_tensor_value_info("seq_out", T.FLOAT, ["b", None])],
        [h.make_tensor("decay", T.FLOAT, [], [0.5]),
         h.make_tensor("half", T.FLOAT, [], [0.5])])
    g = h.make_graph(
        [h.make_node("Loop", ["max_steps", "", "prompt"], ["seq"], body=body, name="decode")],
        "decode",
        [h.make_tensor_value_info("prompt", T.FLOAT, ["b", "t"])],
        [h.make_tensor_value_info("seq", T.FLOAT, ["b", None])],
        [h.make_tensor("max_steps", T.INT64, [], [8])])
    return serialized(g)


def scan_model():
    # h_t = tanh(h_{t-1} + x_t @ u) over x's rows from the last, each h_t stacked, last first.
    body = h.make_graph(
        [h.make_node("MatMul", ["x_t", "u"], ["xu"]),
         h.make_node("Add", ["h_in", "xu"], ["pre"]),
         h.make_node("Tanh", ["pre"], ["h_out"]),
         h.make_node("Identity", ["h_out"], ["h_seq"])],
        "cell",
        [h.make_tensor_value_info("h_in", T.FLOAT, [3]), h.make_tensor_value_info("x_t", T.FLOAT, [2])],
        [h.make_tensor_value_info("h_out", T.FLOAT, [3]), h.make_tensor_value_info("h_seq", T.FLOAT, [3])],
        [h.make_tensor("u", T.FLOAT, [2, 3], np.random.default_rng(1).standard_normal(6).astype(np.float32))])
    g = h.make_graph(
        [h.make_node("Scan", ["h0", "x"], ["h_last", "hs"], body=body, num_scan_inputs=1,
                     scan_input_directions=[1], scan_output_directions=[1], name="rnn")],
        "scan",
        [h.make_tensor_value_info("h0", T.FLOAT, [3]), h.make_tensor_value_info("x", T.FLOAT, ["t", 2])],
        [h.make_tensor_value_info("h_last", T.FLOAT, [3]), h.make_tensor_value_info("hs", T.FLOAT, ["t", 3])])
    return serialized(g)


def build(data, dims):
    profile = kiln.OptimizationProfile()
    for name, (lo, opt, hi) in dims.items():
        profile.set_dimensions(name, lo, opt, hi)
    config = kiln.BuilderConfig()
    config.add_profile(profile)
    return kiln.Builder().build(kiln.onnx.parse_bytes(data), config)


def test_a_while_loop_on_data_matches_onnxruntime():
    data = while_model()
    context = build(data, {"x": ((1, 4), (2, 4), (8, 4))}).create_execution_context()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    counts = set()
    for b, m, go in [(2, 10, True), (5, 3, True), (1, 50, True), (3, 10, False), (4, 0, True)]:
        feeds = {"x": rng.standard_normal((b, 4), dtype=np.float32), "m": np.array(m, np.int64),
                 "go": np.array(go)}
        got = context.run(feeds)
        want_y, want_k = session.run(None, feeds)
        np.testing.assert_allclose(got["y"], want_y, rtol=1e-5, atol=1e-5)
        assert int(got["k"]) == int(want_k)
        counts.add(int(want_k))
    assert len(counts) > 2  # the runs took different numbers of iterations
    context.max_loop_iterations = 1
    assert context.max_loop_iterations == 1
    with pytest.raises(kiln.InvalidArgumentError, match="ran 1 iterations and its condition still holds"):
        context.run({"x": np.full((2, 4), 3, np.float32), "m": np.array(10, np.int64), "go": np.array(True)})


def forever_model():
    # y = -y for m iterations, the condition always true: with a huge m the run would not end.
    body = h.make_graph(
        [h.make_node("Identity", ["c"], ["c_out"]), h.make_node("Neg", ["y_in"], ["y_out"])],
        "flip",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c", T.BOOL, []),
         h.make_tensor_value_info("y_in", T.FLOAT, ["b", 4])],
        [h.make_tensor_value_info("c_out", T.BOOL, []), h.make_tensor_value_info("y_out", T.FLOAT, ["b", 4])])
    g = h.make_graph(
        [h.make_node("Loop", ["m", "go", "x"], ["y"], body=body, name="forever")],
        "forever",
        [h.make_tensor_value_info("x", T.FLOAT, ["b", 4]), h.make_tensor_value_info("m", T.INT64, []),
         h.make_tensor_value_info("go", T.BOOL, [])],
        [h.make_tensor_value_info("y", T.FLOAT, ["b", 4])])
    return serialized(g)


def test_cancel_from_another_thread_stops_a_run_that_would_not_end():
    # A loop of 2^60 iterations with no iteration limit would run for ages; context.cancel() from a
    # timer thread stops it with kiln.CancelledError, and the same context runs normally afterwards.
    import threading
    import time

    context = build(forever_model(), {"x": ((1, 4), (2, 4), (8, 4))}).create_execution_context()
    context.max_loop_iterations = 1 << 62
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(2, 4), "m": np.array(1 << 60, np.int64),
             "go": np.array(True)}
    timer = threading.Timer(0.2, context.cancel)
    start = time.monotonic()
    timer.start()
    with pytest.raises(kiln.CancelledError, match="cancelled"):
        context.run(feeds)
    timer.join()
    assert time.monotonic() - start < 60
    got = context.run({**feeds, "m": np.array(3, np.int64)})  # three flips: -x
    np.testing.assert_array_equal(got["y"], -feeds["x"])


def test_a_decoding_loop_that_appends_per_iteration_matches_onnxruntime():
    data = decode_model()
    engine = build(data, {"prompt": ((1, 1), (2, 4), (4, 16))})
    assert engine.get_tensor_shape("seq") == (-1, -1)
    context = engine.create_execution_context()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    lengths = set()
    for b, t, scale in [(2, 3, 1.0), (1, 16, 1.0), (4, 1, 1.0), (3, 5, 4.0)]:  # 7, 1, 2 and 8 columns
        feeds = {"prompt": np.abs(np.random.default_rng(t).standard_normal((b, t))).astype(np.float32) * scale}
        got = context.run(feeds)["seq"]
        (want,) = session.run(None, feeds)
        assert got.shape == want.shape, (b, t, got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        lengths.add(want.shape[1] - t)
    assert len(lengths) > 2  # the runs appended different numbers of columns


def test_a_scan_over_a_length_that_changes_per_run_matches_onnxruntime():
    data = scan_model()
    engine = build(data, {"x": ((1, 2), (8, 2), (64, 2))})
    assert engine.get_tensor_shape("hs") == (-1, 3)
    context = engine.create_execution_context()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(6)
    for t in (1, 7, 64):
        feeds = {"h0": rng.standard_normal(3, dtype=np.float32), "x": rng.standard_normal((t, 2), dtype=np.float32)}
        got = context.run(feeds)
        want_last, want_hs = session.run(None, feeds)
        assert got["hs"].shape == (t, 3)
        np.testing.assert_allclose(got["h_last"], want_last, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got["hs"], want_hs, rtol=1e-5, atol=1e-5)
