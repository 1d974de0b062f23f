"""ChEES-HMC: jittered static HMC whose trajectory length is learnt across chains.

Hoffman, Radul & Sountsov (2021), "An adaptive MCMC scheme for setting trajectory lengths
in Hamiltonian Monte Carlo". Transition ``t`` (counted from 0) of every chain integrates for
the time ``h_t T``: ``n = ceil(h_t T / eps)`` leapfrog steps, where ``h_t`` is the
``t + 1``-th number of the base-2 Halton sequence (``1/2, 1/4, 3/4, 1/8, ...``) and ``T`` the
trajectory length. The jitter is the same for every chain, so chains sharing a step size
take the same number of steps: no tree, no bookkeeping per chain. ``T`` is a parameter
(:class:`~hmc.state.Params` ``trajectory_length``), learnt during warmup by the ensemble
adaptation (:mod:`hmc.adapt.ensemble`), which reads each transition's trajectory from the
kernel's :class:`~hmc.kernels.base.Proposal`. The Metropolis test, the divergence rule
and the statistics are static HMC's (:class:`hmc.HMC`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hmc.arrays import namespace, to_int64
from hmc.kernels.hmc import HMC, HMCDraws
from hmc.random import Stream, normal, uniform
from hmc.state import Params

__all__ = ["ChEES", "halton", "halton_draws"]

#: bits of the transition number the Halton sequence reads (about 4e9 transitions)
HALTON_BITS = 32


def halton(index: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The base-2 Halton (van der Corput) numbers of the integers ``index >= 1``: their
    binary digits mirrored about the point, in ``(0, 1)``."""
    result = torch.zeros(index.shape, dtype=dtype, device=index.device)
    for bit in range(HALTON_BITS):
        result = result + ((index >> bit) & 1).to(dtype) * 2.0 ** -(bit + 1)
    return result


def halton_draws(
    keys: torch.Tensor, counter: torch.Tensor, dim: int, dtype: torch.dtype
) -> HMCDraws:
    """The random numbers of each chain's transitions number ``counter`` ``(C, ...)`` for a
    kernel jittered by the Halton sequence: momentum noise and the Metropolis uniform from
    the chain's streams, and as the jitter the Halton number of the transition (its number
    plus one), the same for every chain."""
    return HMCDraws(
        noise=normal(keys, Stream.MOMENTUM, counter, dim, dtype),
        accept=uniform(keys, Stream.ACCEPT, counter, 1, dtype)[..., 0],
        steps=halton(counter + 1, dtype),
    )


@dataclass(frozen=True)
class ChEES(HMC):
    """Jittered static HMC with a trajectory length learnt across chains (ChEES).

    Parameters
    ----------
    trajectory_length : float, optional
        The trajectory length ``T`` where none was learnt (a run without warmup and without
        ``adapted_from``); by default one step. Warmup starts from one step and learns
        ``T`` by the ChEES criterion.
    max_steps : int
        Cap on the leapfrog steps of a transition (default 1024).
    max_energy_error : float
        Energy error above which a transition is divergent (default 1000, as in Stan).

    Examples
    --------
    >>> dt = hmc.sample(log_prob, dim=2, kernel="chees", chains=64, warmup=200)  # doctest: +SKIP
    """

    trajectory_length: float | None = None
    reports_proposal = True

    def __post_init__(self) -> None:
        if self.trajectory_length is not None and not self.trajectory_length > 0:
            raise ValueError(f"trajectory_length must be positive, got {self.trajectory_length!r}")
        if not isinstance(self.max_steps, int) or self.max_steps < 1:
            raise ValueError(f"max_steps must be a positive integer, got {self.max_steps!r}")
        if not self.max_energy_error > 0:
            raise ValueError(f"max_energy_error must be positive, got {self.max_energy_error!r}")

    def draws(
        self, keys: torch.Tensor, counter: torch.Tensor, dim: int, dtype: torch.dtype
    ) -> HMCDraws:
        """The random numbers of each chain's transitions number ``counter`` ``(C, ...)``:
        the jitter is the Halton number of the transition, the same for every chain."""
        return halton_draws(keys, counter, dim, dtype)

    def _num_steps(self, params: Params, u: torch.Tensor | None) -> torch.Tensor:
        """``(C,)`` leapfrog steps ``ceil(h T / eps)`` from the jitter ``h`` ``(C,)``."""
        step_size = params.step_size
        xp = namespace(step_size)
        length = params.trajectory_length
        if length is None:
            length = step_size if self.trajectory_length is None else self.trajectory_length
        steps = xp.ceil(u * length / step_size)
        if xp is np:
            steps = np.nan_to_num(steps, nan=1.0, posinf=self.max_steps)
        else:
            steps = torch.nan_to_num(steps, nan=1.0, posinf=self.max_steps)
        return to_int64(steps.clip(1, self.max_steps))
