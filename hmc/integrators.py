"""The leapfrog (velocity Verlet) integrator on batched states.

One step: half kick with the gradient the state carries, full drift with the metric's
velocity, one new energy and gradient from the energy module, half kick with it. That is
exactly one gradient evaluation per step, and the new gradient is carried forward for the
next step's first half kick. The arrays are torch tensors or NumPy arrays (the run's
engine, :mod:`hmc.arrays`).

:func:`leapfrog_lockstep` runs a whole trajectory of such steps in torch's ``while_loop``,
every chain stepping together, written to be compiled as one graph with the energy
(:class:`hmc.compiled.CompiledLoop`); :func:`lockstep` is that loop for any step
(the isokinetic one of :mod:`hmc.isokinetic` too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from torch._higher_order_ops.while_loop import while_loop

from hmc.arrays import namespace
from hmc.metric import Metric
from hmc.potential import Potential
from hmc.state import State

__all__ = ["Energy", "leapfrog", "leapfrog_lockstep", "lockstep"]


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


class Energy(NamedTuple):
    """An energy function ``(C, D) -> (U (C,), grad (C, D))`` where :func:`leapfrog`
    expects the energy module."""

    value_and_grad: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def leapfrog_lockstep(
    state: State,
    momentum: torch.Tensor,
    step_size: torch.Tensor,
    metric: Metric,
    energy: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    steps: torch.Tensor,
) -> tuple[State, torch.Tensor]:
    """Chain ``c`` takes ``steps[c]`` leapfrog steps, all chains in one ``while_loop``
    (:func:`lockstep`). Tensors only: ``state`` ``(C, D)``, momentum ``(C, D)``, signed
    step sizes ``step_size`` ``(C, 1)``, ``steps`` ``(C,)`` int64, ``energy`` the function
    the energy module evaluates (:func:`hmc.compiled.energy_function`). Returns the end
    states and momenta."""
    potential = Energy(energy)

    def step(position, potential_energy, grad, p):
        there, p_there = leapfrog(
            State(position, potential_energy, grad), p, step_size, metric, potential
        )
        return (*there, p_there)

    *end, p = lockstep(step, (*state, momentum), steps)
    return State(*end), p


def lockstep[R: tuple](step: Callable[..., R], carried: R, steps) -> R:
    """``steps[c]`` applications of ``step`` to row ``c`` of the arrays ``carried`` (each
    with the chain axis first), all chains together.

    Every application evaluates every chain while the longest trajectory goes on; a chain
    whose trajectory has ended keeps its rows (a select), so its extra evaluations change
    nothing. Inside ``torch.compile`` this is one ``while_loop``; run eagerly it is a plain
    Python loop over the same applications (torch's eager ``while_loop`` would trace its
    body with dynamo, and the eager run is the oracle a compiled one is checked against),
    on tensors or NumPy arrays. ``steps`` ``(C,)`` integers."""
    xp = namespace(steps)
    longest = steps.max()

    def going(i, *values):
        return i < longest

    def advance(i, *values):
        moved = step(*values)
        moving = i < steps
        return (
            i + 1,
            *(
                xp.where(moving.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)
                for new, old in zip(moved, values, strict=True)
            ),
        )

    if torch.compiler.is_compiling():
        start = torch.zeros((), dtype=torch.int64, device=steps.device)
        return tuple(while_loop(going, advance, (start, *carried))[1:])
    values = (0, *carried)
    for _ in range(int(longest)):  # eager: a plain loop, no tracing of any kind
        values = advance(*values)
    return tuple(values[1:])
