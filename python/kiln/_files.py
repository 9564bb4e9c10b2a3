"""Files kiln's Python layer writes and reads (kiln.torch.save/load, the session's engine cache), the
way core/file.h writes them for the C++ side: only regular files, replaced in one rename."""
from __future__ import annotations

import os
import secrets
import stat
from typing import IO

from ._errors import InvalidArgumentError


def write_regular(path: "str | os.PathLike[str]", data: bytes, who: str) -> None:
    """Writes `data` to `path` as a regular file. An existing FIFO, device, directory or socket is
    refused and left as it is (opening a FIFO for writing blocks until a reader comes). The bytes go
    to a new file beside the target (created as a plain open would, 0666 less the umask, or with the
    replaced file's mode), are flushed to disk and replace the target in one rename, so a reader sees
    the old file or the whole new one. A symbolic link keeps pointing where it did."""
    path = os.fspath(path)
    target = os.path.realpath(path) if os.path.islink(path) else path
    try:
        existing = os.stat(target).st_mode
    except FileNotFoundError:
        existing = None
    if existing is not None and not stat.S_ISREG(existing):
        raise InvalidArgumentError(f"{who}: '{path}' exists and is not a regular file (a FIFO, device, directory or "
                                   "socket); kiln writes only regular files, and leaves it as it is")
    folder = os.path.dirname(os.path.abspath(target))
    tmp = os.path.join(folder, f".{os.path.basename(target)}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            if existing is not None:
                os.fchmod(f.fileno(), stat.S_IMODE(existing))
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def open_regular(path: "str | os.PathLike[str]", who: str) -> IO[bytes]:
    """`path` opened for reading only where it is a regular file (opening a FIFO would block)."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise InvalidArgumentError(f"{who}: cannot open '{path}': {e.strerror}") from e
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InvalidArgumentError(f"{who}: '{path}' is not a regular file (a FIFO, device, directory or socket)")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")
