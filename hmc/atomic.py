"""Files written whole or not at all."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

__all__ = ["check_writable_file", "write_atomically"]


def check_writable_file(path: str | os.PathLike, name: str) -> None:
    """Raise naming the argument ``name`` unless ``path`` can be written as a file: a
    non-empty name, not a folder, in an existing folder where a file can be created (tried:
    permission bits do not tell, for root or on a read-only file system)."""
    message = f"{name}={str(path)!r} must name a file in an existing, writable folder"
    if not os.fspath(path) or os.path.isdir(path):
        raise ValueError(message)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(message)
    try:
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".hmc-write-check-")
    except OSError as error:
        raise ValueError(f"{message} ({error.strerror})") from None
    os.close(handle)
    os.remove(probe)


def write_atomically(path: str | os.PathLike, write: Callable[[str], Any]) -> None:
    """``write(temporary)`` beside ``path``, flushed to disk, then renamed to ``path``: a
    reader (or a later run) sees the old file or the new one, never half of one. The
    temporary file is removed when ``write`` fails."""
    folder, name = os.path.split(os.fspath(path))
    handle, temporary = tempfile.mkstemp(dir=folder or ".", prefix=f".{name}.", suffix=".tmp")
    os.close(handle)
    try:
        write(temporary)
        with open(temporary, "rb") as written:
            os.fsync(written.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
