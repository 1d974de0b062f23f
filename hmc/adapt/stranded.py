"""Stranded chains: chains whose log density stays far below the others', and their
restart from healthy chains.

A chain that starts where its step size cannot move it (a wall, a region where the
errors grow like ``theta^200``) stays there for the whole warmup; the others' log
densities over the same iterations tell it apart. Both warmups use the one criterion
(:func:`stranded_from_moments`): the pooled one (:mod:`hmc.adapt.ensemble`) on every
iteration's and window's log densities, Stan's per-chain one (:mod:`hmc.adapt.warmup`)
at the end of each slow window, on the window's running moments.
"""

from __future__ import annotations

import torch

from hmc.state import State

__all__ = [
    "STRANDED_NATS",
    "STRANDED_SPREADS",
    "restart_sources",
    "restart_stranded",
    "stranded_chains",
    "stranded_from_moments",
]

#: a chain is stranded when its mean log density over a stretch of iterations is below the
#: chains' median by more than this many times the typical within-chain standard deviation
STRANDED_SPREADS = 10.0
#: ... and by more than this many nats
STRANDED_NATS = 10.0


def stranded_from_moments(mean: torch.Tensor, spread: torch.Tensor) -> torch.Tensor:
    """``(C,)`` the chains whose mean log density ``mean`` ``(C,)`` over some iterations
    is below the median of the chains' means by more than :data:`STRANDED_NATS` nats and
    more than :data:`STRANDED_SPREADS` times the typical spread: the larger of the median
    within-chain standard deviation ``spread`` ``(C,)`` (NaN where unknown) and the
    means' robust standard deviation (1.4826 times their median absolute deviation). A
    mean that is not finite (NaN, -inf) is stranded."""
    mean = torch.nan_to_num(mean, nan=-torch.inf, posinf=-torch.inf)
    usable = torch.isfinite(mean)
    if not usable.any():
        return torch.zeros_like(usable)
    median = mean[usable].median()
    within = torch.nan_to_num(spread[usable]).median()
    across = 1.4826 * (mean[usable] - median).abs().median()
    gap = torch.clamp(STRANDED_SPREADS * torch.maximum(within, across), min=STRANDED_NATS)
    return ~(mean >= median - gap)


def stranded_chains(log_density: torch.Tensor) -> torch.Tensor:
    """``(C,)`` the chains whose log densities over the last iterations ``(C, N)`` stay far
    below the others' (:func:`stranded_from_moments` of their means and standard
    deviations; with ``N = 1``, the spread is the log density's across chains at one
    iteration)."""
    finite = torch.where(torch.isfinite(log_density), log_density, -torch.inf)
    mean = finite.mean(1)
    spread = finite.std(1) if finite.shape[1] > 1 else torch.zeros_like(mean)
    return stranded_from_moments(mean, spread)


def restart_sources(stranded: torch.Tensor) -> torch.Tensor | None:
    """``(C,)`` the chain each chain goes on from: itself, or for each ``stranded`` chain
    ``(C,)`` a healthy one (the healthy chains in turn); None when no chain is stranded
    or none is healthy."""
    healthy = (~stranded).nonzero().flatten()
    if healthy.numel() == 0 or healthy.numel() == stranded.shape[0]:
        return None
    rows = torch.arange(stranded.shape[0], device=stranded.device)
    return torch.where(stranded, healthy[rows % healthy.numel()], rows)


def restart_stranded(state: State, stranded: torch.Tensor) -> State:
    """``state`` with each ``stranded`` chain ``(C,)`` replaced by a healthy chain's state
    (:func:`restart_sources`); ``state`` itself when none is stranded or none healthy."""
    sources = restart_sources(stranded)
    if sources is None:
        return state
    return State(*(x.index_select(0, sources) for x in state))
