"""kiln: ONNX inference optimizer and runtime.

The names mirror kiln's C++ API (include/kiln.h): parse a model with kiln.onnx.parse_file, build an
Engine for OptimizationProfiles with a Builder, run it through an ExecutionContext. Errors raise
kiln.Error subclasses, one per Status code. kiln.backend adapts kiln to onnx's backend API.

    import kiln, numpy as np
    network = kiln.onnx.parse_file("model.onnx")
    config = kiln.BuilderConfig()
    profile = kiln.OptimizationProfile()
    profile.set_dimensions("x", (1, 3, 224, 224), (4, 3, 224, 224), (32, 3, 224, 224))
    config.add_profile(profile)
    engine = kiln.Builder(kiln.Device.CPU).build(network, config)
    context = engine.create_execution_context()
    outputs = context.run({"x": np.zeros((4, 3, 224, 224), np.float32)})  # {"out": (4, 1000)}

TensorRT 10's spellings work beside kiln's (kiln.trt: Logger, Runtime, OnnxParser, nptype, and
Builder(logger).create_network/create_builder_config/build_serialized_network), and ONNX Runtime's
InferenceSession is kiln.InferenceSession (kiln.session), with engines cached on disk. kiln.serve's
DynamicBatcher serves one engine to many callers, batching their requests to fit its profiles.
"""

from ._kiln import (
    Builder as Builder,
    BuilderConfig as BuilderConfig,
    BuilderFlag as BuilderFlag,
    Device as Device,
    Engine as Engine,
    ExecutionContext as ExecutionContext,
    MemoryPoolType as MemoryPoolType,
    Network as Network,
    NetworkTensor as NetworkTensor,
    OptimizationProfile as OptimizationProfile,
    OptProfileSelector as OptProfileSelector,
    TensorIOMode as TensorIOMode,
    built_with_cuda as built_with_cuda,
    device_available as device_available,
)
from ._kiln import _pinned_bytes
from ._errors import (
    CancelledError as CancelledError,
    DeviceError as DeviceError,
    Error as Error,
    InternalError as InternalError,
    InvalidArgumentError as InvalidArgumentError,
    InvalidModelError as InvalidModelError,
    NotFoundError as NotFoundError,
    OutOfMemoryError as OutOfMemoryError,
    UnsupportedError as UnsupportedError,
)
from . import onnx as onnx
from .trt import (
    ILogger as ILogger,
    Logger as Logger,
    NetworkDefinitionCreationFlag as NetworkDefinitionCreationFlag,
    OnnxParser as OnnxParser,
    ParserError as ParserError,
    Runtime as Runtime,
    nptype as nptype,
    volume as volume,
)
from .session import (
    InferenceSession as InferenceSession,
    KilnWarning as KilnWarning,
    NodeArg as NodeArg,
    get_available_providers as get_available_providers,
)

__version__ = "0.1.0"


def empty_pinned(shape, dtype=float) -> "numpy.ndarray":
    """An uninitialized numpy array of `shape` and `dtype` in page-locked host memory (CuPy's
    cupyx.empty_pinned, torch's pin_memory). A CUDA engine's run() copies such an input to the
    device from where it lies, without its staging copy: fill one buffer in place (np.concatenate's
    out=, np.copyto) and run it. The memory is freed when the last view of the array goes. Raises
    kiln.UnsupportedError where there is no CUDA device (kiln.device_available(kiln.Device.CUDA))."""
    import numpy

    dt = numpy.dtype(dtype)
    dims = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise InvalidArgumentError(f"empty_pinned: shape {dims} has a negative dim")
    count = 1
    for d in dims:
        count *= d
    raw = _pinned_bytes(max(count * dt.itemsize, 1))
    return raw[: count * dt.itemsize].view(dt).reshape(dims)

__all__ = [
    "Builder", "BuilderConfig", "BuilderFlag", "CancelledError", "Device", "DeviceError", "Engine", "Error",
    "ExecutionContext", "ILogger", "InferenceSession", "InternalError", "InvalidArgumentError",
    "InvalidModelError", "KilnWarning", "Logger", "MemoryPoolType", "Network",
    "NetworkDefinitionCreationFlag", "NetworkTensor", "NodeArg", "NotFoundError", "OnnxParser",
    "OptimizationProfile", "OptProfileSelector", "OutOfMemoryError", "ParserError", "Runtime",
    "TensorIOMode", "UnsupportedError", "built_with_cuda", "device_available", "empty_pinned",
    "get_available_providers", "nptype",
    "onnx", "volume",
]
