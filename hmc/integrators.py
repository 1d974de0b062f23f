"""The leapfrog (velocity Verlet) integrator on batched states.

One step: half kick with the gradient the state carries, full drift with the metric's
velocity, one new energy and gradient from the energy module, half kick with it. That is
exactly one gradient evaluation per step, and the new gradient is carried forward for the
next step's first half kick.
"""

from __future__ import annotations

import torch

from hmc.metric import Metric
from hmc.potential import Potential
from hmc.state import State

__all__ = ["leapfrog"]


def leapfrog(
    state: State,
    momentum: torch.Tensor,
    step_size: torch.Tensor,
    metric: Metric,
    potential: Potential,
) -> tuple[State, torch.Tensor]:
    """One leapfrog step for every chain.

    Parameters
    ----------
    state : positions ``(C, D)`` with their potential ``(C,)`` and gradient ``(C, D)``.
    momentum : ``(C, D)``.
    step_size : ``(C, 1)`` signed step sizes (negative integrates backward in time).
    metric : the chains' metric.
    potential : the energy module (called once, on all ``C`` rows).

    Returns
    -------
    The new state and momentum.
    """
    p = torch.addcmul(momentum, step_size, state.grad, value=-0.5)
    q = torch.addcmul(state.position, step_size, metric.velocity(p))
    U, grad = potential.value_and_grad(q)
    p = torch.addcmul(p, step_size, grad, value=-0.5)
    return State(q, U, grad), p
