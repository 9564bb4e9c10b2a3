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
"""

from ._kiln import (
    Builder as Builder,
    BuilderConfig as BuilderConfig,
    BuilderFlag as BuilderFlag,
    Device as Device,
    Engine as Engine,
    ExecutionContext as ExecutionContext,
    Network as Network,
    OptimizationProfile as OptimizationProfile,
    OptProfileSelector as OptProfileSelector,
    TensorIOMode as TensorIOMode,
    device_available as device_available,
)
from ._errors import (
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

__version__ = "0.1.0"

__all__ = [
    "Builder", "BuilderConfig", "BuilderFlag", "Device", "DeviceError", "Engine", "Error",
    "ExecutionContext", "InternalError", "InvalidArgumentError", "InvalidModelError", "Network",
    "NotFoundError", "OptimizationProfile", "OptProfileSelector", "OutOfMemoryError",
    "TensorIOMode", "UnsupportedError", "device_available", "onnx",
]
