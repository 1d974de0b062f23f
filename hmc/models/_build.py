"""Assembling an :class:`hmc.Model` from a log prior and a log-likelihood over packaged data.

Every built-in model is ``log p = log_prior(p, d) + sum(log_lik(p, d))`` with ``d`` the
model's constants as tensors in the parameters' dtype. A pointwise ``log_lik`` (one term per
observation) also becomes the ``log_likelihood`` group, so ``arviz_stats.loo`` works.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from hmc.models._data import Data
from hmc.models._densities import normal_logpdf
from hmc.parameters import Model, Param, Values

__all__ = ["build", "normal_regression"]

Part = Callable[[Values, SimpleNamespace], torch.Tensor]


def build(
    name: str,
    params: Mapping[str, Param],
    data: Data,
    log_lik: Part,
    log_prior: Part | None = None,
    *,
    observed: Mapping[str, Any],
    pointwise: bool = True,
    derived: Callable[[Values, SimpleNamespace], dict[str, torch.Tensor]] | None = None,
    dims: Mapping[str, Sequence[str]] | None = None,
    coords: Mapping[str, Sequence[Any]] | None = None,
) -> Model:
    """A Model with ``log p = log_prior + log_lik.sum()``.

    Parameters
    ----------
    log_lik, log_prior : ``(p, d) -> tensor``
        ``p`` the constrained parameters, ``d`` the constants (``data.like``). ``log_lik``
        returns the pointwise terms ``(n_obs,)`` when ``pointwise`` (then also reported as
        the ``log_likelihood`` group under the single name in ``observed``), else a 0-d
        total. ``log_prior`` None means flat (improper) priors.
    observed : the observed response(s), the ``observed_data`` group.
    derived : ``(p, d) -> {name: tensor}``, deterministic quantities per draw.
    """
    first = next(iter(params))

    def constants(p: Values) -> SimpleNamespace:
        return data.like(p[first])

    def log_prob(p: Values) -> torch.Tensor:
        d = constants(p)
        lp = log_lik(p, d).sum()
        return lp if log_prior is None else lp + log_prior(p, d)

    log_likelihood = None
    if pointwise:
        (response,) = observed

        def log_likelihood(p: Values) -> dict[str, torch.Tensor]:
            return {response: log_lik(p, constants(p))}

    return Model(
        log_prob,
        params,
        derived=None if derived is None else lambda p: derived(p, constants(p)),
        log_likelihood=log_likelihood,
        observed_data={k: np.asarray(v, dtype=np.float64) for k, v in observed.items()},
        dims=dims,
        coords=coords,
        name=name,
    )


def normal_regression(
    name: str,
    params: Mapping[str, Param],
    data: Data,
    mean: Part,
    log_prior: Part | None,
    *,
    response: str,
    **kwargs: Any,
) -> Model:
    """``y[n] ~ Normal(mean(p, d)[n], p["sigma"])`` with ``y = data.arrays["y"]``, observed
    under the name ``response``."""

    def log_lik(p: Values, d: SimpleNamespace) -> torch.Tensor:
        return normal_logpdf(d.y, mean(p, d), p["sigma"])

    return build(
        name,
        params,
        data,
        log_lik,
        log_prior,
        observed={response: data.arrays["y"]},
        **kwargs,
    )
