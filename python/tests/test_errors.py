# Each kiln Status code arrives as its own exception class, with the library's whole message.
import numpy as np
import pytest

import kiln
from conftest import built_engine, model_path, require_models


def test_exception_hierarchy():
    for cls in (kiln.InvalidArgumentError, kiln.InvalidModelError, kiln.UnsupportedError,
                kiln.NotFoundError, kiln.OutOfMemoryError, kiln.DeviceError, kiln.InternalError):
        assert issubclass(cls, kiln.Error)
    assert issubclass(kiln.InvalidArgumentError, ValueError)
    assert issubclass(kiln.NotFoundError, LookupError)


def test_shape_outside_profile_names_input_dim_symbol_and_range():
    require_models()
    context = built_engine("testmod_linear").create_execution_context()
    with pytest.raises(kiln.InvalidArgumentError) as e:
        context.set_input_shape("x", (11, 4, 16))
    for part in ("'x'", "dim 0", "batch_size", "11", "[1, 10]"):
        assert part in str(e.value)
    with pytest.raises(kiln.InvalidArgumentError, match="rank 3"):
        context.set_input_shape("x", (4, 16))
    with pytest.raises(kiln.InvalidArgumentError, match="'x'.*outside"):
        context.run({"x": np.zeros((1, 11, 16), np.float32)})


def test_wrong_dtype():
    require_models()
    engine = built_engine("testmod_linear")
    context = engine.create_execution_context()
    with pytest.raises(kiln.InvalidArgumentError, match="'x' has dtype float64.*float32"):
        context.run({"x": np.zeros((1, 1, 16))})
    with pytest.raises(kiln.InvalidArgumentError, match="'x'.*int64.*float32"):
        context.set_tensor_address("x", np.zeros((1, 1, 16), np.int64))
    with pytest.raises(kiln.InvalidArgumentError, match="'x'.*complex"):
        context.run({"x": np.zeros((1, 1, 16), np.complex64)})
    with pytest.raises(kiln.InvalidArgumentError, match="'x'.*expected a numpy array"):
        context.run({"x": "not an array"})
    with pytest.raises(kiln.InvalidArgumentError, match="read-only"):
        out = np.empty((1, 2, 8), np.float32)
        out.flags.writeable = False
        context.set_tensor_address("cat", out)


def test_unknown_names():
    require_models()
    engine = built_engine("testmod_linear")
    context = engine.create_execution_context()
    with pytest.raises(kiln.NotFoundError, match="'y'"):
        context.set_input_shape("y", (4, 4, 16))
    with pytest.raises(kiln.NotFoundError, match="'y'"):
        context.set_tensor_address("y", 0)
    with pytest.raises(kiln.NotFoundError, match="'y'"):
        context.run({"y": np.zeros((1, 1, 16), np.float32)})
    with pytest.raises(kiln.Error, match="'y'"):
        engine.tensor_dtype("y")
    assert engine.tensor_mode("y") == kiln.TensorIOMode.NONE
    with pytest.raises(IndexError):
        engine.io_tensor_name(engine.num_io_tensors)
    with pytest.raises(kiln.InvalidArgumentError, match="missing input.*x"):
        context.run({})
    with pytest.raises(kiln.Error, match="not set: x"):
        engine.create_execution_context().execute()
    # run() leaves no stale addresses behind: execute() afterwards asks for bindings again.
    context.run({"x": np.zeros((1, 1, 16), np.float32)})
    assert context.tensor_address("x") == 0
    with pytest.raises(kiln.Error, match="'x' has no address"):
        context.execute()


def test_corrupt_and_missing_engine_files(tmp_path):
    require_models()
    data = built_engine("testmod_linear").serialize()
    assert kiln.Engine.deserialize(data).num_io_tensors == 2
    truncated = tmp_path / "truncated.kiln"
    truncated.write_bytes(data[: len(data) // 2])
    # The engine file reader reports these as InvalidArgument or InvalidModel, always naming the cause.
    with pytest.raises((kiln.InvalidArgumentError, kiln.InvalidModelError), match="truncated"):
        kiln.Engine.load(truncated)
    flipped = bytearray(data)
    flipped[len(data) // 3] ^= 0x10
    (tmp_path / "flipped.kiln").write_bytes(bytes(flipped))
    with pytest.raises((kiln.InvalidArgumentError, kiln.InvalidModelError)):
        kiln.Engine.load(tmp_path / "flipped.kiln")
    with pytest.raises(kiln.Error):
        kiln.Engine.load(tmp_path / "absent.kiln")
    with pytest.raises(kiln.Error):
        kiln.onnx.parse_file(tmp_path / "absent.onnx")
    (tmp_path / "garbage.onnx").write_bytes(b"\x08\x07garbage" * 10)
    with pytest.raises(kiln.InvalidModelError):
        kiln.onnx.parse_file(tmp_path / "garbage.onnx")


def test_profile_errors_raise_at_build():
    require_models()
    network = kiln.onnx.parse_file(model_path("testmod_linear"))
    profile = kiln.OptimizationProfile()
    with pytest.raises(kiln.InvalidArgumentError, match="'x' dim 0.*min 4, opt 2"):
        profile.set_dimensions("x", (4, 4, 16), (2, 4, 16), (10, 10, 16))  # min > opt
    profile.set_dimensions("x", (1, 1, 16), (4, 4, 16), (10, 10, 16))
    assert profile.get_dimensions("x") == ([1, 1, 16], [4, 4, 16], [10, 10, 16])
    config = kiln.BuilderConfig()
    config.add_profile(profile)
    profile2 = kiln.OptimizationProfile()
    profile2.set_dimensions("y", (1, 1, 16), (4, 4, 16), (10, 10, 16))  # no such input
    config2 = kiln.BuilderConfig()
    config2.add_profile(profile2)
    with pytest.raises(kiln.Error, match="'y'"):
        kiln.Builder().build(network, config2)
    assert kiln.Builder(kiln.Device.CPU).build(network, config).num_profiles == 1


def test_profile_steps_refuse_shapes_off_them():
    require_models()
    network = kiln.onnx.parse_file(model_path("testmod_linear"))
    profile = kiln.OptimizationProfile()
    with pytest.raises(kiln.InvalidArgumentError, match="opt 3 is not min 2 plus a multiple of the step 2"):
        profile.set_dimensions("x", (1, 2, 16), (4, 3, 16), (10, 10, 16), steps=(1, 2, 1))
    profile.set_dimensions("x", (1, 2, 16), (4, 4, 16), (10, 10, 16), steps=(1, 2, 1))
    config = kiln.BuilderConfig()
    config.add_profile(profile)
    context = kiln.Builder().build(network, config).create_execution_context()
    out = context.run({"x": np.ones((3, 6, 16), np.float32)})
    assert next(iter(out.values())).shape[:2] == (3, 7)  # the model appends a row: seq_len + 1
    with pytest.raises(kiln.InvalidArgumentError, match=r"steps of 2 \(the nearest values are 4 and 6\)"):
        context.set_input_shape("x", (3, 5, 16))
