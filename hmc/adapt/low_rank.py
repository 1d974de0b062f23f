"""The low-rank plus diagonal metric from a window's draws and gradients (Fisher divergence).

Seyboldt, Carlson and Carpenter (arXiv 2603.18845), as nutpie (nuts-rs) builds it:

1. the diagonal: per coordinate the inverse metric ``sqrt(Var x / Var grad)``, so the
   whitening scale is ``s = (Var x / Var grad) ** (1/4)`` (exact for a Gaussian with
   independent coordinates, whose gradient variance is the inverse of its variance);
2. whiten: draws ``(x - mean) / s``, gradients ``(g - mean) * s``;
3. the subspace their ``n`` draws and ``n`` gradients span (an orthonormal basis ``Q``,
   ``D x m``, ``m <= min(D, 2 n)``, from one QR factorisation); outside it the whitened
   metric is the identity;
4. in it, ``A = Y^T Y / gamma + I`` and ``B = H^T H / gamma + I`` from the projected draws
   ``Y`` and gradients ``H`` (sums over the draws; ``gamma`` a small ridge), and the SPD
   geometric mean ``Sigma = B^-1/2 (B^1/2 A B^1/2)^1/2 B^-1/2``, the solution of
   ``Sigma B Sigma = A``: the covariance that minimises the Fisher divergence of a
   Gaussian (for a Gaussian target with covariance ``S``, ``A ~ S`` and ``B ~ S^-1``, so
   ``Sigma = S``);
5. its eigenvalues outside ``[1 / cutoff, cutoff]``, at most ``max_rank`` of them (the
   farthest from 1 in ``|log value|``), with their eigenvectors mapped back by ``Q``,
   make the low-rank part (:class:`hmc.metric.LowRankMetric`).

Everything is computed in float64 whatever the run's dtype (in float32 the construction
gives indefinite metrics, BlackJAX issue 956), the diagonal's variance ratios are floored
at :data:`SCALE_FLOOR` times the chain's largest and the eigenvalues kept inside
``[VALUE_FLOOR, 1 / VALUE_FLOOR]``, so the metric is positive definite by construction and
stays so when cast to float32 (``F``'s smallest singular value, ``sqrt(VALUE_FLOOR)``, is
far above float32's rounding of ``U``).

:class:`WindowDraws` keeps each chain's draws and gradients of the current window (memory
``O(window x D)`` per chain): Stan's warmup fits one metric per chain from its own window,
the pooled warmup one from every chain's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from hmc.arrays import namespace
from hmc.metric import LowRankMetric

__all__ = [
    "SCALE_FLOOR",
    "VALUE_FLOOR",
    "LowRank",
    "WindowDraws",
    "low_rank_from_dense",
    "low_rank_metric",
    "window_add",
    "window_init",
    "window_length",
]

#: the diagonal's variance ratios are at least this times the chain's largest
SCALE_FLOOR = 1e-12
#: the whitened eigenvalues stay inside ``[VALUE_FLOOR, 1 / VALUE_FLOOR]``
VALUE_FLOOR = 1e-10


@dataclass(frozen=True)
class LowRank:
    """``metric=hmc.LowRank(...)``: the low-rank plus diagonal metric's options (nutpie's
    ``low_rank_modified_mass_matrix``; ``metric="low-rank"`` takes the defaults).

    Parameters
    ----------
    max_rank : at most this many eigenvectors (``k``; applying the metric costs
        ``O(D k)`` per leapfrog step, its storage ``D k`` per chain).
    cutoff : eigenvalues of the whitened metric inside ``[1 / cutoff, cutoff]`` are left
        at 1 (nutpie's ``mass_matrix_eigval_cutoff``, default 2).
    gamma : the ridge added to the summed outer products (nutpie's
        ``mass_matrix_gamma``, default 1e-5).
    """

    max_rank: int = 16
    cutoff: float = 2.0
    gamma: float = 1e-5

    def __post_init__(self) -> None:
        rank = self.max_rank
        if not isinstance(rank, int | np.integer) or isinstance(rank, bool) or rank < 1:
            raise ValueError(f"LowRank max_rank must be an integer >= 1, got {rank!r}")
        for name, low in (("cutoff", 1.0), ("gamma", 0.0)):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ValueError(f"LowRank {name} must be a number > {low:g}, got {value!r}")
            if not low < value < float("inf"):
                raise ValueError(f"LowRank {name} must be a finite number > {low:g}, got {value!r}")

    def rank(self, dim: int) -> int:
        """The number of eigenvector slots for dimension ``dim``."""
        return min(self.max_rank, dim)


def low_rank_metric(
    draws: torch.Tensor,
    gradients: torch.Tensor,
    kept: torch.Tensor,
    options: LowRank,
) -> LowRankMetric:
    """The metric of each of ``B`` windows (the module docstring), in float64.

    Parameters
    ----------
    draws, gradients : torch.Tensor
        ``(B, n, D)`` positions and gradients of the log density (or of the potential:
        the sign does not matter), any float dtype.
    kept : torch.Tensor
        ``(B, n)`` bool, the rows that belong to the window (others are ignored).
    options : LowRank
        The rank, cutoff and ridge.

    Returns
    -------
    LowRankMetric
        Float64 fields ``(B, D)``, ``(B, D, k)``, ``(B, k)`` with ``k = options.rank(D)``.
    """
    x, g = draws.to(torch.float64), gradients.to(torch.float64)
    weight = kept.to(torch.float64)[:, :, None]  # (B, n, 1)
    count = weight.sum(1).clamp(min=1.0)  # (B, 1)
    x_centred = (x - (weight * x).sum(1, keepdim=True) / count[:, None]) * weight
    g_centred = (g - (weight * g).sum(1, keepdim=True) / count[:, None]) * weight
    x_var = (x_centred**2).sum(1) / count  # (B, D)
    g_var = (g_centred**2).sum(1) / count
    usable = (g_var > 0) & torch.isfinite(g_var)
    ratio = torch.where(usable, x_var / torch.where(usable, g_var, 1.0), x_var)
    ratio = torch.nan_to_num(ratio, nan=0.0, posinf=0.0)
    largest = ratio.max(1, keepdim=True).values
    ratio = torch.where(largest > 0, ratio.clamp(min=SCALE_FLOOR * largest), 1.0)
    scale = ratio.sqrt().sqrt()  # (B, D)
    whitened_x = x_centred / scale[:, None, :]
    whitened_g = g_centred * scale[:, None, :]
    # an orthonormal basis of the span of the draws and gradients (D, m)
    basis = torch.linalg.qr(torch.cat((whitened_x, whitened_g), 1).mT, mode="reduced").Q
    projected_x, projected_g = whitened_x @ basis, whitened_g @ basis  # (B, n, m)
    eye = torch.eye(basis.shape[-1], dtype=torch.float64, device=basis.device)
    a = projected_x.mT @ projected_x / options.gamma + eye
    b = projected_g.mT @ projected_g / options.gamma + eye
    values, vectors = torch.linalg.eigh(spd_geometric_mean(a, b))
    low_rank = _kept_directions(values, basis @ vectors, options.rank(x.shape[-1]), options)
    return LowRankMetric(scale, *low_rank)


def low_rank_from_dense(inverse: torch.Tensor, options: LowRank) -> LowRankMetric:
    """The low-rank metric nearest a dense inverse metric ``(C, D, D)``: its diagonal's
    square roots as the scale, and the eigenpairs of the whitened matrix kept as
    :func:`low_rank_metric` keeps them (float64 fields)."""
    inverse = inverse.to(torch.float64)
    variance = inverse.diagonal(dim1=-2, dim2=-1)
    scale = variance.clamp(min=SCALE_FLOOR * variance.max(-1, keepdim=True).values).sqrt()
    whitened = inverse / (scale[:, :, None] * scale[:, None, :])
    values, vectors = torch.linalg.eigh(0.5 * (whitened + whitened.mT))
    return LowRankMetric(
        scale, *_kept_directions(values, vectors, options.rank(scale.shape[-1]), options)
    )


def _kept_directions(
    values: torch.Tensor, vectors: torch.Tensor, rank: int, options: LowRank
) -> tuple[torch.Tensor, torch.Tensor]:
    """Of the eigenvalues ``(B, m)`` and eigenvectors ``(B, D, m)`` of whitened inverse
    metrics, the ``rank`` slots ``(B, D, rank)``, ``(B, rank)``: the eigenpairs with
    values outside ``[1 / cutoff, cutoff]``, farthest from 1 first, the values floored,
    unused slots a zero vector with value 1."""
    values = values.clamp(VALUE_FLOOR, 1.0 / VALUE_FLOOR)
    distance = values.log().abs()
    distance = torch.where(distance > np.log(options.cutoff), distance, -1.0)
    if distance.shape[-1] < rank:  # fewer directions than slots: pad with unused ones
        pad = rank - distance.shape[-1]
        distance = torch.nn.functional.pad(distance, (0, pad), value=-1.0)
        values = torch.nn.functional.pad(values, (0, pad), value=1.0)
        vectors = torch.nn.functional.pad(vectors, (0, pad))
    chosen, order = distance.topk(rank, dim=-1)  # (B, rank)
    used = chosen > 0
    values = torch.where(used, values.gather(-1, order), 1.0)
    picked = vectors.gather(-1, order[:, None, :].expand(-1, vectors.shape[-2], -1))
    return torch.where(used[:, None, :], picked, 0.0), values


def spd_geometric_mean(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``B^-1/2 (B^1/2 A B^1/2)^1/2 B^-1/2`` of symmetric positive definite ``(..., m, m)``
    matrices: the ``S`` with ``S B S = A``."""
    b_values, b_vectors = torch.linalg.eigh(b)
    root = (b_vectors * b_values.sqrt()[..., None, :]) @ b_vectors.mT
    inverse_root = (b_vectors * b_values.rsqrt()[..., None, :]) @ b_vectors.mT
    inner = root @ a @ root
    inner = 0.5 * (inner + inner.mT)
    m_values, m_vectors = torch.linalg.eigh(inner)
    inner_root = (m_vectors * m_values.clamp(min=0.0).sqrt()[..., None, :]) @ m_vectors.mT
    mean = inverse_root @ inner_root @ inverse_root
    return 0.5 * (mean + mean.mT)


class WindowDraws(NamedTuple):
    """The current window's draws of every chain: ``position`` and ``gradient``
    ``(C, W, D)`` (``W`` the longest window), and ``kept`` ``(C, W)`` bool, the slots
    filled in this window."""

    position: torch.Tensor
    gradient: torch.Tensor
    kept: torch.Tensor


def window_init(like: torch.Tensor, length: int) -> WindowDraws:
    """Empty windows of ``length`` slots for chains shaped like ``like`` ``(C, D)``
    (a tensor or an array: the buffers are of the same kind)."""
    xp = namespace(like)
    chains, dim = like.shape
    buffer = xp.zeros((chains, length, dim), dtype=like.dtype)
    if xp is torch:
        buffer = buffer.to(like.device)
    kept = xp.zeros((chains, length), dtype=bool if xp is np else torch.bool)
    return WindowDraws(buffer, buffer * 0, kept if xp is np else kept.to(like.device))


def window_add(
    window: WindowDraws,
    position: torch.Tensor,
    gradient: torch.Tensor,
    mask: torch.Tensor,
    slots: torch.Tensor,
) -> WindowDraws:
    """Write the rows of ``position`` and ``gradient`` ``(C, D)`` where ``mask`` ``(C,)``
    into each chain's slot ``slots`` ``(C,)`` (int, below ``W``), in place (a copy of the
    buffers per transition would cost ``O(W D)``; no read of the mask on the host);
    returns ``window``."""
    xp = namespace(position)
    rows = xp.arange(position.shape[0])
    if xp is torch:
        rows = rows.to(position.device)
    column = mask[:, None]
    for buffer, new in ((window.position, position), (window.gradient, gradient)):
        buffer[rows, slots] = xp.where(column, new, buffer[rows, slots])
    window.kept[rows, slots] = window.kept[rows, slots] | mask
    return window


def window_length(windows: list[tuple[int, int]]) -> int:
    """The slots a window buffer needs for the schedule's ``windows`` (its longest)."""
    return max((last - first + 1 for first, last in windows), default=0)
