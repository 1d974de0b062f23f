"""Small records that carry the sampler's state, and row-wise helpers over them.

Shapes: ``C`` chains, ``D`` unconstrained dimensions. Every tensor in a record has the
chain axis first, so the helpers below select, merge and gather chains uniformly for any
record (a ``NamedTuple`` of tensors). The helpers also take records of NumPy arrays, which
the host bookkeeping of CPU runs keeps; ``as_arrays`` and ``as_tensors`` turn a record of
CPU tensors into NumPy arrays sharing its memory and back.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

__all__ = [
    "State",
    "array_module",
    "as_arrays",
    "as_tensors",
    "put_rows",
    "take_rows",
    "true_rows",
    "where_rows",
]


class State(NamedTuple):
    """A point in parameter space with its energy and gradient.

    position : ``(C, D)``; potential : ``(C,)`` U = -log p; grad : ``(C, D)`` dU/dq.
    The gradient travels with the state, so no transition recomputes it at its start.
    """

    position: torch.Tensor
    potential: torch.Tensor
    grad: torch.Tensor


def array_module(x: torch.Tensor | np.ndarray):
    """``numpy`` for a NumPy array, ``torch`` for a tensor: the functions that code shared
    by the tensor and host bookkeepings calls (``where``, ``exp``, ``log``, ``sqrt``,
    ``nan_to_num``) have the same signature in both."""
    return np if isinstance(x, np.ndarray) else torch


def as_arrays(record):
    """A (nested) record with every CPU tensor replaced by the NumPy array that shares its
    memory; other fields (numbers, lists, arrays) are kept as they are."""
    if isinstance(record, torch.Tensor):
        return record.numpy()
    if isinstance(record, tuple) and hasattr(record, "_fields"):
        return type(record)(*map(as_arrays, record))
    return record


def as_tensors(record):
    """The inverse of :func:`as_arrays`: NumPy arrays become CPU tensors sharing their
    memory."""
    if isinstance(record, np.ndarray):
        return torch.from_numpy(record)
    if isinstance(record, tuple) and hasattr(record, "_fields"):
        return type(record)(*map(as_tensors, record))
    return record


def where_rows[R: tuple](mask: torch.Tensor | np.ndarray, a: R, b: R) -> R:
    """Row-wise select over (nested) records: chain ``c`` from ``a`` where ``mask[c]``.
    A NumPy mask that picks every row from one side returns that record as it is."""
    if isinstance(mask, np.ndarray):
        if mask.all():
            return a
        if not mask.any():
            return b
    return _where_record(_Masks(mask), a, b)


def true_rows(mask: torch.Tensor, count: int) -> torch.Tensor:
    """The indices of the true entries of ``mask`` ``(C,)``, ascending, given their
    ``count`` read on the host: ``nonzero`` would wait for the device to size its output."""
    return torch.argsort((~mask).to(torch.uint8), stable=True)[:count]


def take_rows[R: tuple](record: R, rows: torch.Tensor | np.ndarray) -> R:
    """The chains ``rows`` of every field of a (nested) record: a ``(K,)`` index tensor
    for tensor fields, a ``(K,)`` index array for NumPy fields (records kept on the host)."""
    return type(record)(*(_take(x, rows) for x in record))


def put_rows[R: tuple](record: R, rows: torch.Tensor, values: R) -> R:
    """A copy of a (nested) record with chains ``rows`` replaced by ``values``."""
    return type(record)(*(_put(x, rows, v) for x, v in zip(record, values, strict=True)))


class _Masks(dict):
    """A ``(C,)`` mask reshaped once per number of dimensions it is broadcast to."""

    def __init__(self, mask: torch.Tensor) -> None:
        super().__init__({1: mask})

    def __missing__(self, ndim: int) -> torch.Tensor:
        mask = self[1].reshape((-1,) + (1,) * (ndim - 1))
        self[ndim] = mask
        return mask


def _where_record[R: tuple](masks: _Masks, a: R, b: R) -> R:
    return type(a)(*(_where(masks, x, y) for x, y in zip(a, b, strict=True)))


def _where(masks: _Masks, x, y):
    if x is y:  # a field both records share needs no select
        return x
    if isinstance(x, tuple):
        return _where_record(masks, x, y)
    return array_module(x).where(masks[x.ndim], x, y)


def _take(x, rows):
    if isinstance(x, tuple):
        return take_rows(x, rows)
    return x[rows] if isinstance(x, np.ndarray) else x.index_select(0, rows)


def _put(x, rows, v):
    return put_rows(x, rows, v) if isinstance(x, tuple) else x.index_copy(0, rows, v)
