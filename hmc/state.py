"""Small records that carry the sampler's state, and row-wise helpers over them.

Shapes: ``C`` chains, ``D`` unconstrained dimensions. Every array in a record has the
chain axis first, so the helpers below select, merge and gather chains uniformly for any
record (a ``NamedTuple`` of arrays): torch tensors or NumPy arrays, whichever engine the
run computes in (:mod:`hmc.arrays`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from hmc.arrays import namespace

__all__ = [
    "Params",
    "State",
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


class Params(NamedTuple):
    """Per-chain kernel parameters: ``step_size`` ``(C,)``, the metric
    (:mod:`hmc.metric`) and, for :class:`hmc.ChEES`, the learnt ``trajectory_length``
    ``(C,)`` (None for other kernels)."""

    step_size: torch.Tensor
    metric: NamedTuple
    trajectory_length: torch.Tensor | None = None


class Proposal(NamedTuple):
    """The trajectory of a static transition, for adaptation across chains (ChEES): the
    start positions ``(C, D)``, the proposed positions ``(C, D)``, the velocities
    ``M^-1 p`` there ``(C, D)``, before the Metropolis test, and the integration times
    (steps times step size) ``(C,)``."""

    start: torch.Tensor
    end: torch.Tensor
    velocity: torch.Tensor
    time: torch.Tensor


def where_rows[R: tuple](mask: torch.Tensor | np.ndarray, a: R, b: R) -> R:
    """Row-wise select over (nested) records: chain ``c`` from ``a`` where ``mask[c]``.
    A NumPy mask that picks every row from one side returns that record as it is."""
    if isinstance(mask, np.ndarray):
        if mask.all():
            return a
        if not mask.any():
            return b
    return _where_record(_Masks(mask), a, b)


def true_rows[A: (torch.Tensor, np.ndarray)](mask: A, count: int) -> A:
    """The indices of the true entries of ``mask`` ``(C,)``, ascending, given their
    ``count`` read on the host: a tensor's ``nonzero`` would wait for the device to size
    its output."""
    if isinstance(mask, np.ndarray):
        return np.flatnonzero(mask)
    return torch.argsort((~mask).to(torch.uint8), stable=True)[:count]


def take_rows[R: tuple](record: R, rows: torch.Tensor | np.ndarray) -> R:
    """The chains ``rows`` of every field of a (nested) record: a ``(K,)`` index tensor
    for tensor fields, a ``(K,)`` index array for NumPy fields (records kept on the host)."""
    return _rebuild(record, (_take(x, rows) for x in record))


def put_rows[R: tuple](record: R, rows: torch.Tensor | np.ndarray, values: R) -> R:
    """A copy of a (nested) record with chains ``rows`` replaced by ``values``."""
    return _rebuild(record, (_put(x, rows, v) for x, v in zip(record, values, strict=True)))


def _rebuild[R: tuple](record: R, fields) -> R:
    """A record of the type of ``record`` (a NamedTuple or a plain tuple) from ``fields``."""
    return type(record)(*fields) if hasattr(record, "_fields") else tuple(fields)


class _Masks(dict):
    """A ``(C,)`` mask reshaped once per number of dimensions it is broadcast to."""

    def __init__(self, mask: torch.Tensor) -> None:
        super().__init__({1: mask})

    def __missing__(self, ndim: int) -> torch.Tensor:
        mask = self[1].reshape((-1,) + (1,) * (ndim - 1))
        self[ndim] = mask
        return mask


def _where_record[R: tuple](masks: _Masks, a: R, b: R) -> R:
    return _rebuild(a, (_where(masks, x, y) for x, y in zip(a, b, strict=True)))


def _where(masks: _Masks, x, y):
    if x is y:  # a field both records share needs no select
        return x
    if isinstance(x, tuple):
        return _where_record(masks, x, y)
    return namespace(x).where(masks[x.ndim], x, y)


def _take(x, rows):
    if isinstance(x, tuple):
        return take_rows(x, rows)
    return x[rows] if isinstance(x, np.ndarray) else x.index_select(0, rows)


def _put(x, rows, v):
    if isinstance(x, tuple):
        return put_rows(x, rows, v)
    if isinstance(x, np.ndarray):
        x = x.copy()
        x[rows] = v
        return x
    return x.index_copy(0, rows, v)
