"""Compare a run on a built-in posterior with posteriordb's reference draws.

For every parameter posteriordb reports (after mapping the run with
:func:`hmc.models.reference_draws`):

- the mean, as ``z = (mean - ref_mean) / sqrt(mcse^2 + ref_mcse^2)``, with the run's MCSE
  from ``arviz_stats.mcse`` and the reference's ``mcse_mean`` from ``reference.json``;
- the sd, as a relative error and as a z-score with the run's ``mcse(method="sd")``;
- the 5 % and 95 % quantiles, as z-scores with ``mcse(method="quantile")``;
- the run's bulk and tail ESS and rank-normalised split R-hat.

Where the reference draws themselves are not given (they are not shipped), the reference's
MCSE of the sd and quantiles is the run's, scaled by ``sqrt(ess_run / ess_reference)``
(the same distribution, more effective draws). The run's MCSEs come from the run's own,
smaller ESS, so they carry that uncertainty honestly.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hmc.models import reference, reference_draws

__all__ = ["ParameterCheck", "compare", "z_bound"]


@dataclass(frozen=True)
class ParameterCheck:
    """One reported parameter of a run against the reference."""

    name: str
    mean: float
    ref_mean: float
    mean_z: float
    sd: float
    ref_sd: float
    sd_rel_error: float
    sd_z: float
    q05_z: float
    q95_z: float
    ess_bulk: float
    ess_tail: float
    rhat: float


def z_bound(checks: int, alpha: float = 0.01) -> float:
    """Two-sided normal bound for ``checks`` simultaneous z-scores at family-wise level
    ``alpha`` (Bonferroni): ``Phi^-1(1 - alpha / (2 checks))``."""
    return statistics.NormalDist().inv_cdf(1 - alpha / (2 * max(checks, 1)))


def compare(
    posterior: str,
    run: Any,
    reference_values: Mapping[str, np.ndarray] | None = None,
) -> list[ParameterCheck]:
    """Checks of every reported parameter of ``posterior`` (in posteriordb's order).

    Parameters
    ----------
    posterior : a name from :func:`hmc.models.names`
    run : the ``DataTree`` from :func:`hmc.sample` on ``hmc.models.load(posterior)`` (or
        its posterior dict ``variable -> (chain, draw, *shape)``)
    reference_values : optional reference draws ``name -> (chain, draw)`` (posteriordb's
        ``draws.npz``), for the reference's MCSE of the sd and quantiles.
    """
    import arviz_stats
    import xarray

    summary = reference(posterior)
    ours = reference_draws(posterior, run)
    expected = summary["parameter_names"]
    if list(ours) != expected:
        raise ValueError(f"run reports {list(ours)}, posteriordb reports {expected}")

    def diagnostics(draws: Mapping[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
        data = xarray.Dataset(
            {f"v{i}": (("chain", "draw"), np.asarray(draws[k])) for i, k in enumerate(expected)}
        )
        calls = {
            "mcse_mean": lambda: arviz_stats.mcse(data, method="mean"),
            "mcse_sd": lambda: arviz_stats.mcse(data, method="sd"),
            "mcse_q05": lambda: arviz_stats.mcse(data, method="quantile", prob=0.05),
            "mcse_q95": lambda: arviz_stats.mcse(data, method="quantile", prob=0.95),
            "ess_bulk": lambda: arviz_stats.ess(data, method="bulk"),
            "ess_tail": lambda: arviz_stats.ess(data, method="tail"),
            "rhat": lambda: arviz_stats.rhat(data),
        }
        out = {key: call() for key, call in calls.items()}
        return {key: {k: float(out[key][f"v{i}"]) for i, k in enumerate(expected)} for key in out}

    mine = diagnostics(ours)
    theirs = diagnostics(reference_values) if reference_values is not None else None
    checks = []
    for name in expected:
        stats = summary["stats"][name]
        x = np.asarray(ours[name], dtype=np.float64)
        mean, sd = float(x.mean()), float(x.std(ddof=1))
        scale = np.sqrt(mine["ess_bulk"][name] / stats["ess_bulk"])
        ref_mcse = {
            key: theirs[key][name] if theirs is not None else mine[key][name] * scale
            for key in ("mcse_sd", "mcse_q05", "mcse_q95")
        }
        q05, q95 = np.quantile(x, (0.05, 0.95))
        checks.append(
            ParameterCheck(
                name=name,
                mean=mean,
                ref_mean=stats["mean"],
                mean_z=_z(mean, stats["mean"], mine["mcse_mean"][name], stats["mcse_mean"]),
                sd=sd,
                ref_sd=stats["sd"],
                sd_rel_error=sd / stats["sd"] - 1,
                sd_z=_z(sd, stats["sd"], mine["mcse_sd"][name], ref_mcse["mcse_sd"]),
                q05_z=_z(q05, stats["q05"], mine["mcse_q05"][name], ref_mcse["mcse_q05"]),
                q95_z=_z(q95, stats["q95"], mine["mcse_q95"][name], ref_mcse["mcse_q95"]),
                ess_bulk=mine["ess_bulk"][name],
                ess_tail=mine["ess_tail"][name],
                rhat=mine["rhat"][name],
            )
        )
    return checks


def _z(value: float, ref_value: float, mcse: float, ref_mcse: float) -> float:
    return (value - ref_value) / float(np.hypot(mcse, ref_mcse))
