"""kiln.onnx: the ONNX frontend (C++ kiln::onnx), named as in C++."""

from __future__ import annotations

import os
from typing import Union

from . import _kiln
from ._kiln import Network

__all__ = ["parse_file", "parse_bytes", "Network"]


def parse_file(path: Union[str, "os.PathLike[str]"]) -> Network:
    """Parses an ONNX model file into a Network, without holding the GIL.

    External data is read relative to the model's folder and may not leave it. Raises
    kiln.NotFoundError for a missing file and kiln.InvalidModelError for a malformed one.
    """
    return _kiln._onnx_parse_file(os.fspath(path))


def parse_bytes(data: bytes, model_dir: str = "") -> Network:
    """Parses a serialized ModelProto (e.g. ``model.SerializeToString()``).

    ``model_dir`` is the folder external data is read from; "" refuses external data.
    """
    return _kiln._onnx_parse_bytes(data, model_dir)
