# bfloat16 (ml_dtypes) and float16 numpy arrays in and out of engines whose IO has those dtypes.
import numpy as np
import pytest

import kiln

onnx = pytest.importorskip("onnx")
ml_dtypes = pytest.importorskip("ml_dtypes")
from onnx import TensorProto, helper  # noqa: E402


def cast_engine(elem_in, elem_out, n="n"):
    graph = helper.make_graph(
        [helper.make_node("Cast", ["a"], ["b"], to=elem_out)], "cast",
        [helper.make_tensor_value_info("a", elem_in, [n, 3])],
        [helper.make_tensor_value_info("b", elem_out, [n, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    profile = kiln.OptimizationProfile()
    profile.set_dimensions("a", (1, 3), (2, 3), (8, 3))
    config = kiln.BuilderConfig()
    config.add_profile(profile)
    return kiln.Builder(kiln.Device.CPU).build(kiln.onnx.parse_bytes(model), config)


# Values bfloat16 holds exactly, plus one it rounds (1/3).
VALUES = np.array([[1.0, -2.5, 0.0], [3.140625, 1 / 3, -1024.0]], np.float32)


def test_float32_to_bfloat16_output_is_ml_dtypes_array():
    engine = cast_engine(TensorProto.FLOAT, TensorProto.BFLOAT16)
    assert engine.tensor_dtype("b") == np.dtype(ml_dtypes.bfloat16)
    out = engine.create_execution_context().run({"a": VALUES})["b"]
    assert out.dtype == ml_dtypes.bfloat16 and out.shape == (2, 3)
    np.testing.assert_array_equal(out.view(np.uint16), VALUES.astype(ml_dtypes.bfloat16).view(np.uint16))
    # The TensorRT-style flow binds a bfloat16 output array (and a raw pointer to one).
    context = engine.create_execution_context()
    for bind in (lambda a: a, lambda a: a.ctypes.data):
        bound = np.zeros((2, 3), ml_dtypes.bfloat16)
        context.set_tensor_address("a", VALUES)
        context.set_tensor_address("b", bind(bound))
        context.execute()
        np.testing.assert_array_equal(bound.view(np.uint16), out.view(np.uint16))
    with pytest.raises(kiln.InvalidArgumentError, match="read-only"):
        frozen = np.zeros((2, 3), ml_dtypes.bfloat16)
        frozen.flags.writeable = False
        context.set_tensor_address("b", frozen)


def test_bfloat16_input_to_float32(tmp_path, monkeypatch):
    engine = cast_engine(TensorProto.BFLOAT16, TensorProto.FLOAT)
    a = VALUES.astype(ml_dtypes.bfloat16)
    context = engine.create_execution_context()
    out = context.run({"a": a})["b"]
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, a.astype(np.float32))
    # Non-contiguous bfloat16 input is copied into C order; a float32 array is refused, not converted.
    wide = np.zeros((2, 6), ml_dtypes.bfloat16)
    wide[:, ::2] = a
    np.testing.assert_array_equal(context.run({"a": wide[:, ::2]})["b"], out)
    with pytest.raises(kiln.InvalidArgumentError, match="'a' has dtype float32.*bfloat16"):
        context.run({"a": VALUES})
    # The ONNX Runtime-style session takes and returns them too (a bfloat16 Cast to itself).
    graph_model = helper.make_model(
        helper.make_graph([helper.make_node("Cast", ["a"], ["b"], to=TensorProto.BFLOAT16)], "c",
                          [helper.make_tensor_value_info("a", TensorProto.BFLOAT16, [2, 3])],
                          [helper.make_tensor_value_info("b", TensorProto.BFLOAT16, [2, 3])]),
        opset_imports=[helper.make_opsetid("", 17)])
    graph_model.ir_version = 8
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    sess = kiln.InferenceSession(graph_model)
    assert [i.type for i in sess.get_inputs()] == ["tensor(bfloat16)"]
    (same,) = sess.run(None, {"a": a})
    assert same.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(same.view(np.uint16), a.view(np.uint16))


def test_float16_in_and_out():
    to_half = cast_engine(TensorProto.FLOAT, TensorProto.FLOAT16)
    half = to_half.create_execution_context().run({"a": VALUES})["b"]
    assert half.dtype == np.float16
    np.testing.assert_array_equal(half, VALUES.astype(np.float16))
    from_half = cast_engine(TensorProto.FLOAT16, TensorProto.FLOAT)
    back = from_half.create_execution_context().run({"a": half})["b"]
    np.testing.assert_array_equal(back, half.astype(np.float32))
