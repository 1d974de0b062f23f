"""The leapfrog (velocity Verlet) integrator on batched states.

One step: half kick with the gradient the state carries, full drift with the metric's
velocity, one new energy and gradient from the energy module, half kick with it. That is
exactly one gradient evaluation per step, and the new gradient is carried forward for the
next step's first half kick. The arrays are torch tensors or NumPy arrays (the run's
engine, :mod:`hmc.arrays`).
"""

from __future__ import annotations

import numpy as np
import torch

from hmc.metric import Metric
from hmc.potential import Potential
from hmc.state import State

__all__ = ["leapfrog"]


def leapfrog[A: (torch.Tensor, np.ndarray)](
    state: State,
    momentum: A,
    step_size: A | float,
    metric: Metric,
    potential: Potential,
) -> tuple[State, A]:
    """One leapfrog step for every chain.

    Parameters
    ----------
    state : positions ``(C, D)`` with their potential ``(C,)`` and gradient ``(C, D)``.
    momentum : ``(C, D)``.
    step_size : ``(C, 1)`` signed step sizes (negative integrates backward in time), or
        one number for every chain.
    metric : the chains' metric (fields of the same kind as the arrays).
    potential : the energy module (called once, on all ``C`` rows).

    Returns
    -------
    The new state and momentum.
    """
    half_step = 0.5 * step_size
    p = momentum - half_step * state.grad
    q = state.position + step_size * metric.velocity(p)
    U, grad = potential.value_and_grad(q)
    return State(q, U, grad), p - half_step * grad
