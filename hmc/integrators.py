"""The leapfrog (velocity Verlet) integrator on batched states.

One step: half kick with the gradient the state carries, full drift with the metric's
velocity, one new energy and gradient from the energy module, half kick with it. That is
exactly one gradient evaluation per step, and the new gradient is carried forward for the
next step's first half kick.
"""

from __future__ import annotations

import numpy as np
import torch

from hmc.metric import Metric
from hmc.potential import Potential
from hmc.state import State

__all__ = ["leapfrog", "leapfrog_numpy"]


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


def leapfrog_numpy(
    position: np.ndarray,
    grad: np.ndarray,
    momentum: np.ndarray,
    step_size: float | np.ndarray,
    metric: Metric,
    potential: Potential,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The same step on NumPy arrays, for chains kept on the host (CPU).

    Parameters
    ----------
    position, grad, momentum : ``(C, D)``.
    step_size : ``(C, 1)`` signed step sizes, or one float for every chain.
    metric : the chains' metric with NumPy fields (see :func:`hmc.metric.to_numpy`).
    potential : the energy module (:meth:`~hmc.Potential.value_and_grad_numpy`, once).

    Returns
    -------
    The new position ``(C, D)``, potential ``(C,)``, gradient ``(C, D)`` and momentum.
    The arithmetic is NumPy's, so it can differ from :func:`leapfrog` in the last bit.
    """
    half_step = 0.5 * step_size
    p = momentum - half_step * grad
    q = position + step_size * metric.velocity(p)
    U, g = potential.value_and_grad_numpy(q)
    return q, U, g, p - half_step * g
