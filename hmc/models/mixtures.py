"""Discrete latent variables summed out: a two-component normal mixture and a two-state
hidden Markov model.

The HMM's forward algorithm ``a[t] = logsumexp_j(a[t-1, j] + log P[j, k]) + e[t, k]`` is
a chain of products in the (logsumexp, +) semiring, ``a[N] = e[1] (x) A[2] (x) ... (x) A[N]``
with ``A[t][j, k] = log P[j, k] + e[t, k]``. Products associate, so
:func:`log_chain_product` multiplies neighbours pairwise: ``log2(N)`` batched steps
instead of ``N`` sequential ones, the same sum in exact arithmetic.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch.distributions import constraints

from hmc.models._build import build
from hmc.models._data import Data, read_json
from hmc.models._densities import normal_logpdf
from hmc.models._registry import posterior
from hmc.parameters import Model, Param, Values, ordered_vector, positive_ordered_vector

__all__ = ["hmm_example", "log_chain_product", "log_matmul", "low_dim_gauss_mix"]


@posterior("low_dim_gauss_mix-low_dim_gauss_mix", reported=("mu", "sigma", "theta"))
def low_dim_gauss_mix() -> Model:
    """``y[n] ~ theta Normal(mu[1], sigma[1]) + (1 - theta) Normal(mu[2], sigma[2])`` with
    ordered ``mu`` ~ Normal(0, 2), ``sigma`` ~ half-Normal(0, 2), ``theta`` ~ Beta(5, 5)."""
    name = "low_dim_gauss_mix-low_dim_gauss_mix"
    raw = read_json(name)

    def log_lik(p: Values, d: SimpleNamespace) -> torch.Tensor:
        theta = p["theta"]
        log_weights = torch.stack((torch.log(theta), torch.log1p(-theta)))
        per_component = normal_logpdf(d.y.unsqueeze(-1), p["mu"], p["sigma"])
        return torch.logsumexp(per_component + log_weights, -1)

    def log_prior(p: Values, d: SimpleNamespace) -> torch.Tensor:
        theta = p["theta"]
        return (
            -0.5 * ((p["sigma"] / 2) ** 2).sum()
            - 0.5 * ((p["mu"] / 2) ** 2).sum()
            + 4 * torch.log(theta)
            + 4 * torch.log1p(-theta)
        )

    return build(
        name,
        {
            "mu": Param(2, ordered_vector),
            "sigma": Param(2, constraints.positive),
            "theta": Param(constraint=constraints.unit_interval),
        },
        Data(y=raw["y"]),
        log_lik=log_lik,
        log_prior=log_prior,
        observed={"y": raw["y"]},
    )


def log_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``out[..., i, k] = logsumexp_j(a[..., i, j] + b[..., j, k])``."""
    return torch.logsumexp(a.unsqueeze(-1) + b.unsqueeze(-3), dim=-2)


def log_chain_product(mats: torch.Tensor) -> torch.Tensor:
    """``mats[0] (x) mats[1] (x) ... (x) mats[T-1]`` in the log semiring, ``(T, K, K)`` ->
    ``(K, K)``, by pairwise reduction (shapes only, so it runs under vmap)."""
    while mats.shape[0] > 1:
        n = mats.shape[0]
        paired = log_matmul(mats[0 : n - 1 : 2], mats[1:n:2])
        mats = torch.cat((paired, mats[n - 1 :])) if n % 2 else paired
    return mats[0]


@posterior("hmm_example-hmm_example", reported=("theta1", "theta2", "mu"))
def hmm_example() -> Model:
    """Two-state HMM with unit-variance normal emissions: transition rows ``theta1``,
    ``theta2`` (2-simplexes, flat priors), positive-ordered means ``mu`` with
    ``mu[1] ~ Normal(3, 1)``, ``mu[2] ~ Normal(10, 1)``; the path is summed out by the
    forward algorithm with a uniform initial state."""
    name = "hmm_example-hmm_example"
    raw = read_json(name)

    def log_lik(p: Values, d: SimpleNamespace) -> torch.Tensor:
        emission = -0.5 * (d.y.unsqueeze(-1) - p["mu"]) ** 2  # (N, K)
        log_transition = torch.log(torch.stack((p["theta1"], p["theta2"])))  # (K, K)
        steps = log_transition + emission[1:].unsqueeze(-2)  # (N-1, K, K)
        paths = emission[0].unsqueeze(-1) + log_chain_product(steps)
        return torch.logsumexp(paths.reshape(-1), 0)

    def log_prior(p: Values, d: SimpleNamespace) -> torch.Tensor:
        return -0.5 * (p["mu"][0] - 3) ** 2 - 0.5 * (p["mu"][1] - 10) ** 2

    simplex = Param(int(raw["K"]), constraints.simplex)
    return build(
        name,
        {"theta1": simplex, "theta2": simplex, "mu": Param(2, positive_ordered_vector)},
        Data(y=raw["y"]),
        log_lik=log_lik,
        log_prior=log_prior,
        observed={"y": raw["y"]},
        pointwise=False,
    )
