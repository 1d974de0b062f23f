"""Initial points: the user's starts checked, or random starts drawn until finite.

Random starts are uniform(-R, R) on the unconstrained scale (Stan's default R = 2), from
each chain's own INIT stream, retried up to 100 times per chain.
"""

from __future__ import annotations

import torch

from hmc.potential import Potential
from hmc.random import Stream, uniform
from hmc.state import State
from hmc.target import Target

__all__ = ["DEFAULT_INIT_RADIUS", "MAX_INIT_TRIES", "initial_state"]

MAX_INIT_TRIES = 100
#: Random starts are uniform(-R, R) on the unconstrained scale (Stan's default R = 2).
DEFAULT_INIT_RADIUS = 2.0


def initial_state(
    target: Target,
    potential: Potential,
    position: torch.Tensor | None,
    keys: torch.Tensor,
    chains: int,
    dtype: torch.dtype,
    device: torch.device,
    radius: float,
) -> State:
    """Evaluate user starts, or draw uniform(-radius, radius) starts until finite (100
    tries)."""
    if position is not None:
        potential.check(position)
        U, grad = potential.value_and_grad(position)
        bad = (~torch.isfinite(U)).nonzero().flatten().tolist()
        if bad:
            reason = potential.explain(position[bad[0]])
            raise ValueError(
                f"init for chains {bad} has zero density or a non-finite gradient "
                f"(chain {bad[0]}: {reason})"
            )
        return State(position, U, grad)
    if target.dim is None:
        raise ValueError("dim is required when no init is given (the number of parameters)")
    dim = target.dim
    position = torch.zeros(chains, dim, dtype=dtype, device=device)
    U = torch.full((chains,), torch.inf, dtype=dtype, device=device)
    grad = torch.zeros(chains, dim, dtype=dtype, device=device)
    pending = torch.arange(chains, device=device)
    checked = False  # log_prob's output checked (where it raises, there is nothing to check)
    for attempt in range(MAX_INIT_TRIES):
        counter = torch.full((pending.numel(),), attempt, dtype=torch.int64, device=device)
        trial = radius * (2 * uniform(keys[pending], Stream.INIT, counter, dim, dtype) - 1)
        if not checked:
            checked = potential.check(trial)
        U_new, g_new = potential.value_and_grad(trial)
        position = position.index_copy(0, pending, trial)
        U = U.index_copy(0, pending, U_new)
        grad = grad.index_copy(0, pending, g_new)
        pending = pending[~torch.isfinite(U_new)]
        if pending.numel() == 0:
            return State(position, U, grad)
    chain = int(pending[0])
    raise ValueError(
        f"could not find a finite starting point for chains {pending.tolist()} after "
        f"{MAX_INIT_TRIES} uniform({-radius:g}, {radius:g}) draws (last try, chain {chain}: "
        f"{potential.explain(position[chain])}); pass init= (starting values, or a smaller "
        "radius for the random starts)"
    )
