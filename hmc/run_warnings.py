"""Warnings at the end of a run: what to know before trusting its draws.

Stan and PyMC report these after sampling; so does :func:`hmc.sample`, once each, as
``RuntimeWarning``:

- divergent transitions among the kept draws (the integrator met curvature its step size
  cannot follow; the draws may be biased);
- NUTS transitions that stopped at the maximum tree depth (slow mixing, and a long run);
- an adapted inverse metric whose scales span more than :data:`METRIC_SPAN` (a direction
  the posterior barely constrains, or one it pins down, either of which starves the rest);
- chains the warmup restarted from another chain (stranded far below the others'
  log density: a bad start, or a mode the other chains never visit);
- coordinates whose draws have not settled: split R-hat above :data:`UNSETTLED_RHAT`
  (chains, or the halves of one chain, disagree: chains that have not converged, or a
  direction the posterior does not constrain, drifting for ever). Only with at least
  :data:`UNSETTLED_MIN_DRAWS` draws per chain: over fewer, classic R-hat over-reacts to
  autocorrelation, and nested R-hat (:func:`hmc.nested_rhat`) is the check to run.
  The unconstrained coordinates are checked, named by their parameter (``W[3]``,
  ``sigma``) for an :class:`hmc.Model` and by their index for a plain log density; for a
  run streamed to a file (``store=``), the stored posterior variables, read a block at a
  time.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from hmc.diagnostics import split_rhat

__all__ = ["METRIC_SPAN", "UNSETTLED_MIN_DRAWS", "UNSETTLED_RHAT", "warn_about_run"]

#: an adapted inverse metric whose largest and smallest variances differ by more than
#: this factor gets a warning
METRIC_SPAN = 1e8
#: a coordinate whose split R-hat exceeds this gets a warning ...
UNSETTLED_RHAT = 1.1
#: ... when every chain kept at least this many draws
UNSETTLED_MIN_DRAWS = 100
#: the most draws read at once from a stored posterior for the settled check, in bytes
BLOCK_BYTES = 32 * 2**20


def warn_about_run(
    sample_stats: dict[str, np.ndarray],
    inverse_metric: np.ndarray,
    restarted_chains: np.ndarray | None = None,
    draws: np.ndarray | Any | None = None,
    names: Sequence[str] | None = None,
) -> None:
    """Warn about the kept draws' ``sample_stats`` (``(C, W)`` arrays under their ArviZ
    names), the adapted ``inverse_metric`` (``(C, D)`` or ``(C, D, D)``), the chains
    the warmup restarted ``(R,)`` and the kept unconstrained ``draws`` ``(C, W, D)`` (or
    a stored posterior: an ``xarray.Dataset`` of ``(chain, draw, ...)`` variables).
    ``names`` (``D`` of them) name the coordinates of unconstrained ``draws`` in the
    messages; without them, their indices do."""
    if restarted_chains is not None and len(restarted_chains):
        warnings.warn(
            f"chains {restarted_chains.tolist()} stayed far below the others' log density "
            "over a warmup window and were restarted from other chains' states (a bad start, or "
            "a mode the other chains never visit: on a posterior with modes of very "
            "different heights, compare with runs started in each mode, init=)",
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
    if draws is None:
        return
    stored = not isinstance(draws, np.ndarray)
    chains, kept = (draws.sizes["chain"], draws.sizes["draw"]) if stored else draws.shape[:2]
    if kept >= UNSETTLED_MIN_DRAWS and chains > 0:
        if stored:
            blocks = _stored_blocks(draws)
        else:
            coordinates = list(range(draws.shape[2])) if names is None else list(names)
            blocks = [(coordinates, draws)]
        unsettled, rhat, count = [], 1.0, 0
        for labels, block in blocks:
            bad, block_rhat = _unsettled(block)
            unsettled += [labels[i] for i in bad]
            rhat, count = max(rhat, block_rhat), count + len(labels)
        if unsettled:
            shown = ", ".join(str(i) for i in unsettled[:10]) + (
                " ..." if len(unsettled) > 10 else ""
            )
            where = "of the stored posterior" if stored else "of the unconstrained position"
            warnings.warn(
                f"{len(unsettled)} of {count} coordinates ({where}: {shown}) have not "
                f"settled: split R-hat up to {rhat:.2f} (above "
                f"{UNSETTLED_RHAT}), chains or halves of chains disagree. Look at their "
                "traces: chains that have not converged need a longer run; a drift that "
                "never ends is a direction the posterior does not constrain (an improper "
                "prior?).",
                RuntimeWarning,
                stacklevel=3,
            )


def _stored_blocks(posterior: Any) -> Iterator[tuple[list[str], np.ndarray]]:
    """The coordinates of each numeric variable of a stored ``posterior`` (``(chain,
    draw, ...)`` each), named ``name[i, j]``, as ``(C, W, k)`` float blocks of rows of its
    first coordinate, about :data:`BLOCK_BYTES` each."""
    for name, variable in posterior.data_vars.items():
        if not np.issubdtype(variable.dtype, np.number):
            continue
        if variable.ndim == 2:
            variable = variable.expand_dims("coordinate", axis=2)
        chains, kept, rows = variable.shape[:3]
        inner = variable.shape[3:]
        per_row = chains * kept * variable.dtype.itemsize * int(np.prod(inner))
        step = max(1, BLOCK_BYTES // max(per_row, 1))
        for start in range(0, rows, step):
            stop = min(start + step, rows)
            block = variable[:, :, start:stop].values.reshape(chains, kept, -1)
            if posterior[name].ndim == 2:
                labels = [name]
            else:
                indices = ((start + i[0], *i[1:]) for i in np.ndindex(stop - start, *inner))
                labels = [f"{name}[{', '.join(map(str, i))}]" for i in indices]
            yield labels, block.astype(float)


def _unsettled(draws: np.ndarray) -> tuple[np.ndarray, float]:
    """The coordinates of ``draws`` ``(C, W, D)`` whose split R-hat (without ranks:
    cheap at any D) exceeds :data:`UNSETTLED_RHAT`, and the largest R-hat (a
    coordinate that never moved has none and is not flagged here)."""
    rhat = split_rhat(np.moveaxis(draws, 2, 0))
    bad = np.flatnonzero(rhat > UNSETTLED_RHAT)
    return bad, float(rhat[bad].max()) if bad.size else 1.0
