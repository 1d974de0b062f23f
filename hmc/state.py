"""Small records that carry the sampler's state, and row-wise helpers over them.

Shapes: ``C`` chains, ``D`` unconstrained dimensions. Every tensor in a record has the
chain axis first, so the helpers below select, merge and gather chains uniformly for any
record (a ``NamedTuple`` of tensors).
"""

from __future__ import annotations

from typing import NamedTuple, TypeVar

import torch

__all__ = ["State", "take_rows", "put_rows", "where_rows"]


class State(NamedTuple):
    """A point in parameter space with its energy and gradient.

    position : ``(C, D)``; potential : ``(C,)`` U = -log p; grad : ``(C, D)`` dU/dq.
    The gradient travels with the state, so no transition recomputes it at its start.
    """

    position: torch.Tensor
    potential: torch.Tensor
    grad: torch.Tensor


R = TypeVar("R", bound=tuple)


def _broadcast(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.view(mask.shape + (1,) * (like.dim() - mask.dim()))


def where_rows(mask: torch.Tensor, a: R, b: R) -> R:
    """Row-wise select: chain ``c`` from ``a`` where ``mask[c]`` else from ``b``."""
    return type(a)(*(torch.where(_broadcast(mask, x), x, y) for x, y in zip(a, b, strict=True)))


def take_rows(record: R, rows: torch.Tensor) -> R:
    """The chains ``rows`` (a ``(K,)`` index tensor) of every field."""
    return type(record)(*(x.index_select(0, rows) for x in record))


def put_rows(record: R, rows: torch.Tensor, values: R) -> R:
    """A copy of ``record`` with chains ``rows`` replaced by ``values`` (``K`` rows each)."""
    return type(record)(*(x.index_copy(0, rows, v) for x, v in zip(record, values, strict=True)))
