"""kiln.onnx: the ONNX frontend (C++ kiln::onnx), named as in C++."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Union

from . import _kiln
from ._kiln import Network

if TYPE_CHECKING:
    import onnx

__all__ = ["parse_file", "parse_bytes", "Network"]


def parse_file(path: Union[str, "os.PathLike[str]"]) -> Network:
    """Parses an ONNX model file into a Network, without holding the GIL.

    External data is read relative to the model's folder and may not leave it. Raises
    kiln.NotFoundError for a missing file and kiln.InvalidModelError for a malformed one.
    """
    return _kiln._onnx_parse_file(os.fspath(path))


def parse_bytes(data: Union[bytes, bytearray, memoryview, "onnx.ModelProto"], model_dir: str = "") -> Network:
    """Parses a serialized ModelProto (e.g. ``model.SerializeToString()``) or an onnx.ModelProto.

    ``model_dir`` is the folder external data is read from; "" refuses external data.
    """
    if hasattr(data, "SerializeToString"):  # an onnx.ModelProto: kiln parses its bytes
        data = data.SerializeToString()
    return _kiln._onnx_parse_bytes(data, model_dir)
