"""Step-size adaptation: Stan's dual averaging and its initial step-size heuristic.

Dual averaging (``stepsize_adaptation.hpp``) drives each chain's acceptance statistic to
``target`` (0.8): after every warmup iteration ``eps = exp(x)``, and at the end of warmup
``eps = exp(x_bar)``, the average of the iterates since the last restart. Every tensor is
``(C,)``, one entry per chain, and updates take a mask so that chains at different
iterations adapt on their own schedules. The dual-averaging functions take NumPy arrays as
well (the driver's host loop keeps its adaptation state in NumPy).
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import torch

from hmc.arrays import namespace
from hmc.integrators import leapfrog
from hmc.metric import Metric
from hmc.potential import Potential
from hmc.random import Stream, normal
from hmc.state import State, take_rows, true_rows, where_rows

__all__ = [
    "DualAveragingState",
    "dual_averaging_final",
    "dual_averaging_init",
    "dual_averaging_update",
    "find_reasonable_step_size",
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


def find_reasonable_step_size(
    state: State,
    step_size: torch.Tensor,
    metric: Metric,
    potential: Potential,
    keys: torch.Tensor,
    counter: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stan's ``init_stepsize`` heuristic, per chain.

    From each chain's position, draw a momentum, take one leapfrog step and compare the
    acceptance ``exp(H0 - H)`` with 0.8; double (or halve) the step size until it crosses.

    Parameters
    ----------
    state, step_size, metric : the chains to tune (``C`` rows) and their current values.
    keys, counter : ``(C,)`` chain keys and per-chain search counters (one per momentum).

    Returns
    -------
    New step sizes ``(C,)`` and the advanced counters ``(C,)``.
    """
    threshold = math.log(0.8)
    eps = step_size.clone()
    dim = state.position.shape[1]

    def log_accept(rows: torch.Tensor) -> torch.Tensor:
        sub = take_rows(state, rows)
        sub_metric = take_rows(metric, rows)
        noise = normal(keys[rows], Stream.STEP_SIZE_SEARCH, counter[rows], dim, eps.dtype)
        p = sub_metric.momentum(noise)
        h0 = sub.potential + sub_metric.kinetic_energy(p)
        new, p_new = leapfrog(sub, p, eps[rows].unsqueeze(-1), sub_metric, potential)
        h = new.potential + sub_metric.kinetic_energy(p_new)
        return torch.nan_to_num(h0 - h, nan=-torch.inf)

    rows = torch.arange(eps.shape[0], device=eps.device)
    first = log_accept(rows)
    counter = counter + 1
    direction_up = first > threshold
    active = torch.ones_like(direction_up)
    n_active = eps.shape[0]
    # one read from the device per round: how many chains go on, and whether any left
    # the usable range
    for _ in range(2200):  # doubling to 1e7 or halving to 0 takes far fewer steps
        if n_active == 0:
            break
        rows = true_rows(active, n_active)
        d = log_accept(rows)
        counter = counter.index_add(0, rows, torch.ones_like(rows))
        up = direction_up[rows]
        going_on = torch.where(up, d > threshold, d < threshold)
        eps_rows = eps[rows]
        eps = eps.index_copy(
            0, rows, torch.where(going_on, torch.where(up, eps_rows * 2, eps_rows / 2), eps_rows)
        )
        active = torch.zeros_like(active).index_copy(0, rows, going_on)
        too_big, too_small = eps > 1e7, eps == 0
        n_active, out_of_range = torch.stack((active.sum(), (too_big | too_small).any())).tolist()
        if out_of_range:
            chains = (too_big | too_small).nonzero().flatten().tolist()
            warnings.warn(
                f"step-size search for chains {chains} "
                + (
                    "exceeded 1e7: the posterior may be improper"
                    if too_big.any()
                    else "reached 0: the density may be discontinuous"
                )
                + "; keeping the last usable step size",
                RuntimeWarning,
                stacklevel=3,
            )
            eps = torch.where(too_big, 1e7, torch.where(too_small, step_size, eps))
            active = active & ~(too_big | too_small)
            n_active = int(active.sum())
    return eps, counter
