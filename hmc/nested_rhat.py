"""Nested R-hat: a convergence diagnostic for many short chains grouped into superchains.

The chains are split into ``K`` superchains of ``M`` chains each (the chains of a
superchain typically start from one shared initial point), with ``N`` draws per chain. For
a scalar quantity ``f[n, m, k]`` with chain means ``fbar[m, k]``, superchain means
``fbar[k] = mean_m fbar[m, k]`` and overall mean ``fbar = mean_k fbar[k]``:

- between-superchain variance ``B = 1/(K-1) sum_k (fbar[k] - fbar)^2``;
- between-chain variance within superchain ``k``,
  ``Btilde[k] = 1/(M-1) sum_m (fbar[m, k] - fbar[k])^2`` (0 when ``M = 1``);
- within-chain variance in superchain ``k``,
  ``Wtilde[k] = 1/M sum_m 1/(N-1) sum_n (f[n, m, k] - fbar[m, k])^2`` (0 when ``N = 1``);
- within-superchain variance ``W = 1/K sum_k (Btilde[k] + Wtilde[k])``;
- nested R-hat ``= sqrt(1 + B / W)``.

With ``M = 1`` this is ``sqrt(1 + B / W)`` over single chains, which exceeds the classical
Gelman-Rubin ``sqrt((N-1)/N + B / W)``: nested R-hat is never below 1. With ``N = 1`` only
the chains' spread inside each superchain measures ``W``. For independent draws ``B / W``
is about ``1 / (M (N + 1))`` (``1 / M`` when ``N = 1``), so values near 1 need many chains
per superchain when chains are short.

Reference: C. C. Margossian, M. D. Hoffman, P. Sountsov, L. Riou-Durand, A. Vehtari and
A. Gelman (2024), "Nested R-hat: assessing the convergence of Markov chain Monte Carlo when
running many short chains", *Bayesian Analysis*.
"""

from __future__ import annotations

import operator

import numpy as np
import xarray as xr

__all__ = ["nested_rhat", "nested_rhat_array"]


def nested_rhat_array(draws: np.ndarray, superchains: int) -> np.ndarray:
    """Nested R-hat of ``draws`` shaped ``(chains, draws, *event)``, returned shaped ``event``.

    ``superchains`` (``K >= 2``) must divide ``chains``; consecutive chains form a
    superchain (chains ``0 .. M-1`` are superchain 0, and so on, ``M = chains / K``).
    Constant draws give ``nan`` (or ``inf`` where only the superchain means differ).
    """
    draws = np.asarray(draws, dtype=float)
    superchains = operator.index(superchains)
    if draws.ndim < 2:
        raise ValueError(
            f"draws must be shaped (chains, draws, *event), got {draws.ndim} dimension(s)"
        )
    chains, length = draws.shape[:2]
    if length < 1:
        raise ValueError("draws must hold at least one draw per chain")
    if superchains < 2:
        raise ValueError(f"superchains must be at least 2, got {superchains}")
    if chains < superchains or chains % superchains:
        raise ValueError(f"superchains={superchains} must divide the {chains} chains of draws")
    per_superchain = chains // superchains
    if per_superchain == 1 and length == 1:
        raise ValueError(
            f"superchains={superchains} leaves one chain per superchain and draws has one "
            "draw per chain: the within-superchain variance is not defined"
        )

    event = draws.shape[2:]
    grouped = draws.reshape(superchains, per_superchain, length, *event)  # (K, M, N, *event)
    chain_means = grouped.mean(axis=2)  # (K, M, *event)
    superchain_means = chain_means.mean(axis=1)  # (K, *event)
    between = superchain_means.var(axis=0, ddof=1)  # (*event)
    within = np.zeros((superchains, *event))  # Btilde + Wtilde, (K, *event)
    if per_superchain > 1:
        within += chain_means.var(axis=1, ddof=1)
    if length > 1:
        within += grouped.var(axis=2, ddof=1).mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(1.0 + between / within.mean(axis=0))


def nested_rhat(tree: xr.DataTree, superchains: int, group: str = "posterior") -> xr.Dataset:
    """Nested R-hat of every variable in ``tree[group]``, grouping chains as in
    :func:`nested_rhat_array`.

    Each variable must have ``chain`` and ``draw`` dimensions; the result keeps its other
    dimensions and their coordinates (a ``(chain, draw, school)`` variable gives a
    ``(school,)`` one).
    """
    dataset = tree[group].to_dataset()
    for name, variable in dataset.data_vars.items():
        missing = {"chain", "draw"} - set(variable.dims)
        if missing:
            raise ValueError(f"variable {name!r} of group {group!r} lacks dims {sorted(missing)}")

    def over_chains(values: np.ndarray) -> np.ndarray:  # (..., chain, draw) -> (...)
        return nested_rhat_array(np.moveaxis(values, (-2, -1), (0, 1)), superchains)

    return xr.apply_ufunc(over_chains, dataset, input_core_dims=[["chain", "draw"]])
