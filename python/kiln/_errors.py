"""kiln's exception classes: one per C++ StatusCode, all under kiln.Error.

The extension raises these (it looks them up here by StatusCode name); each message keeps the
library's context chain, e.g. "node 'conv_3' (Conv): input 'W' dim 1 ...".
"""

__all__ = [
    "Error", "InvalidArgumentError", "InvalidModelError", "UnsupportedError", "NotFoundError",
    "OutOfMemoryError", "DeviceError", "InternalError", "CancelledError",
]


class Error(RuntimeError):
    """Base class of every error kiln raises. ``code`` names the C++ StatusCode."""

    code = "kUnknown"


class InvalidArgumentError(Error, ValueError):
    """A call's argument is wrong: a shape outside the profile, a wrong dtype, a bad binding."""

    code = "kInvalidArgument"


class InvalidModelError(Error, ValueError):
    """The model or engine file is malformed, truncated or corrupted."""

    code = "kInvalidModel"


class UnsupportedError(Error):
    """The model, dtype or device needs something this build of kiln lacks."""

    code = "kUnsupported"


class NotFoundError(Error, LookupError):
    """A named tensor, input or file does not exist."""

    code = "kNotFound"


class OutOfMemoryError(Error, MemoryError):
    """An allocation failed or a size overflowed."""

    code = "kOutOfMemory"


class DeviceError(Error):
    """The device or its driver reported a failure."""

    code = "kDeviceError"


class InternalError(Error):
    """A bug in kiln: please report it with the message."""

    code = "kInternal"


class CancelledError(Error):
    """ExecutionContext.cancel() (from another thread) stopped the run."""

    code = "kCancelled"


for _cls in (Error, InvalidArgumentError, InvalidModelError, UnsupportedError, NotFoundError,
             OutOfMemoryError, DeviceError, InternalError, CancelledError):
    _cls.__module__ = "kiln"  # tracebacks say kiln.InvalidArgumentError, as users spell it
del _cls
