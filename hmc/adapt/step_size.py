"""Step-size adaptation: Stan's dual averaging.

Dual averaging (``stepsize_adaptation.hpp``) drives each chain's acceptance statistic to
``target`` (0.8): after every warmup iteration ``eps = exp(x)``, and at the end of warmup
``eps = exp(x_bar)``, the average of the iterates since the last restart. Every tensor is
``(C,)``, one entry per chain, and updates take a mask so that chains at different
iterations adapt on their own schedules. The functions take NumPy arrays as well (the NumPy
engine's adaptation state). Stan's initial step-size heuristic, a few leapfrog steps, is
:func:`hmc.step_size_search.find_reasonable_step_size`, passed in by the driver.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from hmc.arrays import namespace
from hmc.state import where_rows

__all__ = [
    "DualAveragingState",
    "dual_averaging_final",
    "dual_averaging_init",
    "dual_averaging_update",
]

TARGET, GAMMA, KAPPA, T0 = 0.8, 0.05, 0.75, 10.0


class DualAveragingState(NamedTuple):
    """Per-chain dual-averaging state, ``(C,)`` each.

    counter: iterations since the last restart; s_bar: averaged (target - accept);
    x_bar: averaged log step size; mu: the shrinkage point log(10 eps0);
    log_step_size: the current iterate x.
    """

    counter: torch.Tensor
    s_bar: torch.Tensor
    x_bar: torch.Tensor
    mu: torch.Tensor
    log_step_size: torch.Tensor


def dual_averaging_init(
    step_size: torch.Tensor, shrink_towards: torch.Tensor | None = None
) -> DualAveragingState:
    """A fresh state at ``step_size`` ``(C,)`` with ``mu = log(10 eps)``, ``eps`` being
    ``shrink_towards`` ``(C,)`` when given and ``step_size`` otherwise."""
    xp = namespace(step_size)
    zeros = xp.zeros_like(step_size)
    log_eps = xp.log(step_size)
    log_mu_eps = log_eps if shrink_towards is None else xp.log(shrink_towards)
    return DualAveragingState(zeros, zeros, zeros, math.log(10.0) + log_mu_eps, log_eps)


def dual_averaging_update(
    state: DualAveragingState,
    accept_stat: torch.Tensor,
    mask: torch.Tensor | None = None,
    target: float = TARGET,
    gamma: float = GAMMA,
    kappa: float = KAPPA,
    t0: float = T0,
) -> DualAveragingState:
    """One step of Stan's ``learn_stepsize`` for the chains in ``mask`` ``(C,)``."""
    xp = namespace(accept_stat)
    counter = state.counter + 1
    accept = xp.nan_to_num(accept_stat, nan=0.0).clip(None, 1.0)
    eta = 1.0 / (counter + t0)
    s_bar = (1 - eta) * state.s_bar + eta * (target - accept)
    x = state.mu - s_bar * xp.sqrt(counter) / gamma
    weight = counter ** (-kappa)
    x_bar = (1 - weight) * state.x_bar + weight * x
    new = DualAveragingState(counter, s_bar, x_bar, state.mu, x)
    return new if mask is None else where_rows(mask, new, state)


def dual_averaging_final(state: DualAveragingState) -> torch.Tensor:
    """The adapted step sizes ``exp(x_bar)`` ``(C,)``."""
    return namespace(state.x_bar).exp(state.x_bar)
