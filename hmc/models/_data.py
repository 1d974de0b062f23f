"""Packaged posteriordb files, and model constants handed out in a parameter's dtype.

The files live in ``hmc/models/data/<posterior name>/`` (``data.json``, ``reference.json``;
see ``data/README.md`` for their source and licence).
"""

from __future__ import annotations

import json
from importlib import resources
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

__all__ = ["Data", "read_json"]


def read_json(posterior: str, file: str = "data.json") -> dict[str, Any]:
    """The parsed ``data/<posterior>/<file>`` shipped with the package."""
    path = resources.files("hmc.models").joinpath("data", posterior, file)
    if not path.is_file():
        raise FileNotFoundError(f"no packaged file {file!r} for posterior {posterior!r}")
    return json.loads(path.read_text(encoding="utf-8"))


class Data:
    """Constant arrays of a model, as tensors in the dtype and on the device of a parameter.

    Python numbers and lists (as read from JSON) are real data: they become floating-point
    arrays and take the parameter's dtype, as do floating NumPy arrays; integer and boolean
    NumPy arrays (indices, masks) keep their dtype. Each (dtype, device) is converted once
    and cached.

    Examples
    --------
    >>> data = Data(y=[1, 2], index=np.arange(2))
    >>> d = data.like(torch.zeros((), dtype=torch.float32))
    >>> d.y.dtype, d.index.dtype
    (torch.float32, torch.int64)
    """

    def __init__(self, **arrays: Any) -> None:
        self.arrays = {name: _array(value) for name, value in arrays.items()}
        self._cache: dict[tuple[torch.dtype, torch.device], SimpleNamespace] = {}

    def like(self, t: torch.Tensor) -> SimpleNamespace:
        """The arrays as tensors ``d.name``, in ``t``'s floating dtype and on its device."""
        key = (t.dtype, t.device)
        if key not in self._cache:
            self._cache[key] = SimpleNamespace(
                **{name: _tensor(a, t.dtype, t.device) for name, a in self.arrays.items()}
            )
        return self._cache[key]


def _array(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    return np.asarray(value, dtype=np.float64)


def _tensor(array: np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if np.issubdtype(array.dtype, np.floating):
        return torch.as_tensor(array, dtype=dtype, device=device)
    return torch.as_tensor(array, device=device)
