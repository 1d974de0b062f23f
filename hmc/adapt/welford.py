"""Welford's streaming mean and (co)variance, per chain, with Stan's regularisation.

``welford_update`` also takes NumPy arrays (the driver's host loop keeps its adaptation
state in NumPy)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from hmc.state import where_rows

__all__ = ["WelfordState", "welford_covariance", "welford_init", "welford_update"]


class WelfordState(NamedTuple):
    """count ``(C,)``, mean ``(C, D)``, m2 ``(C, D)`` (diagonal) or ``(C, D, D)`` (dense)."""

    count: torch.Tensor
    mean: torch.Tensor
    m2: torch.Tensor


def welford_init(like: torch.Tensor, dense: bool) -> WelfordState:
    """An empty estimator for positions shaped like ``like`` ``(C, D)``."""
    chains, dim = like.shape
    m2_shape = (chains, dim, dim) if dense else (chains, dim)
    return WelfordState(
        torch.zeros(chains, dtype=like.dtype, device=like.device),
        torch.zeros_like(like),
        torch.zeros(m2_shape, dtype=like.dtype, device=like.device),
    )


def welford_update(state: WelfordState, x: torch.Tensor, mask: torch.Tensor) -> WelfordState:
    """Add ``x`` ``(C, D)`` to the chains where ``mask`` ``(C,)`` is True."""
    count = state.count + 1
    delta = x - state.mean
    mean = state.mean + delta / count[:, None]
    after = x - mean
    if state.m2.ndim == 3:
        m2 = state.m2 + delta[:, :, None] * after[:, None, :]
    else:
        m2 = state.m2 + delta * after
    return where_rows(mask, WelfordState(count, mean, m2), state)


def welford_covariance(state: WelfordState) -> torch.Tensor:
    """Regularised sample (co)variance, as Stan's ``var_adaptation``/``covar_adaptation``:
    ``n / (n + 5) * S + 1e-3 * 5 / (n + 5)`` (times the identity when dense)."""
    n = state.count
    shape = (-1,) + (1,) * (state.m2.dim() - 1)
    variance = state.m2 / (n - 1).clamp(min=1).view(shape)
    shrink = (n / (n + 5)).view(shape)
    jitter = (1e-3 * 5 / (n + 5)).view(shape)
    if state.m2.dim() == 3:
        eye = torch.eye(state.m2.shape[-1], dtype=state.m2.dtype, device=state.m2.device)
        symmetric = 0.5 * (variance + variance.mT)
        return shrink * symmetric + jitter * eye
    return shrink * variance + jitter
