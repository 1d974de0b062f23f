"""Linear regressions with normal noise: kidiq, earnings, kilpisjarvi, sblrc and diamonds.

Each follows the posterior's ``model.md`` in posteriordb's validation set: the same priors
(flat and improper where the Stan program states none), ``sigma`` through ``exp`` with its
log-Jacobian (added by :class:`hmc.Model`).
"""

from __future__ import annotations

import numpy as np
from torch.distributions import constraints

from hmc.models._build import normal_regression
from hmc.models._data import Data, read_json
from hmc.models._densities import half_cauchy_kernel, student_t3_kernel
from hmc.models._registry import posterior
from hmc.parameters import Model, Param

__all__ = ["blr", "diamonds", "earn_height", "kidscore_interaction", "kilpisjarvi"]

SIGMA = Param(constraint=constraints.positive)


@posterior("kidiq-kidscore_interaction", reported=("beta", "sigma"))
def kidscore_interaction() -> Model:
    """kid_score ~ Normal(b1 + b2 mom_hs + b3 mom_iq + b4 mom_hs mom_iq, sigma); flat
    prior on beta, half-Cauchy(0, 2.5) on sigma. Uncentred: correlations near 0.99."""
    name = "kidiq-kidscore_interaction"
    raw = read_json(name)
    hs = np.asarray(raw["mom_hs"], dtype=np.float64)
    iq = np.asarray(raw["mom_iq"], dtype=np.float64)
    X = np.column_stack((np.ones_like(hs), hs, iq, hs * iq))
    return normal_regression(
        name,
        {"beta": Param(4), "sigma": SIGMA},
        Data(X=X, y=np.asarray(raw["kid_score"], dtype=np.float64)),
        mean=lambda p, d: d.X @ p["beta"],
        log_prior=lambda p, d: half_cauchy_kernel(p["sigma"], 2.5),
        response="kid_score",
    )


@posterior("earnings-earn_height", reported=("beta", "sigma"))
def earn_height() -> Model:
    """earn ~ Normal(beta1 + beta2 height, sigma) with flat improper priors on everything
    (flat in sigma itself). Extreme scales: beta1 ~ -6e4, sigma ~ 2e4."""
    name = "earnings-earn_height"
    raw = read_json(name)
    height = np.asarray(raw["height"], dtype=np.float64)
    return normal_regression(
        name,
        {"beta": Param(2), "sigma": SIGMA},
        Data(X=np.column_stack((np.ones_like(height), height)), y=raw["earn"]),
        mean=lambda p, d: d.X @ p["beta"],
        log_prior=None,
        response="earn",
    )


@posterior("kilpisjarvi_mod-kilpisjarvi", reported=("alpha", "beta", "sigma"))
def kilpisjarvi() -> Model:
    """y ~ Normal(alpha + beta x, sigma), x ~ 4000 (years): ``|corr(alpha, beta)| > 0.9999``.
    Normal priors from the data on alpha and beta, flat improper prior on sigma."""
    name = "kilpisjarvi_mod-kilpisjarvi"
    raw = read_json(name)
    ma, sa = float(raw["pmualpha"]), float(raw["psalpha"])
    mb, sb = float(raw["pmubeta"]), float(raw["psbeta"])
    return normal_regression(
        name,
        {"alpha": Param(), "beta": Param(), "sigma": SIGMA},
        Data(x=raw["x"], y=raw["y"]),
        mean=lambda p, d: p["alpha"] + p["beta"] * d.x,
        log_prior=lambda p, d: (
            -0.5 * ((p["alpha"] - ma) / sa) ** 2 - 0.5 * ((p["beta"] - mb) / sb) ** 2
        ),
        response="y",
    )


@posterior("sblrc-blr", reported=("beta", "sigma"))
def blr() -> Model:
    """y ~ Normal(X beta, sigma), beta ~ Normal(0, 10), sigma ~ half-Normal(0, 10)."""
    name = "sblrc-blr"
    raw = read_json(name)
    return normal_regression(
        name,
        {"beta": Param(int(raw["D"])), "sigma": SIGMA},
        Data(X=raw["X"], y=raw["y"]),
        mean=lambda p, d: d.X @ p["beta"],
        log_prior=lambda p, d: -0.5 * ((p["beta"] / 10) ** 2).sum() - 0.5 * (p["sigma"] / 10) ** 2,
        response="y",
    )


@posterior("diamonds-diamonds", reported=("b", "Intercept", "sigma"))
def diamonds() -> Model:
    """brms regression of log price on 24 centred predictors (N = 5000): b ~ Normal(0, 1),
    Intercept ~ Student-t(3, 8, 10), sigma ~ half-Student-t(3, 0, 10). Ill-conditioned."""
    name = "diamonds-diamonds"
    raw = read_json(name)
    X = np.asarray(raw["X"], dtype=np.float64)[:, 1:]
    Xc = X - X.mean(axis=0)
    return normal_regression(
        name,
        {"b": Param(Xc.shape[1]), "Intercept": Param(), "sigma": SIGMA},
        Data(X=Xc, y=raw["Y"]),
        mean=lambda p, d: p["Intercept"] + d.X @ p["b"],
        log_prior=lambda p, d: (
            -0.5 * (p["b"] ** 2).sum()
            + student_t3_kernel(p["Intercept"], 8.0, 10.0)
            + student_t3_kernel(p["sigma"], 0.0, 10.0)
        ),
        response="Y",
    )
