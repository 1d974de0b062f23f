"""Split R-hat and effective sample size of arrays of draws, for the sampler's own checks
during a run: the pooled warmup's early stop and the end-of-run warnings.

These are the formulas of Vehtari, Gelman, Simpson, Carpenter and Bürkner (2021),
"Rank-normalization, folding, and localization: an improved R-hat for assessing
convergence of MCMC", as ArviZ computes them (``tests/test_diagnostics.py`` compares the
two). The sampler does not call ArviZ for them because importing ``arviz_stats`` (with
SciPy's statistics) takes over a second, as long as a whole short run of many chains; the
DataTree a run returns is for ArviZ's diagnostics, which users call as usual.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["ess", "split_rhat"]

#: fewest draws per chain, and chains, with which ArviZ computes R-hat (else NaN)
MIN_DRAWS, MIN_CHAINS = 4, 2
#: numbers of draws :func:`split_rhat` takes at a time (1 MiB of float64), so that its
#: copies and temporaries add little to a long run's memory however many coordinates
BLOCK = 2**17


def split_rhat(draws: np.ndarray) -> np.ndarray:
    """Split R-hat without rank normalisation of ``draws`` ``(..., C, N)``: ``(...)``.

    Each chain is cut into its first and last ``N // 2`` draws (the middle one of an odd
    ``N`` is left out), and over those ``2C`` half chains of ``n`` draws
    ``R = sqrt((n - 1) / n + B / (n W))``, with ``B`` ``n`` times the variance of the half
    chains' means and ``W`` the mean of their variances. NaN with fewer than
    :data:`MIN_CHAINS` chains or :data:`MIN_DRAWS` draws, or with a NaN among the draws; a
    coordinate that never moves (``W = 0``) gets NaN or infinity."""
    draws = np.asarray(draws, dtype=float)
    *leading, chains, length = draws.shape
    if chains < MIN_CHAINS or length < MIN_DRAWS:
        return np.full(leading, np.nan)
    rows = draws.reshape(-1, chains, length)
    rhat = np.empty(rows.shape[0])
    step = max(1, BLOCK // (chains * length))  # the temporaries stay within a block
    for start in range(0, rows.shape[0], step):
        halves = _split_chains(rows[start : start + step])
        n = halves.shape[-1]
        with np.errstate(invalid="ignore", divide="ignore"):  # infinite draws, W = 0
            within = halves.var(-1, ddof=1).mean(-1)
            between = n * halves.mean(-1).var(-1, ddof=1)
            rhat[start : start + step] = np.sqrt((between / within + n - 1) / n)
    return rhat.reshape(leading)


def ess(draws: np.ndarray, method: str = "bulk") -> float:
    """Effective sample size of ``draws`` ``(C, N)``: of the mean (``method="mean"``) or
    of the bulk (``"bulk"``: the draws replaced by the normal quantiles of their ranks
    first), over the split chains, with Geyer's initial monotone sequence. NaN with fewer
    than :data:`MIN_DRAWS` draws or with a NaN among the draws; ``C N`` for draws that
    never change."""
    if method not in ("bulk", "mean"):
        raise ValueError(f"method must be 'bulk' or 'mean', got {method!r}")
    draws = np.asarray(draws, dtype=float)
    if draws.shape[1] < MIN_DRAWS or np.isnan(draws).any():
        return float("nan")
    halves = _split_chains(draws)
    with np.errstate(invalid="ignore"):  # infinite draws
        return _ess(_normal_scores(halves) if method == "bulk" else halves)


def _split_chains(draws: np.ndarray) -> np.ndarray:
    """``(..., C, N) -> (..., 2C, N // 2)``: each chain's first and last halves."""
    half = draws.shape[-1] // 2
    return np.concatenate([draws[..., :half], draws[..., -half:]], axis=-2)


def _normal_scores(draws: np.ndarray) -> np.ndarray:
    """The standard normal quantiles of the draws' ranks among all ``S`` of them (ties
    share their mean rank): ``Phi^-1((r - 3/8) / (S + 1/4))`` (Blom's offsets)."""
    flat = draws.ravel()
    order = np.argsort(flat, kind="stable")
    ordered = flat[order]
    starts = np.r_[True, ordered[1:] != ordered[:-1]]  # where each group of ties starts
    first = np.flatnonzero(starts)
    last = np.r_[first[1:], flat.size] - 1
    group = np.cumsum(starts) - 1
    ranks = np.empty(flat.size)
    ranks[order] = (first + last)[group] / 2 + 1
    scores = torch.special.ndtri(torch.from_numpy((ranks - 0.375) / (flat.size + 0.25)))
    return scores.numpy().reshape(draws.shape)


def _ess(chains: np.ndarray) -> float:
    """Effective sample size of ``chains`` ``(M, n)`` as they are (no splitting): ``M n``
    over the integrated autocorrelation time, whose autocorrelations combine the chains'
    autocovariances with the between-chain variance, summed in pairs of lags while the
    pairs stay positive and made monotone (Geyer's initial monotone sequence)."""
    count, n = chains.shape
    if np.ptp(chains) < np.finfo(float).resolution:
        return float(count * n)
    centred = chains - chains.mean(1, keepdims=True)
    spectrum = np.fft.rfft(centred, n=2 * n, axis=1)
    autocovariance = np.fft.irfft(spectrum * spectrum.conj(), n=2 * n, axis=1)[:, :n] / n
    within = autocovariance[:, 0].mean() * n / (n - 1)
    pooled = within * (n - 1) / n + (chains.mean(1).var(ddof=1) if count > 1 else 0.0)
    rho = 1 - (within - autocovariance.mean(0)) / pooled  # (n,) lag 0, 1, ...
    if np.isnan(rho).any():  # an infinite draw
        return float("nan")
    kept = np.zeros(n)
    kept[:2] = 1.0, rho[1]
    even, odd, t = 1.0, rho[1], 1
    while t < n - 3 and even + odd > 0:  # the pairs of lags (t + 1, t + 2) that stay positive
        even, odd = rho[t + 1], rho[t + 2]
        if even + odd >= 0:
            kept[t + 1 : t + 3] = even, odd
        t += 2
    last = t - 2  # the odd lag that closes the last positive pair
    if even > 0:
        kept[last + 1] = even
    for t in range(1, last - 1, 2):  # monotone: no pair above the one before it
        if kept[t + 1] + kept[t + 2] > kept[t - 1] + kept[t]:
            kept[t + 1] = kept[t + 2] = (kept[t - 1] + kept[t]) / 2
    time = -1 + 2 * kept[: last + 1].sum() + kept[last + 1 : last + 2].sum()
    total = count * n
    return total / max(time, 1 / np.log10(total))
