"""Time series: an AR(K) regression, ARMA(1,1) and GARCH(1,1).

The ARMA errors and GARCH variances follow first-order linear recursions
``x[t] = c[t] + a * x[t-1]``. Rather than a Python loop of ``T`` dependent steps (``T``
tiny tensor operations per evaluation, slow under ``torch.func.vmap``),
:func:`linear_recurrence` runs a Hillis-Steele scan: after step ``k``,
``x[t] = sum_{j < 2^k} a^j c[t-j]``, so ``ceil(log2 T)`` steps of whole-vector operations
give the same sum (exact in exact arithmetic; 8 steps for T = 200).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from torch.distributions import constraints

from hmc.models._build import build, normal_regression
from hmc.models._data import Data, read_json
from hmc.models._densities import half_cauchy_kernel, normal_logpdf
from hmc.models._registry import posterior
from hmc.parameters import Model, Param, Values

__all__ = ["arK", "arma11", "garch11", "linear_recurrence"]

SIGMA = Param(constraint=constraints.positive)


def linear_recurrence(c: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """``x`` ``(T,)`` with ``x[0] = c[0]`` and ``x[t] = c[t] + a x[t-1]``, for ``c`` ``(T,)``
    and a 0-d ``a`` (any sign; ``|a| > 1`` grows geometrically, as the recursion does)."""
    x, power, shift = c, a, 1
    while shift < c.shape[-1]:
        x = x + power * F.pad(x[..., :-shift], (shift, 0))
        power = power * power
        shift *= 2
    return x


def _lagged(y: np.ndarray) -> dict[str, np.ndarray]:
    """``ylag`` = y shifted right by one (0 first) and ``first`` = the indicator of t = 1."""
    first = np.zeros_like(y)
    first[0] = 1.0
    return {"y": y, "ylag": np.concatenate(([0.0], y[:-1])), "first": first}


@posterior("arK-arK", reported=("alpha", "beta", "sigma"))
def arK() -> Model:
    """AR(K): ``y[t] ~ Normal(alpha + sum_k beta[k] y[t-k], sigma)`` for t > K, priors
    Normal(0, 10) on alpha and beta, half-Cauchy(0, 2.5) on sigma."""
    name = "arK-arK"
    raw = read_json(name)
    K, y = int(raw["K"]), np.asarray(raw["y"], dtype=np.float64)
    T = len(y)
    lags = np.column_stack([y[K - k : T - k] for k in range(1, K + 1)])
    return normal_regression(
        name,
        {"alpha": Param(), "beta": Param(K), "sigma": SIGMA},
        Data(X=lags, y=y[K:]),
        mean=lambda p, d: p["alpha"] + d.X @ p["beta"],
        log_prior=lambda p, d: (
            -0.5 * (p["alpha"] / 10) ** 2
            - 0.5 * ((p["beta"] / 10) ** 2).sum()
            + half_cauchy_kernel(p["sigma"], 2.5)
        ),
        response="y",
    )


@posterior("arma-arma11", reported=("mu", "phi", "theta", "sigma"))
def arma11() -> Model:
    """ARMA(1,1): ``err[t] = y[t] - mu - phi y[t-1] - theta err[t-1]`` (``y[0] := mu``,
    ``err[0] := 0``), ``err ~ Normal(0, sigma)``; priors Normal(0, 10) on mu, Normal(0, 2)
    on phi and theta, half-Cauchy(0, 2.5) on sigma."""
    name = "arma-arma11"
    raw = read_json(name)
    y = np.asarray(raw["y"], dtype=np.float64)

    def errors(p: Values, d: SimpleNamespace) -> torch.Tensor:
        previous = d.ylag + p["mu"] * d.first
        return linear_recurrence(d.y - p["mu"] - p["phi"] * previous, -p["theta"])

    return build(
        name,
        {"mu": Param(), "phi": Param(), "theta": Param(), "sigma": SIGMA},
        Data(**_lagged(y)),
        log_lik=lambda p, d: normal_logpdf(errors(p, d), 0.0, p["sigma"]),
        log_prior=lambda p, d: (
            -0.5 * (p["mu"] / 10) ** 2
            - 0.5 * (p["phi"] / 2) ** 2
            - 0.5 * (p["theta"] / 2) ** 2
            + half_cauchy_kernel(p["sigma"], 2.5)
        ),
        observed={"y": y},
    )


@posterior("garch-garch11", reported=("mu", "alpha0", "alpha1", "beta1"))
def garch11() -> Model:
    """GARCH(1,1): ``y[t] ~ Normal(mu, s[t])`` with ``s[1] = sigma1`` and
    ``s[t]^2 = alpha0 + alpha1 (y[t-1] - mu)^2 + beta1 s[t-1]^2``; flat priors on
    ``{alpha0 > 0, 0 < alpha1 < 1, 0 < beta1 < 1 - alpha1}``.

    The bound of ``beta1`` depends on ``alpha1``: the model samples
    ``beta1_fraction`` in (0, 1) and reports ``beta1 = (1 - alpha1) * beta1_fraction``;
    the Jacobian of that scaling, ``log(1 - alpha1)``, is part of the log density (Stan's
    transform for a parameter-dependent upper bound).
    """
    name = "garch-garch11"
    raw = read_json(name)
    y = np.asarray(raw["y"], dtype=np.float64)
    sigma1 = float(raw["sigma1"])

    def beta1(p: Values) -> torch.Tensor:
        return (1 - p["alpha1"]) * p["beta1_fraction"]

    def log_lik(p: Values, d: SimpleNamespace) -> torch.Tensor:
        shock = p["alpha0"] + p["alpha1"] * (d.ylag - p["mu"]) ** 2
        c = d.first * sigma1**2 + (1 - d.first) * shock
        variance = linear_recurrence(c, beta1(p))
        return normal_logpdf(d.y, p["mu"], variance.sqrt())

    unit = Param(constraint=constraints.unit_interval)
    return build(
        name,
        {"mu": Param(), "alpha0": SIGMA, "alpha1": unit, "beta1_fraction": unit},
        Data(**_lagged(y)),
        log_lik=log_lik,
        log_prior=lambda p, d: torch.log1p(-p["alpha1"]),
        observed={"y": y},
        derived=lambda p, d: {"beta1": beta1(p)},
    )
