"""kiln.trt: TensorRT 10's Python spellings that are not kiln names, so TensorRT code runs with
``import kiln as trt`` and few other edits.

    logger = kiln.Logger(kiln.Logger.WARNING)
    builder = kiln.Builder(logger)                      # builds for the CPU (device= picks another)
    network = builder.create_network(0)
    parser = kiln.OnnxParser(network, logger)
    if not parser.parse_from_file("model.onnx"):
        print([str(parser.get_error(i)) for i in range(parser.num_errors)])
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    profile.set_shape("x", (1, 3, 224, 224), (4, 3, 224, 224), (32, 3, 224, 224))
    config.add_optimization_profile(profile)
    engine = kiln.Runtime(logger).deserialize_cuda_engine(builder.build_serialized_network(network, config))

The differences, all deliberate: where TensorRT returns None or False and logs, kiln raises its typed
error (kiln.Error subclasses) with the library's whole message, except OnnxParser, which records
errors as TensorRT's does. Tensor dtypes are numpy dtypes, so kiln.nptype is the identity on them.
"""

from __future__ import annotations

import enum
import os
import sys
from typing import Any, List, Optional, Union

import numpy as np

from . import _kiln
from . import onnx as _onnx
from ._errors import Error
from ._kiln import Engine, Network

__all__ = [
    "ILogger", "Logger", "NetworkDefinitionCreationFlag", "OnnxParser", "ParserError", "Runtime",
    "nptype", "volume",
]


class ILogger:
    """TensorRT's logger interface: subclass it and implement log(severity, msg)."""

    class Severity(enum.IntEnum):
        """Message severities, most severe first (TensorRT's order and names)."""

        INTERNAL_ERROR = 0
        ERROR = 1
        WARNING = 2
        INFO = 3
        VERBOSE = 4

    INTERNAL_ERROR = Severity.INTERNAL_ERROR
    ERROR = Severity.ERROR
    WARNING = Severity.WARNING
    INFO = Severity.INFO
    VERBOSE = Severity.VERBOSE

    def log(self, severity: "ILogger.Severity", msg: str) -> None:
        raise NotImplementedError


class Logger(ILogger):
    """TensorRT's default logger: prints messages at min_severity or more severe to stderr."""

    _TAGS = {0: "F", 1: "E", 2: "W", 3: "I", 4: "V"}

    def __init__(self, min_severity: ILogger.Severity = ILogger.Severity.WARNING):
        self.min_severity = ILogger.Severity(min_severity)

    def log(self, severity: ILogger.Severity, msg: str) -> None:
        if int(severity) <= int(self.min_severity):
            print(f"[kiln] [{self._TAGS.get(int(severity), '?')}] {msg}", file=sys.stderr)


class NetworkDefinitionCreationFlag(enum.IntEnum):
    """Accepted by Builder.create_network for TensorRT code; kiln ignores both (its networks always
    have explicit batch dims, and precision follows the BuilderConfig flags)."""

    EXPLICIT_BATCH = 0
    STRONGLY_TYPED = 1


class ParserError:
    """One error OnnxParser recorded: TensorRT's IParserError methods that kiln can fill."""

    def __init__(self, error: Error):
        self._error = error

    def code(self) -> str:
        """The kiln exception class name (TensorRT returns an ErrorCode)."""
        return type(self._error).__name__

    def desc(self) -> str:
        """The message, with the library's context chain (node, input, dims)."""
        return str(self._error)

    def exception(self) -> Error:
        """The kiln.Error the parse raised, to re-raise or inspect."""
        return self._error

    def __str__(self) -> str:
        return f"{self.code()}: {self.desc()}"

    def __repr__(self) -> str:
        return f"<kiln.ParserError {self}>"


def _log(logger: Optional[ILogger], severity: ILogger.Severity, msg: str) -> None:
    if logger is not None:
        logger.log(severity, msg)


class OnnxParser:
    """TensorRT's OnnxParser: parses an ONNX model into a Network from Builder.create_network().

    As in TensorRT, parse() and parse_from_file() return False on failure and record the errors
    (num_errors, get_error(i), clear_errors()), also logging them at ERROR.
    """

    def __init__(self, network: Network, logger: Optional[ILogger] = None):
        if not isinstance(network, Network):
            raise TypeError("OnnxParser(network, logger): expected a kiln.Network, got "
                            f"{type(network).__name__}")
        self.network = network
        self.logger = logger
        self._errors: List[ParserError] = []

    def parse(self, model: Union[bytes, bytearray, memoryview, Any], path: Optional[str] = None) -> bool:
        """Parses a serialized ModelProto (or an onnx.ModelProto). ``path`` is the model file's path:
        external data is read from its folder (without it, a model with external data fails)."""
        model_dir = os.path.dirname(os.path.abspath(os.fspath(path))) if path else ""
        return self._fill(lambda: _onnx.parse_bytes(model, model_dir))

    def parse_from_file(self, model: Union[str, "os.PathLike[str]"]) -> bool:
        """Parses an ONNX model file; external data is read from beside it."""
        return self._fill(lambda: _onnx.parse_file(model))

    def _fill(self, parse: Any) -> bool:
        try:
            parsed = parse()
        except Error as e:
            self._errors.append(ParserError(e))
            _log(self.logger, ILogger.ERROR, f"OnnxParser: {e}")
            return False
        self.network._take(parsed)
        return True

    @property
    def num_errors(self) -> int:
        return len(self._errors)

    def get_error(self, index: int) -> ParserError:
        return self._errors[index]

    def clear_errors(self) -> None:
        self._errors.clear()


class Runtime:
    """TensorRT's Runtime: turns serialized engine bytes into an Engine."""

    def __init__(self, logger: Optional[ILogger] = None):
        self.logger = logger

    def deserialize_cuda_engine(self, serialized_engine: Union[bytes, bytearray, memoryview]) -> Engine:
        """Engine.deserialize under TensorRT's name. A truncated, corrupted or mismatched engine
        raises (kiln.InvalidModelError or kiln.InvalidArgumentError, naming the cause) where
        TensorRT returns None; the message is logged at ERROR first."""
        try:
            return Engine.deserialize(serialized_engine)
        except Error as e:
            _log(self.logger, ILogger.ERROR, f"deserialize_cuda_engine: {e}")
            raise


def nptype(dtype: Any) -> np.dtype:
    """TensorRT's trt.nptype. kiln already returns numpy dtypes, so a numpy dtype comes back as it
    is; anything numpy.dtype() accepts is converted."""
    return dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)


def volume(shape: Any) -> int:
    """TensorRT's trt.volume: the number of elements of a shape (1 for a scalar's ())."""
    count = 1
    for d in shape:
        count *= int(d)
    return count


# Spelled here so that ``kiln.trt.MemoryPoolType`` and ``kiln.MemoryPoolType`` both work.
MemoryPoolType = _kiln.MemoryPoolType
