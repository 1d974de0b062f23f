"""Isokinetic (ESH) dynamics: the integrator of the microcanonical sampler (:class:`hmc.MAMS`).

The momentum is a unit vector ``u`` ``(C, D)`` in the metric's whitened coordinates
``y = S^-1 x``, where ``S`` is the square root of the inverse metric (``sqrt(M^-1)`` for a
diagonal metric, its lower Cholesky factor for a dense one, the factor F with F F^T = M^-1
for a low-rank one): a position moves along
``S u`` at unit speed, and ``u`` turns towards the force ``f = -S^T grad U`` without
changing its length (Steeg & Galstyan 2021; Robnik et al. 2023, 2025). For a step of
duration ``t`` the momentum update is exact:

    e = f / |f|,  delta = t |f| / (D - 1),  zeta = exp(-delta),
    u' ∝ e (1 - zeta)(1 + zeta + (u.e)(1 - zeta)) + 2 zeta u,

and the kinetic energy changes by the log of the update's Jacobian,

    dK = (D - 1) (delta - log 2 + log(1 + u.e + (1 - u.e) zeta^2)),

computed here as ``(D - 1) (delta + log1p((1 - u.e) expm1(-2 delta) / 2))``, the same
number without the cancellation of ``log 2`` at small ``delta``. A leapfrog step is a half
momentum update, a full position update (one new gradient), a half momentum update; the
energy error of a trajectory is the potential's change plus the summed ``dK``, which the
Metropolis test of :class:`hmc.MAMS` reads.

The arrays are torch tensors or NumPy arrays (the run's engine, :mod:`hmc.arrays`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from hmc.arrays import namespace
from hmc.metric import DenseMetric, LowRankMetric, Metric, dot
from hmc.state import State

__all__ = [
    "IsokineticStep",
    "from_whitened",
    "isokinetic_leapfrog",
    "momentum_update",
    "to_whitened",
    "unit_momentum",
]


class IsokineticStep(NamedTuple):
    """What an isokinetic step or update returns: the new state, the unit momentum
    ``(C, D)`` and the kinetic energy change ``(C,)``."""

    state: State
    momentum: torch.Tensor
    kinetic_change: torch.Tensor


def _norm[A: (torch.Tensor, np.ndarray)](x: A) -> A:
    """``(C, 1)`` Euclidean norms of the rows of ``x`` ``(C, D)``."""
    return namespace(x).sqrt(dot(x, x))[:, None]


def unit_momentum[A: (torch.Tensor, np.ndarray)](noise: A) -> A:
    """Momenta uniform on the unit sphere from standard normal ``noise`` ``(C, D)``."""
    return noise / _norm(noise)


def from_whitened[A: (torch.Tensor, np.ndarray)](metric: Metric, u: A) -> A:
    """``S u`` ``(C, D)``: the velocity in the sampler's coordinates of a whitened unit
    momentum ``u`` ``(C, D)``."""
    if isinstance(metric, DenseMetric):
        return (metric.cholesky @ u[..., None])[..., 0]
    if isinstance(metric, LowRankMetric):
        return metric.factor(u)
    return metric.sqrt_inverse * u


def to_whitened[A: (torch.Tensor, np.ndarray)](metric: Metric, grad: A) -> A:
    """``S^T grad`` ``(C, D)``: a gradient ``(C, D)`` in the whitened coordinates."""
    if isinstance(metric, DenseMetric):
        return (metric.cholesky.swapaxes(-1, -2) @ grad[..., None])[..., 0]
    if isinstance(metric, LowRankMetric):
        return metric.factor_transpose(grad)
    return metric.sqrt_inverse * grad


def momentum_update[A: (torch.Tensor, np.ndarray)](
    u: A, grad: A, duration: A, metric: Metric
) -> tuple[A, A]:
    """The exact isokinetic momentum update over ``duration`` ``(C, 1)`` under the
    potential's gradient ``grad`` ``(C, D)``: the new unit momenta ``(C, D)`` and the
    kinetic energy changes ``(C,)`` (see the module docstring). A zero force leaves the
    momentum as it is, with no change of energy."""
    xp = namespace(u)
    dim = u.shape[1]
    force = -to_whitened(metric, grad)
    size = _norm(force)
    direction = force / xp.where(size > 0, size, 1.0)  # a zero force: no direction
    along = dot(u, direction).clip(-1.0, 1.0)[:, None]
    delta = duration * size / (dim - 1)
    zeta = xp.exp(-delta)
    turned = direction * (1 - zeta) * (1 + zeta + along * (1 - zeta)) + 2 * zeta * u
    change = (dim - 1) * (delta + xp.log1p((1 - along) * xp.expm1(-2 * delta) / 2))
    return turned / _norm(turned), change[:, 0]


def isokinetic_leapfrog[A: (torch.Tensor, np.ndarray)](
    state: State,
    u: A,
    step_size: A,
    metric: Metric,
    value_and_grad: Callable[[A], tuple[A, A]],
) -> IsokineticStep:
    """One isokinetic leapfrog step for every chain: a half momentum update with the
    gradient ``state`` carries, a position update along ``S u`` ``step_size`` ``(C, 1)``
    long, one new energy and gradient from ``value_and_grad`` (the energy module's, or
    the function a compiled graph evaluates), a half momentum update with it. Returns the
    new state, momentum and the step's kinetic energy change ``(C,)``."""
    half = 0.5 * step_size
    u, first = momentum_update(u, state.grad, half, metric)
    q = state.position + step_size * from_whitened(metric, u)
    U, grad = value_and_grad(q)
    u, second = momentum_update(u, grad, half, metric)
    return IsokineticStep(State(q, U, grad), u, first + second)
