# TensorRT 10's Python spellings on kiln: the seed's buffer walk with `import kiln as trt`, and the
# Builder/OnnxParser/BuilderConfig/Runtime build flow, including the parser's recorded errors.
import numpy as np
import pytest

import kiln
import kiln as trt
from conftest import built_engine, load_test_sets, model_path, require_models


class RecordingLogger(trt.ILogger):
    def __init__(self):
        super().__init__()
        self.messages = []

    def log(self, severity, msg):
        self.messages.append((severity, msg))


def test_seed_trt10_buffer_walk_vit_tiny_batch4():
    require_models()
    engine = built_engine("vit_tiny")  # profile 1..32 (opt 4)
    context = engine.create_execution_context()
    images = np.random.default_rng(3).uniform(-1, 1, (4, 3, 224, 224)).astype(np.float32)

    # The seed's TensorRT 10 code, unchanged apart from the import.
    context.set_input_shape("x", (4, 3, 224, 224))
    buffers = {}
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        shape = context.get_tensor_shape(name)
        dtype = trt.nptype(engine.get_tensor_dtype(name))
        mode = engine.get_tensor_mode(name)
        buffers[name] = np.empty(shape, dtype)
        if mode == trt.TensorIOMode.INPUT:
            buffers[name][...] = images
        else:
            buffers[name].fill(np.nan)
        context.set_tensor_address(name, buffers[name].ctypes.data)
    assert context.execute_async_v3(0) is True

    out = buffers["linear_16"]
    assert out.shape == (4, 1000)  # the run's shape, never the profile's max (32, 1000)
    assert np.all(np.isfinite(out)), "execute_async_v3 left output elements unwritten"
    expected = engine.create_execution_context().run({"x": images})["linear_16"]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_engine_properties_and_profile_shapes():
    require_models()
    engine = built_engine("vit_tiny")
    assert engine.num_io_tensors == 2 and isinstance(engine.num_io_tensors, int)
    assert engine.num_optimization_profiles == engine.num_profiles == 1
    assert engine.num_layers > 0
    triple = ((1, 3, 224, 224), (4, 3, 224, 224), (32, 3, 224, 224))
    assert engine.get_tensor_profile_shape("x", 0) == triple
    assert engine.profile_shape("x", 0) == triple
    assert engine.profile_shape("x", 0, kiln.OptProfileSelector.OPT) == triple[1]
    with pytest.raises(kiln.Error):
        engine.get_tensor_profile_shape("x", 1)
    context = engine.create_execution_context()
    assert context.set_optimization_profile_async(0, 0) is True
    assert context.active_optimization_profile == 0
    assert context.set_input_shape("x", (2, 3, 224, 224)) is True
    with pytest.raises(kiln.InvalidArgumentError, match="stream_handle 0"):
        context.execute_async_v3(12345)  # a CPU engine has no streams
    assert trt.volume(context.get_tensor_shape("linear_16")) == 2000


def test_an_unpinned_context_takes_the_profile_with_the_nearest_opt():
    require_models()
    network = kiln.onnx.parse_file(model_path("testmod_linear"))
    config = kiln.BuilderConfig()
    small, large = kiln.OptimizationProfile(), kiln.OptimizationProfile()
    small.set_dimensions("x", (1, 1, 16), (2, 2, 16), (4, 4, 16))
    large.set_dimensions("x", (3, 3, 16), (8, 8, 16), (10, 10, 16))
    config.add_profile(small)
    config.add_profile(large)
    engine = kiln.Builder(kiln.Device.CPU).build(network, config)
    context = engine.create_execution_context()
    assert not context.profile_pinned
    for shape, profile in [((2, 2, 16), 0), ((9, 9, 16), 1), ((4, 4, 16), 1), ((1, 3, 16), 0)]:
        context.set_input_shape("x", shape)
        assert context.active_optimization_profile == profile, shape
        (out,) = context.run(None, {"x": np.ones(shape, np.float32)})
        assert out.shape == (shape[0], shape[1] + 1, 8)
    with pytest.raises(kiln.InvalidArgumentError, match="fits none of the engine's 2 optimization profiles"):
        context.set_input_shape("x", (12, 2, 16))
    context.set_optimization_profile(0)
    assert context.profile_pinned
    with pytest.raises(kiln.InvalidArgumentError, match=r"outside the range \[1, 4\] of optimization profile 0"):
        context.set_input_shape("x", (9, 9, 16))


def test_nptype_is_identity_on_numpy_dtypes():
    dt = np.dtype(np.float32)
    assert kiln.nptype(dt) is dt
    assert kiln.nptype(np.float16) == np.dtype(np.float16)
    assert kiln.volume(()) == 1


def test_logger_severities(capsys):
    logger = trt.Logger(trt.Logger.WARNING)
    assert logger.min_severity == trt.Logger.Severity.WARNING
    logger.log(trt.Logger.ERROR, "shown")
    logger.log(trt.Logger.VERBOSE, "hidden")
    err = capsys.readouterr().err
    assert "[E] shown" in err and "hidden" not in err
    levels = [trt.Logger.INTERNAL_ERROR, trt.Logger.ERROR, trt.Logger.WARNING, trt.Logger.INFO,
              trt.Logger.VERBOSE]
    assert levels == sorted(levels) == list(trt.Logger.Severity)


def test_trt_style_build_flow():
    require_models()
    logger = RecordingLogger()
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(model_path("testmod_linear").read_bytes()) is True
    assert parser.num_errors == 0
    assert network.num_inputs == 1 and network.num_outputs == 1
    x_in = network.get_input(0)
    assert x_in.name == "x" and x_in.dtype == np.float32 and x_in.shape[-1] == 16 and -1 in x_in.shape

    config = builder.create_builder_config()
    config.set_flag(trt.BuilderFlag.TF32)
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, 1 << 30)
    assert config.get_memory_pool_limit(trt.MemoryPoolType.WORKSPACE) == 1 << 30
    profile = builder.create_optimization_profile()
    profile.set_shape("x", (1, 1, 16), (4, 4, 16), (10, 10, 16))
    assert profile.get_shape("x") == ([1, 1, 16], [4, 4, 16], [10, 10, 16])
    assert config.add_optimization_profile(profile) == 0
    assert config.num_optimization_profiles == 1

    serialized = builder.build_serialized_network(network, config)
    assert isinstance(serialized, bytes) and serialized[:7] == b"KILNENG"
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(serialized)
    assert engine.get_tensor_profile_shape("x", 0) == ((1, 1, 16), (4, 4, 16), (10, 10, 16))
    assert runtime.deserialize_cuda_engine(engine.serialize()).num_io_tensors == 2
    direct = builder.build_engine_with_config(network, config)

    context = engine.create_execution_context()
    (set_inputs, set_outputs), *_ = load_test_sets("testmod_linear")
    got = context.run({"x": set_inputs[0]})["cat"]
    np.testing.assert_allclose(got, set_outputs[0], rtol=1e-3, atol=1e-4)
    np.testing.assert_array_equal(direct.create_execution_context().run({"x": set_inputs[0]})["cat"], got)

    # TensorRT's runtime returns None for bad bytes; kiln raises the reason and logs it too.
    with pytest.raises((kiln.InvalidModelError, kiln.InvalidArgumentError), match="truncated"):
        runtime.deserialize_cuda_engine(serialized[:100])
    assert logger.messages and logger.messages[-1][0] == trt.Logger.ERROR
    # kiln's own spellings are untouched.
    assert kiln.Builder(kiln.Device.CPU).build(network, config).num_io_tensors == 2


def test_onnx_parser_records_errors_like_tensorrt(tmp_path):
    logger = RecordingLogger()
    builder = trt.Builder(logger)
    network = builder.create_network()
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(b"\x08\x07garbage" * 10) is False
    assert parser.parse_from_file(str(tmp_path / "absent.onnx")) is False
    assert parser.num_errors == 2
    assert parser.get_error(0).code() == "InvalidModelError"
    assert parser.get_error(1).code() == "NotFoundError" and "absent.onnx" in parser.get_error(1).desc()
    assert isinstance(parser.get_error(0).exception(), kiln.InvalidModelError)
    assert [s for s, _ in logger.messages] == [trt.Logger.ERROR, trt.Logger.ERROR]
    parser.clear_errors()
    assert parser.num_errors == 0
    config = builder.create_builder_config()
    with pytest.raises(kiln.InvalidArgumentError, match="network is empty"):
        builder.build_serialized_network(network, config)
    with pytest.raises(TypeError):
        kiln.Builder(42)
    assert kiln.Builder(None) is not None and kiln.Builder() is not None


def test_onnx_parser_takes_model_proto_and_parse_bytes_too():
    require_models()
    onnx = pytest.importorskip("onnx")
    proto = onnx.load(str(model_path("testmod_linear")))
    network = kiln.Builder(kiln.Logger()).create_network()
    assert kiln.OnnxParser(network).parse(proto)
    assert network.get_input(0).symbolic_shape[-1] == "16"
    assert kiln.onnx.parse_bytes(proto).num_inputs == 1


def test_timing_cache_file_makes_rebuilds_identical(tmp_path):
    require_models()
    builder = trt.Builder(RecordingLogger())
    network = builder.create_network(0)
    assert trt.OnnxParser(network, RecordingLogger()).parse(model_path("testmod_linear").read_bytes())
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    profile.set_shape("x", (1, 1, 16), (4, 4, 16), (10, 10, 16))
    config.add_optimization_profile(profile)
    assert config.builder_optimization_level == 3
    with pytest.raises(kiln.InvalidArgumentError, match=r"outside 0\.\.5"):
        config.builder_optimization_level = 9
    config.builder_optimization_level = 2

    cache = tmp_path / "linear.tc"
    config.set_timing_cache_file(cache)
    assert config.timing_cache_file == str(cache)
    first = builder.build_serialized_network(network, config)
    written = cache.read_bytes()
    assert written[:8] == b"KILNTCAC"
    assert builder.build_serialized_network(network, config) == first
    assert cache.read_bytes() == written

    # A corrupt cache warns, the build goes on, and the file is rewritten.
    cache.write_bytes(written[:-3])
    with pytest.warns(RuntimeWarning, match="truncated or corrupted"):
        assert builder.build_serialized_network(network, config) == first
    assert cache.read_bytes() == written
