# kiln.backend drives kiln through onnx's backend API: a node model made with onnx.helper, and a
# few of onnx's own node tests through onnx.backend.test.BackendTest.
import numpy as np
import onnx
import onnx.backend.test
import pytest
from onnx import TensorProto, helper

import kiln
import kiln.backend


def gemm_relu_model(batch="N"):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3], np.arange(12, dtype=np.float32) / 10 - 0.5)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "gemm_relu", [x], [y], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_backend_is_an_onnx_backend():
    assert issubclass(kiln.backend.KilnBackend, onnx.backend.base.Backend)
    assert kiln.backend.supports_device("CPU")
    assert kiln.backend.supports_device("CUDA") == kiln.device_available(kiln.Device.CUDA)


def test_prepare_and_run_dynamic_batch():
    model = gemm_relu_model()
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10 - 0.5
    rep = kiln.backend.prepare(model, "CPU")
    for n in (2, 5, 2):
        x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
        (y,) = rep.run([x])
        assert y.shape == (n, 3)
        np.testing.assert_allclose(y, np.maximum(x @ w, 0), rtol=1e-5, atol=1e-6)
    assert len(rep._engines) == 2  # one exact-shape engine per distinct input shape
    engine = rep.engine_for({"x": (5, 4)})
    assert engine.profile_shape("x", 0, kiln.OptProfileSelector.MIN) == (5, 4)
    assert engine.profile_shape("x", 0, kiln.OptProfileSelector.MAX) == (5, 4)
    outputs = kiln.backend.run_model(model, {"x": np.ones((1, 4), np.float32)})
    assert outputs.y.shape == (1, 3)


def test_static_model_builds_in_prepare():
    rep = kiln.backend.prepare(gemm_relu_model(batch=3))
    assert len(rep._engines) == 1
    (y,) = rep.run(np.ones((3, 4), np.float32))
    assert y.shape == (3, 3)


def test_run_node():
    node = helper.make_node("Add", ["a", "b"], ["c"])
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones(3, dtype=np.float32)
    (c,) = kiln.backend.run_node(node, [a, b])
    np.testing.assert_array_equal(c, a + b)


def test_backend_errors_are_kiln_errors():
    rep = kiln.backend.prepare(gemm_relu_model())
    with pytest.raises(kiln.InvalidArgumentError, match="1 input"):
        rep.run([np.ones((1, 4), np.float32), np.ones((1, 4), np.float32)])
    with pytest.raises(kiln.InvalidArgumentError, match="float64"):
        rep.run([np.ones((1, 4))])


def test_an_input_whose_values_decide_shapes_is_a_shape_value_input():
    # Tile's repeats fed as a graph input: the engine takes them as shape values (TensorRT's shape
    # tensors), built for the values run() gives and checking them at run time; other values
    # build another engine, as other shapes do. prepare() waits for run() to give them.
    graph = helper.make_graph(
        [helper.make_node("Tile", ["x", "repeats"], ["y"])], "tile",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("repeats", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    rep = kiln.backend.prepare(model)
    assert rep.value_inputs == ["repeats"] and not rep._engines
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for reps in ([1, 2], [3, 1], [1, 2]):
        (y,) = rep.run({"x": x, "repeats": np.array(reps, np.int64)})
        np.testing.assert_array_equal(y, np.tile(x, reps))
    assert len(rep._engines) == 2
    engine = rep.engine_for({"x": (2, 3), "repeats": (2,)}, {"repeats": np.array([3, 1], np.int64)})
    assert engine.is_shape_inference_io("repeats") and not engine.is_shape_inference_io("x")
    with pytest.raises(kiln.UnsupportedError, match="'repeats' decide shapes by their values"):
        rep.engine_for({"x": (2, 3), "repeats": (2,)})


def test_sequences_and_optionals_are_lists_and_none():
    # A sequence input is a list, a sequence output a list; an optional input None or a value. An
    # engine is built for each length and presence run() gives, its tensors named xs[0], xs[1], ...
    seq_type = helper.make_tensor_sequence_value_info("xs", TensorProto.FLOAT, ["n"])
    opt_in = helper.make_value_info("bias", helper.make_optional_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, [3])))
    graph = helper.make_graph(
        [helper.make_node("ConcatFromSequence", ["xs"], ["y"], axis=0),
         helper.make_node("SequenceInsert", ["xs", "y"], ["grown"]),
         helper.make_node("OptionalHasElement", ["bias"], ["has_bias"])], "seq",
        [seq_type, opt_in],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_sequence_value_info("grown", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("has_bias", TensorProto.BOOL, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    rep = kiln.backend.prepare(model)
    a, b = np.arange(3, dtype=np.float32), np.arange(4, dtype=np.float32) + 10
    y, grown, has_bias = rep.run({"xs": [a, b], "bias": None})
    np.testing.assert_array_equal(y, np.concatenate([a, b]))
    assert isinstance(grown, list) and len(grown) == 3
    np.testing.assert_array_equal(grown[2], y)
    assert not has_bias
    y, grown, has_bias = rep.run({"xs": [b], "bias": np.ones(3, np.float32)})
    np.testing.assert_array_equal(y, b)
    assert len(grown) == 2 and has_bias
    assert len(rep._engines) == 2
    engine = rep._engines[next(iter(rep._engines))][0]
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    assert names[:2] == ["xs[0]", "xs[1]"], names


# onnx's own node tests (built in memory by the installed onnx), driven by onnx's BackendTest. It
# generates a test for every case it knows; keep only the included ones, rather than thousands of
# skips. The last four are opset-28 models (Mod fmod=0 on floats, signed BitShift, SpaceToDepth's
# CRD mode, SwiGLU). scripts/onnx_backend_test.py runs them all.
NODE_TESTS = (
    "test_relu_cpu", "test_add_bcast_cpu", "test_matmul_2d_cpu", "test_softmax_axis_1_cpu",
    "test_mod_float_edge_cases_fmod_0_float32_cpu", "test_bitshift_right_int8_negative_input_cpu",
    "test_spacetodepth_crd_mode_example_cpu", "test_swiglu_cpu",
    # Sequences and optionals: lists and None through kiln.backend.
    "test_sequence_insert_at_back_cpu", "test_split_to_sequence_1_cpu", "test_optional_has_element_empty_optional_input_cpu",
    "test_optional_get_element_sequence_cpu",
)
backend_test = onnx.backend.test.BackendTest(kiln.backend.KilnBackend, __name__)
onnx_node_cases = backend_test.test_cases  # a property that makes fresh classes on each access
for _name, _case in onnx_node_cases.items():
    for _attr in [a for a in vars(_case) if a.startswith("test_") and a not in NODE_TESTS]:
        delattr(_case, _attr)
    if any(a.startswith("test_") for a in vars(_case)):
        globals()[_name] = _case


def test_onnx_node_tests_are_collected():
    collected = {a for c in onnx_node_cases.values() for a in vars(c) if a.startswith("test_")}
    assert collected == set(NODE_TESTS)
