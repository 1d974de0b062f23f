"""What the driver samples: a log density on a flat unconstrained vector, plus how to
present its draws.

A plain callable ``log_prob(q)`` on ``(D,)`` (or ``(C, D)`` with ``batched=True``) is a
:class:`FlatTarget`: its draws come back as one posterior variable ``x`` of shape ``(D,)``.
:class:`hmc.Model` provides the same interface for named, constrained parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

__all__ = ["FlatTarget", "Target"]


@runtime_checkable
class Target(Protocol):
    """The interface :func:`hmc.sample` needs from what it samples."""

    dim: int | None
    batched: bool

    def log_prob(self, q: torch.Tensor) -> torch.Tensor:
        """Log density on the unconstrained space (Jacobian included)."""
        ...

    def initial_positions(
        self, init: Any, chains: int, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor | None:
        """``(C, D)`` unconstrained starts from the user's ``init``, or None without one."""
        ...

    def posterior(self, draws: np.ndarray) -> dict[str, np.ndarray]:
        """Named arrays ``(C, N, *shape)`` from unconstrained draws ``(C, N, D)``."""
        ...

    def dims_and_coords(self) -> tuple[dict[str, list[str]], dict[str, Any]]:
        """ArviZ ``dims`` and ``coords`` of the posterior variables."""
        ...

    def extra_groups(self, draws: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
        """Further ArviZ groups (``observed_data``, ``log_likelihood``, ...)."""
        ...

    def coordinate_names(self) -> list[str] | None:
        """A name for each of the ``D`` unconstrained coordinates (for messages), or None
        to call them by their index."""
        ...


class FlatTarget:
    """A user's log density over a flat vector, reported as the variable ``x``."""

    def __init__(
        self, log_prob: Callable[[torch.Tensor], torch.Tensor], dim: int | None, batched: bool
    ) -> None:
        self.log_prob = log_prob  # the user's function itself: no wrapper call per evaluation
        self.dim = dim
        self.batched = batched

    def initial_positions(
        self, init: Any, chains: int, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor | None:
        if init is None:
            return None
        try:
            q = torch.as_tensor(init, dtype=dtype, device=device)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(
                f"init must be a tensor of shape (D,) or (chains, D), got {type(init).__name__}"
            ) from error
        if q.dim() == 1:
            q = q.expand(chains, -1)
        if q.dim() != 2 or q.shape[0] != chains:
            raise ValueError(
                f"init must have shape (D,) or (chains={chains}, D), got {tuple(q.shape)}"
            )
        if self.dim is not None and q.shape[1] != self.dim:
            raise ValueError(f"init has dimension {q.shape[1]} but dim={self.dim}")
        if q.shape[1] == 0:
            raise ValueError("init must have at least one dimension")
        if not torch.isfinite(q).all():
            bad = (~torch.isfinite(q)).any(-1).nonzero().flatten().tolist()
            raise ValueError(f"init has non-finite values for chains {bad}")
        self.dim = q.shape[1]
        return q.clone()

    def posterior(self, draws: np.ndarray) -> dict[str, np.ndarray]:
        return {"x": draws}

    def dims_and_coords(self) -> tuple[dict[str, list[str]], dict[str, Any]]:
        return {}, {}

    def extra_groups(self, draws: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
        return {}

    def coordinate_names(self) -> None:
        return None  # a flat vector's coordinates are its indices
