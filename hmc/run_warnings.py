"""Warnings at the end of a run: what to know before trusting its draws.

Stan and PyMC report these after sampling; so does :func:`hmc.sample`, once each, as
``RuntimeWarning``:

- divergent transitions among the kept draws (the integrator met curvature its step size
  cannot follow; the draws may be biased);
- NUTS transitions that stopped at the maximum tree depth (slow mixing, and a long run);
- an adapted inverse metric whose scales span more than :data:`METRIC_SPAN` (a direction
  the posterior barely constrains, or one it pins down, either of which starves the rest);
- chains the pooled warmup restarted from another chain (stranded far below the others'
  log density: a bad start, or a mode the other chains never visit).
"""

from __future__ import annotations

import warnings

import numpy as np

__all__ = ["METRIC_SPAN", "warn_about_run"]

#: an adapted inverse metric whose largest and smallest variances differ by more than
#: this factor gets a warning
METRIC_SPAN = 1e8


def warn_about_run(
    sample_stats: dict[str, np.ndarray],
    inverse_metric: np.ndarray,
    restarted_chains: np.ndarray | None = None,
) -> None:
    """Warn about the kept draws' ``sample_stats`` (``(C, W)`` arrays under their ArviZ
    names), the adapted ``inverse_metric`` (``(C, D)`` or ``(C, D, D)``) and the chains
    the warmup restarted ``(R,)``."""
    if restarted_chains is not None and len(restarted_chains):
        warnings.warn(
            f"chains {restarted_chains.tolist()} stayed far below the others' log density "
            "over a warmup window and were restarted from other chains' states (a bad start, or "
            "a mode the other chains never visit: on a posterior with modes of very "
            "different heights, compare with adapt='stan')",
            RuntimeWarning,
            stacklevel=3,
        )
    diverging = sample_stats.get("diverging")
    if diverging is not None and diverging.any():
        count = int(diverging.sum())
        warnings.warn(
            f"{count} of {diverging.size} kept transitions ({count / diverging.size:.1%}) "
            "were divergent: the draws may be biased. Raise target_accept (0.9, 0.95) or "
            "reparameterise the model (for example a non-centred hierarchy).",
            RuntimeWarning,
            stacklevel=3,
        )
    at_max = sample_stats.get("reached_max_treedepth")
    if at_max is not None and at_max.any():
        count = int(at_max.sum())
        max_tree_depth = int(sample_stats["tree_depth"][at_max].max())
        warnings.warn(
            f"{count} of {at_max.size} kept transitions ({count / at_max.size:.1%}) stopped "
            f"at the maximum tree depth {max_tree_depth}: the chains explore slowly. Try "
            "metric='dense' or a reparameterisation before a deeper tree "
            "(hmc.NUTS(max_tree_depth=...)).",
            RuntimeWarning,
            stacklevel=3,
        )
    variances = (
        np.diagonal(inverse_metric, axis1=1, axis2=2)
        if inverse_metric.ndim == 3
        else inverse_metric
    )
    span = variances.max(axis=1) / variances.min(axis=1)
    if (span > METRIC_SPAN).any():
        chains = np.flatnonzero(span > METRIC_SPAN).tolist()
        warnings.warn(
            f"the adapted metric of chains {chains} spans {span.max():.1e} in variance: some "
            "direction is barely constrained (or pinned down) by the posterior. Check the "
            "model for an improper or nearly flat direction, or rescale its parameters.",
            RuntimeWarning,
            stacklevel=3,
        )
