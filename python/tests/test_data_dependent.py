# Outputs whose size the data decides (issue 15, item 1) and the CUDA graph settings, from Python:
# a NonZero and a NonMaxSuppression engine return exactly sized outputs that match ONNX Runtime,
# tensor_shape has -1 in such a dim before a run, and batch buckets are refused on the CPU.
import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="onnx is not installed")
ort = pytest.importorskip("onnxruntime", reason="ONNX Runtime is not installed")
from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402

import kiln  # noqa: E402


def model_bytes():
    # idx = NonZero(x > 0); vals = x at those places; sel = NMS over boxes/scores.
    g = h.make_graph(
        [h.make_node("Greater", ["x", "zero_f"], ["pos"], name="positive"),
         h.make_node("NonZero", ["pos"], ["idx"], name="nz"),
         h.make_node("Transpose", ["idx"], ["idx_t"], perm=[1, 0], name="tr"),
         h.make_node("GatherND", ["x", "idx_t"], ["vals"], name="gather"),
         h.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou"], ["sel"], name="nms")],
        "dd",
        [h.make_tensor_value_info("x", T.FLOAT, ["n", 3]), h.make_tensor_value_info("boxes", T.FLOAT, [1, "b", 4]),
         h.make_tensor_value_info("scores", T.FLOAT, [1, 2, "b"])],
        [h.make_tensor_value_info("idx", T.INT64, [2, "k"]), h.make_tensor_value_info("vals", T.FLOAT, ["k"]),
         h.make_tensor_value_info("sel", T.INT64, ["s", 3])],
        [h.make_tensor("zero_f", T.FLOAT, [], [0.0]), h.make_tensor("max_out", T.INT64, [1], [4]),
         h.make_tensor("iou", T.FLOAT, [1], [0.4])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 9
    return m.SerializeToString()


def test_data_dependent_outputs_have_their_exact_size_and_match_onnxruntime():
    data = model_bytes()
    profile = kiln.OptimizationProfile()
    profile.set_dimensions("x", (1, 3), (4, 3), (16, 3))
    profile.set_dimensions("boxes", (1, 1, 4), (1, 8, 4), (1, 32, 4))
    profile.set_dimensions("scores", (1, 2, 1), (1, 2, 8), (1, 2, 32))
    config = kiln.BuilderConfig()
    config.add_profile(profile)
    engine = kiln.Builder().build(kiln.onnx.parse_bytes(data), config)
    assert engine.get_tensor_shape("idx") == (2, -1)
    context = engine.create_execution_context()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for n, b in [(5, 8), (16, 32), (1, 1)]:
        feeds = {"x": rng.standard_normal((n, 3), dtype=np.float32),
                 "boxes": np.sort(rng.uniform(0, 4, (1, b, 4)).astype(np.float32).reshape(1, b, 2, 2), axis=2).reshape(1, b, 4),
                 "scores": rng.uniform(0, 1, (1, 2, b)).astype(np.float32)}
        got = context.run(feeds)
        want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        for name in ("idx", "vals", "sel"):
            assert got[name].shape == want[name].shape, (name, got[name].shape, want[name].shape)
            np.testing.assert_array_equal(got[name], want[name])
        assert context.get_tensor_shape("vals") == want["vals"].shape


def test_cuda_graph_settings_on_a_cpu_context():
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "r", [h.make_tensor_value_info("x", T.FLOAT, ["n", 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["n", 4])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 9
    profile = kiln.OptimizationProfile()
    profile.set_dimensions("x", (1, 4), (2, 4), (8, 4))
    config = kiln.BuilderConfig()
    config.add_profile(profile)
    context = kiln.Builder().build(kiln.onnx.parse_bytes(m.SerializeToString()), config).create_execution_context()
    assert context.cuda_graph_cache_capacity == 4
    context.cuda_graph_cache_capacity = 6
    assert context.cuda_graph_cache_capacity == 6
    assert context.cuda_graph_stats == {"captures": 0, "replays": 0, "evictions": 0, "cached": 0}
    with pytest.raises(kiln.InvalidArgumentError, match="the cpu backend has none"):
        context.batch_buckets = [1, 2, 4, 8]
    assert context.batch_buckets == []
