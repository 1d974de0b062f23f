"""Files written whole or not at all."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

__all__ = ["write_atomically"]


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
