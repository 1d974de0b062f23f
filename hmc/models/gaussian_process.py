"""Gaussian processes on 11 inputs with a squared-exponential kernel: a marginal GP
regression (gp_regr) and a latent, non-centred GP with Poisson counts (gp_pois_regr).

Both factor the kernel matrix with ``torch.linalg.cholesky_ex``: where it fails (the
matrix is numerically singular, e.g. in float32) the log density is NaN, which the sampler
treats as zero density, instead of an exception.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from torch.distributions import constraints

from hmc.models._build import build
from hmc.models._data import Data, read_json
from hmc.models._densities import normal_logpdf, poisson_logpmf
from hmc.models._registry import posterior
from hmc.parameters import Model, Param, Values

__all__ = ["gp_pois_regr", "gp_regr"]

POSITIVE = Param(constraint=constraints.positive)
JITTER = 1e-10  # gp_pois_regr's fixed diagonal term


def _data(raw: dict) -> Data:
    x = np.asarray(raw["x"], dtype=np.float64)
    return Data(
        sq_dist=(x[:, None] - x[None, :]) ** 2,
        eye=np.eye(len(x)),
        y=raw["y"],
        k=raw["k"],
    )


def _kernel(p: Values, d: SimpleNamespace) -> torch.Tensor:
    """``alpha^2 exp(-(x_i - x_j)^2 / (2 rho^2))``, ``(N, N)``."""
    return p["alpha"] ** 2 * torch.exp(-d.sq_dist / (2 * p["rho"] ** 2))


def _cholesky(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The lower Cholesky factor and a 0-d flag of success."""
    L, info = torch.linalg.cholesky_ex(matrix)
    return L, info == 0


def _hyper_prior(p: Values) -> torch.Tensor:
    """rho ~ Gamma(25, rate 4), alpha ~ half-Normal(0, 2)."""
    return 24 * torch.log(p["rho"]) - 4 * p["rho"] - 0.5 * (p["alpha"] / 2) ** 2


@posterior("gp_pois_regr-gp_regr", reported=("rho", "alpha", "sigma"))
def gp_regr() -> Model:
    """``y ~ MultivariateNormal(0, K + sigma I)``: note that ``sigma`` enters the diagonal
    as a variance, as in posteriordb's program; sigma ~ half-Normal(0, 1)."""
    name = "gp_pois_regr-gp_regr"
    raw = read_json(name)

    def log_lik(p: Values, d: SimpleNamespace) -> torch.Tensor:
        L, ok = _cholesky(_kernel(p, d) + p["sigma"] * d.eye)
        z = torch.linalg.solve_triangular(L, d.y.unsqueeze(-1), upper=False).squeeze(-1)
        log_det = torch.log(torch.diagonal(L)).sum()
        lp = normal_logpdf(z, 0.0, 1.0).sum() - log_det
        return torch.where(ok, lp, torch.nan)

    return build(
        name,
        {"rho": POSITIVE, "alpha": POSITIVE, "sigma": POSITIVE},
        _data(raw),
        log_lik=log_lik,
        log_prior=lambda p, d: _hyper_prior(p) - 0.5 * p["sigma"] ** 2,
        observed={"y": raw["y"]},
        pointwise=False,
    )


@posterior("gp_pois_regr-gp_pois_regr", reported=("rho", "alpha", "f"))
def gp_pois_regr() -> Model:
    """``k[i] ~ Poisson(exp(f[i]))`` with the latent ``f = L f_tilde``, ``L`` the Cholesky
    factor of ``K + 1e-10 I`` and ``f_tilde ~ Normal(0, 1)`` (non-centred); ``f`` is
    reported as a derived quantity. Needs float64 (the kernel is nearly singular)."""
    name = "gp_pois_regr-gp_pois_regr"
    raw = read_json(name)

    def latent(p: Values, d: SimpleNamespace) -> torch.Tensor:
        L, ok = _cholesky(_kernel(p, d) + JITTER * d.eye)
        f = L @ p["f_tilde"]
        return torch.where(ok, f, torch.nan)

    return build(
        name,
        {"rho": POSITIVE, "alpha": POSITIVE, "f_tilde": Param(len(raw["x"]))},
        _data(raw),
        log_lik=lambda p, d: poisson_logpmf(d.k, latent(p, d)),
        log_prior=lambda p, d: _hyper_prior(p) - 0.5 * (p["f_tilde"] ** 2).sum(),
        observed={"k": raw["k"]},
        derived=lambda p, d: {"f": latent(p, d)},
    )
