"""Stan's initial step-size heuristic (``init_stepsize``): a few one-step HMC proposals.

Warmup calls it at its start and after every metric update; the driver hands it to the
adaptation (:mod:`hmc.adapt.warmup`) with the energy module bound, so the adaptation
itself runs no leapfrog step.
"""

from __future__ import annotations

import math
import warnings

import torch

from hmc.integrators import leapfrog
from hmc.metric import Metric
from hmc.potential import Potential
from hmc.random import Stream, normal
from hmc.state import State, take_rows, true_rows

__all__ = ["find_reasonable_step_size"]


def find_reasonable_step_size(
    state: State,
    step_size: torch.Tensor,
    metric: Metric,
    keys: torch.Tensor,
    counter: torch.Tensor,
    *,
    potential: Potential,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stan's ``init_stepsize`` heuristic, per chain.

    From each chain's position, draw a momentum, take one leapfrog step and compare the
    acceptance ``exp(H0 - H)`` with 0.8; double (or halve) the step size until it crosses.

    Parameters
    ----------
    state, step_size, metric : the chains to tune (``C`` rows) and their current values
        (tensors).
    keys, counter : ``(C,)`` chain keys and per-chain search counters (one per momentum).
    potential : the energy module.

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
