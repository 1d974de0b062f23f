"""Files written whole or not at all."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

__all__ = ["check_writable_file", "write_atomically"]


def check_writable_file(path: str | os.PathLike, name: str) -> None:
    """Raise naming the argument ``name`` unless ``path`` can be written as a file: not a
    folder, in an existing folder this process may write to."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise ValueError(f"{name}={str(path)!r} must name a file in an existing, writable folder")


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
