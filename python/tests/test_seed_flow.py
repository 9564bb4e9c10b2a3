# The seeds' TensorRT-style flow: iterate IO tensors, size buffers from tensor_shape/tensor_dtype
# after set_input_shape, bind addresses, execute. Batch 4 of vit_tiny gives (4, 1000), never (32, 1000).
import numpy as np
import pytest

import kiln
from conftest import built_engine, require_models


def seed_flow(engine, batch, images, bind):
    context = engine.create_execution_context()
    buffers = {}
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        if engine.get_tensor_mode(name) == kiln.TensorIOMode.INPUT:
            context.set_input_shape(name, (batch, 3, 224, 224))
    for i in range(engine.num_io_tensors):
        name = engine.io_tensor_name(i)
        shape = context.tensor_shape(name)
        if engine.tensor_mode(name) == kiln.TensorIOMode.INPUT:
            buffers[name] = np.ascontiguousarray(images[:batch], dtype=engine.tensor_dtype(name))
        else:
            # NaN-filled, so a run that leaves any element unwritten fails the finiteness check.
            buffers[name] = np.full(shape, np.nan, dtype=engine.get_tensor_dtype(name))
        assert buffers[name].shape == tuple(shape)
        context.set_tensor_address(name, bind(buffers[name]))
        if isinstance(bind(buffers[name]), int):
            assert context.tensor_address(name) == buffers[name].ctypes.data
    context.execute()
    return buffers


@pytest.mark.parametrize("binding", ["int_pointer", "array"])
@pytest.mark.parametrize("model,output", [("vit_tiny", "linear_16"), ("mobilenet_v3_small", "linear_1")])
def test_batch4_seed_flow(model, output, binding):
    require_models()
    engine = built_engine(model)
    assert engine.tensor_shape(output) == (-1, 1000)
    assert engine.tensor_symbolic_shape(output) == ["batch", "1000"]
    assert engine.get_tensor_shape("x") == (-1, 3, 224, 224)
    assert engine.profile_shape("x", 0, kiln.OptProfileSelector.MAX) == (32, 3, 224, 224)
    images = np.random.default_rng(7).uniform(-1, 1, (4, 3, 224, 224)).astype(np.float32)
    bind = (lambda a: a.ctypes.data) if binding == "int_pointer" else (lambda a: a)
    buffers = seed_flow(engine, 4, images, bind)
    out = buffers[output]
    assert out.shape == (4, 1000)  # never (32, 1000)
    assert np.all(np.isfinite(out)), "execute() left elements of the output unwritten"
    # Equal to run()'s answer, and each row equals its image run alone.
    context = engine.create_execution_context()
    np.testing.assert_allclose(out, context.run({"x": images})[output], rtol=1e-5, atol=1e-6)
    alone = context.run({"x": images[2:3]})[output]
    np.testing.assert_allclose(out[2:3], alone, rtol=1e-4, atol=1e-5)


def test_buffer_sized_for_profile_max_is_refused():
    require_models()
    engine = built_engine("vit_tiny")
    context = engine.create_execution_context()
    x = np.zeros((4, 3, 224, 224), np.float32)
    context.set_tensor_address("x", x)  # binding an input array sets its shape
    assert context.tensor_shape("x") == (4, 3, 224, 224)
    assert context.tensor_shape("linear_16") == (4, 1000)
    context.set_tensor_address("linear_16", np.empty((32, 1000), np.float32))
    with pytest.raises(kiln.InvalidArgumentError, match=r"\(32, 1000\).*\(4, 1000\)"):
        context.execute()
    # Reading an input's shape from a later set_input_shape is checked the same way.
    context.set_tensor_address("linear_16", np.empty((4, 1000), np.float32))
    context.set_input_shape("x", (2, 3, 224, 224))
    with pytest.raises(kiln.InvalidArgumentError, match=r"'x'.*\(4, 3, 224, 224\).*\(2, 3, 224, 224\)"):
        context.execute()
