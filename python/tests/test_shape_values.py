# Shape-value inputs (issue 15, item 2) from Python: a TopK whose K and an Expand whose target are
# model inputs, ranged by the profile, given at run time, matching ONNX Runtime at several values;
# a value outside the profile is refused by name; a float input fixed at one value.
import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="onnx is not installed")
ort = pytest.importorskip("onnxruntime", reason="ONNX Runtime is not installed")
from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402

import kiln  # noqa: E402


def model_bytes():
    g = h.make_graph(
        [h.make_node("TopK", ["x", "k"], ["vals", "idx"], axis=1, name="topk"),
         h.make_node("Expand", ["row", "shape"], ["e"], name="expand")],
        "values",
        [h.make_tensor_value_info("x", T.FLOAT, ["n", 10]), h.make_tensor_value_info("k", T.INT64, [1]),
         h.make_tensor_value_info("shape", T.INT64, [2])],
        [h.make_tensor_value_info("vals", T.FLOAT, None), h.make_tensor_value_info("idx", T.INT64, None),
         h.make_tensor_value_info("e", T.FLOAT, None)],
        [h.make_tensor("row", T.FLOAT, [1, 4], [1.0, 2.0, 3.0, 4.0])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 9
    return m.SerializeToString()


def build(data):
    profile = kiln.OptimizationProfile()
    profile.set_dimensions("x", (1, 10), (2, 10), (4, 10))
    profile.set_shape_values("k", [1], [3], [5])
    profile.set_shape_values("shape", [1, 4], [2, 4], [6, 4])
    config = kiln.BuilderConfig()
    config.add_profile(profile)
    return kiln.Builder().build(kiln.onnx.parse_bytes(data), config)


def test_shape_values_given_at_run_time_match_onnxruntime():
    data = model_bytes()
    engine = build(data)
    assert engine.is_shape_inference_io("k") and engine.is_shape_inference_io("shape")
    assert not engine.is_shape_inference_io("x")
    assert engine.get_tensor_profile_values("k", 0) == ((1,), (3,), (5,))
    context = engine.create_execution_context()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for n, k, rows in [(2, 3, 2), (4, 5, 6), (1, 1, 1), (3, 2, 4)]:
        feeds = {"x": rng.standard_normal((n, 10), dtype=np.float32), "k": np.array([k], np.int64),
                 "shape": np.array([rows, 4], np.int64)}
        got = context.run(feeds)
        want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        for name in ("vals", "idx", "e"):
            assert got[name].shape == want[name].shape, (name, got[name].shape, want[name].shape)
            np.testing.assert_array_equal(got[name], want[name])


def test_values_outside_the_profile_are_refused_by_name():
    context = build(model_bytes()).create_execution_context()
    feeds = {"x": np.zeros((2, 10), np.float32), "k": np.array([6], np.int64), "shape": np.array([2, 4], np.int64)}
    with pytest.raises(Exception, match=r"input 'k' element 0 \(k_0\) = 6 is outside the range \[1, 5\]"):
        context.run(feeds)


def test_a_float_input_takes_the_one_value_it_was_built_for():
    g = h.make_graph([h.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest", name="up")], "resize",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 1, 2, 2]),
                      h.make_tensor_value_info("scales", T.FLOAT, [4])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 9
    data = m.SerializeToString()
    scales = np.array([1, 1, 2, 3], np.float32)
    profile = kiln.OptimizationProfile()
    profile.set_shape_values("scales", scales)
    config = kiln.BuilderConfig()
    config.add_profile(profile)
    engine = kiln.Builder().build(kiln.onnx.parse_bytes(data), config)
    assert engine.get_tensor_shape("y") == (1, 1, 4, 6)
    x = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)
    context = engine.create_execution_context()
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x, "scales": scales})[0]
    np.testing.assert_array_equal(context.run({"x": x, "scales": scales})["y"], want)
    with pytest.raises(Exception, match="but the engine was built for the value"):
        context.run({"x": x, "scales": np.array([1, 1, 2, 2], np.float32)})
