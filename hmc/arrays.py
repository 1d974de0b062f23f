"""The array engine of a run: NumPy on the CPU, torch on other devices.

The sampler's own arithmetic (static HMC's transition, the integrator, the metric, the
adaptation, the recorder, the loop) is written once, against the functions NumPy and torch
share (``where``, ``exp``, indexing, ...), and runs on the arrays it is given. A run picks
its engine once, from the device (:func:`engine_for`), never from the number of chains,
and records it. On a CPU a NumPy operation on a small array costs about a microsecond and
a torch operation several; on an accelerator torch keeps every array on the device. NUTS
keeps each chain's tree on the host with the NumPy engine and batched trees with torch
(:mod:`hmc.kernels.nuts_host`, :mod:`hmc.kernels.nuts`). The user's log density always
receives torch tensors: on the CPU they share the NumPy arrays' memory, so nothing is
copied.

The few functions whose names or signatures differ between the two live here, with the
conversions between the two kinds of records.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "ENGINES",
    "as_arrays",
    "as_tensors",
    "engine_for",
    "map_record",
    "namespace",
    "to_float64",
    "to_int64",
    "zeros",
]

#: the engines a run may compute in (``"auto"`` picks by device)
ENGINES = ("auto", "numpy", "torch")

type Array = torch.Tensor | np.ndarray


def engine_for(device: torch.device, engine: str = "auto") -> str:
    """The engine of a run on ``device``: ``"numpy"`` on the CPU and ``"torch"`` elsewhere
    for ``"auto"``; an explicit choice is checked (NumPy arrays live on the CPU only)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine == "auto":
        return "numpy" if device.type == "cpu" else "torch"
    if engine == "numpy" and device.type != "cpu":
        raise ValueError(
            f"engine='numpy' computes on the CPU, but the chains are on {device}; "
            "use engine='torch' (or 'auto')"
        )
    return engine


def namespace(x: Array):
    """``numpy`` for a NumPy array, ``torch`` for a tensor."""
    return np if isinstance(x, np.ndarray) else torch


_KINDS = {"int": (np.int64, torch.int64), "bool": (np.bool_, torch.bool)}


def zeros(like: Array, shape: tuple[int, ...], kind: str | None = None) -> Array:
    """Zeros of ``shape`` in the engine and on the device of ``like``, with its dtype, or
    ``kind`` ``"int"`` (int64) or ``"bool"``."""
    if isinstance(like, np.ndarray):
        return np.zeros(shape, dtype=like.dtype if kind is None else _KINDS[kind][0])
    dtype = like.dtype if kind is None else _KINDS[kind][1]
    return torch.zeros(shape, dtype=dtype, device=like.device)


def to_int64(x: Array) -> Array:
    """``x`` as int64 (same engine; truncates floats)."""
    if isinstance(x, np.ndarray):
        return x.astype(np.int64)
    return x.to(torch.int64)


def to_float64(x: Array) -> Array:
    """``x`` as float64 (same engine)."""
    if isinstance(x, np.ndarray):
        return x.astype(np.float64)
    return x.to(torch.float64)


def map_record(fn, record):
    """``record`` (a tensor or array, None, or nested NamedTuples of them) with ``fn``
    applied to every field that is not a record or None."""
    if isinstance(record, tuple) and hasattr(record, "_fields"):
        return type(record)(*(map_record(fn, field) for field in record))
    return None if record is None else fn(record)


def as_arrays(record):
    """A (nested) record with every CPU tensor replaced by the NumPy array that shares its
    memory; other fields (numbers, arrays, None) are kept as they are."""
    return map_record(lambda x: x.detach().numpy() if isinstance(x, torch.Tensor) else x, record)


def as_tensors(record):
    """The inverse of :func:`as_arrays`: NumPy arrays become CPU tensors sharing their
    memory."""
    return map_record(lambda x: torch.from_numpy(x) if isinstance(x, np.ndarray) else x, record)
