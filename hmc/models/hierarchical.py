"""The eight schools: a hierarchical normal model, centred (a funnel) and non-centred.

Both have the same posterior for (theta, mu, tau): ``y[j] ~ Normal(theta[j], sigma[j])``,
``theta[j] ~ Normal(mu, tau)``, ``mu ~ Normal(0, 5)``, ``tau ~ half-Cauchy(0, 5)``. The
non-centred form samples ``theta_trans ~ Normal(0, 1)`` and reports the derived
``theta = mu + tau * theta_trans``, as posteriordb does.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import torch
from torch.distributions import constraints

from hmc.models._build import build
from hmc.models._data import Data, read_json
from hmc.models._densities import half_cauchy_kernel, normal_logpdf
from hmc.models._registry import posterior
from hmc.parameters import Model, Param, Values

__all__ = ["eight_schools_centered", "eight_schools_noncentered"]

SCHOOLS = ["Choate", "Deerfield", "Phillips Andover", "Phillips Exeter", "Hotchkiss",
           "Lawrenceville", "St. Paul's", "Mt. Hermon"]  # fmt: skip


def _eight_schools(
    name: str,
    params: dict[str, Param],
    theta: Callable[[Values], torch.Tensor],
    log_prior: Callable[[Values], torch.Tensor],
    derived: Callable[[Values, SimpleNamespace], dict[str, torch.Tensor]] | None = None,
) -> Model:
    """The shared likelihood ``y ~ Normal(theta(p), sigma)`` and priors on mu and tau;
    ``log_prior`` adds the rest."""
    raw = read_json(name)
    school = ["school"]
    return build(
        name,
        params,
        Data(y=raw["y"], sigma=raw["sigma"]),
        log_lik=lambda p, d: normal_logpdf(d.y, theta(p), d.sigma),
        log_prior=lambda p, d: (
            log_prior(p) - 0.5 * (p["mu"] / 5) ** 2 + half_cauchy_kernel(p["tau"], 5.0)
        ),
        observed={"y": raw["y"]},
        derived=derived,
        dims={"theta": school, "theta_trans": school, "y": school},
        coords={"school": SCHOOLS},
    )


@posterior("eight_schools-eight_schools_centered", reported=("theta", "mu", "tau"))
def eight_schools_centered() -> Model:
    """Centred eight schools: ``theta ~ Normal(mu, tau)`` sampled directly (a funnel:
    expect divergences)."""
    return _eight_schools(
        "eight_schools-eight_schools_centered",
        {"mu": Param(), "tau": Param(constraint=constraints.positive), "theta": Param(8)},
        theta=lambda p: p["theta"],
        log_prior=lambda p: normal_logpdf(p["theta"], p["mu"], p["tau"]).sum(),
    )


def _theta(p: Values) -> torch.Tensor:
    return p["mu"] + p["tau"] * p["theta_trans"]


@posterior("eight_schools-eight_schools_noncentered", reported=("theta", "mu", "tau"))
def eight_schools_noncentered() -> Model:
    """Non-centred eight schools: ``theta_trans ~ Normal(0, 1)``, derived
    ``theta = mu + tau * theta_trans``."""

    def derived(p: Values, d: SimpleNamespace) -> dict[str, torch.Tensor]:
        return {"theta": _theta(p)}

    return _eight_schools(
        "eight_schools-eight_schools_noncentered",
        {"mu": Param(), "tau": Param(constraint=constraints.positive), "theta_trans": Param(8)},
        theta=_theta,
        log_prior=lambda p: -0.5 * (p["theta_trans"] ** 2).sum(),
        derived=derived,
    )
