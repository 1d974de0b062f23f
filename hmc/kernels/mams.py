"""MAMS: the Metropolis-adjusted microcanonical sampler.

Robnik, Cohn-Gordon & Seljak (2025), "Metropolis Adjusted Microcanonical Hamiltonian Monte
Carlo" (arXiv 2503.01707); BlackJAX's adjusted MCLMC. A transition of chain ``c``:

1. a fresh momentum ``u``, uniform on the unit sphere in the metric's whitened
   coordinates (normal noise from the chain's momentum stream, normalised);
2. ``n`` steps of the isokinetic leapfrog (:mod:`hmc.isokinetic`) of step size ``eps_c``:
   one gradient per step, the speed fixed at one, the kinetic energy change of every
   momentum update summed;
3. a Metropolis test on the energy error ``W = U(x') - U(x) + sum dK``: accepted with
   probability ``min(1, exp(-W))``; a ``W`` that is not finite, or above
   ``max_energy_error``, is a divergence and a rejection.

The number of steps is jittered around the mean ``L / eps`` (``L`` the trajectory length,
:class:`~hmc.state.Params` ``trajectory_length``): transition ``t`` takes
``n = ceil(h_t s)`` steps, with ``h_t`` the ``t + 1``-th base-2 Halton number (the same for
every chain, as in :class:`hmc.ChEES`; a chain's draws depend on ``(seed, chain)`` only)
and ``s`` chosen by :func:`jitter_scale` so that a uniform ``h`` gives a mean of exactly
``L / eps``. ``L`` is learnt in warmup (:mod:`hmc.adapt.trajectory_length`); without one
the kernel's ``trajectory_length``, else ``sqrt(D)`` (the radius of a standard Gaussian,
BlackJAX's start).

The momentum is refreshed in full at every transition, so the trajectory of a transition
is deterministic given ``u`` and the chain is reversible (the isokinetic leapfrog is
time-reversible and its Jacobian is ``exp(sum dK)``). The statistics are static HMC's
(:class:`hmc.kernels.hmc.HMCInfo`): ``energy`` is ``U + sum dK`` of the accepted end
(``U`` alone, the kinetic energy on the sphere being a constant, when rejected).

The transition runs on the compiled lockstep path as static HMC's does (one graph for the
whole transition, checked against the eager transition at its first call), and eagerly
on NumPy arrays or tensors from the same random numbers: there every chain is evaluated
while the longest trajectory goes on (a chain whose trajectory has ended keeps its
point), in both paths, so both count the same gradient evaluations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from hmc.arrays import namespace, to_int64
from hmc.integrators import lockstep
from hmc.isokinetic import from_whitened, isokinetic_leapfrog, unit_momentum
from hmc.kernels.chees import halton_draws
from hmc.kernels.hmc import HMC, HMCDraws, HMCInfo
from hmc.metric import Metric, metric_from_fields
from hmc.potential import Potential
from hmc.state import Params, Proposal, State

__all__ = ["MAMS", "jitter_scale"]


def jitter_scale[A: (torch.Tensor, np.ndarray)](mean: A) -> A:
    """``s`` ``(C,)`` such that ``ceil(h s)`` with ``h`` uniform in ``(0, 1)`` has the mean
    ``mean`` ``(C,)``, for means ``>= 1``: with ``k = floor(2 mean - 1)``, the steps
    ``1 .. k`` have probability ``1 / s`` each and ``k + 1`` the rest, which gives
    ``s = k + k (mean - (k + 1) / 2) / (k + 1 - mean)``."""
    xp = namespace(mean)
    k = xp.floor(2 * mean - 1)
    return k + k * (mean - 0.5 * (k + 1)) / (k + 1 - mean)


@dataclass(frozen=True)
class MAMS(HMC):
    """The Metropolis-adjusted microcanonical sampler (see :mod:`hmc.kernels.mams`).

    Parameters
    ----------
    trajectory_length : float, optional
        The mean trajectory length ``L`` where none was learnt (a run without warmup and
        without ``adapted_from``); by default ``sqrt(D)`` in the metric's whitened
        coordinates. Warmup learns ``L`` from the chains' autocorrelation time.
    max_steps : int
        Cap on the steps of a transition (default 1024).
    max_energy_error : float
        Energy error above which a transition is divergent (default 1000).

    Examples
    --------
    >>> dt = hmc.sample(log_prob, dim=10, kernel="mams")  # doctest: +SKIP
    """

    trajectory_length: float | None = None

    def __post_init__(self) -> None:
        if self.num_steps is not None:
            raise ValueError(
                "MAMS takes no num_steps: its steps are jittered around trajectory_length / "
                "step_size"
            )
        if self.trajectory_length is not None and not self.trajectory_length > 0:
            raise ValueError(f"trajectory_length must be positive, got {self.trajectory_length!r}")
        if not isinstance(self.max_steps, int) or self.max_steps < 1:
            raise ValueError(f"max_steps must be a positive integer, got {self.max_steps!r}")
        if not self.max_energy_error > 0:
            raise ValueError(f"max_energy_error must be positive, got {self.max_energy_error!r}")

    def init(self, state: State, first_transition: int = 0):
        """Kernel state for chains at ``state`` (see :meth:`hmc.HMC.init`); the isokinetic
        dynamics needs at least two dimensions (on a one-dimensional sphere the momentum
        cannot turn)."""
        if state.position.shape[1] < 2:
            raise ValueError(
                f"kernel MAMS needs a density of at least 2 dimensions, got "
                f"{state.position.shape[1]}: use kernel='nuts'"
            )
        return super().init(state, first_transition)

    def draws(
        self, keys: torch.Tensor, counter: torch.Tensor, dim: int, dtype: torch.dtype
    ) -> HMCDraws:
        """The random numbers of each chain's transitions number ``counter`` ``(C, ...)``:
        momentum noise, the Metropolis uniform and the Halton jitter of the steps."""
        return halton_draws(keys, counter, dim, dtype)

    def _num_steps(self, params: Params, u: torch.Tensor | None) -> torch.Tensor:
        """``(C,)`` steps ``ceil(h s)`` for the Halton jitter ``h`` ``(C,)``, whose mean
        is ``L / eps`` (at least 1; :func:`jitter_scale`), at most ``max_steps``."""
        step_size = params.step_size
        xp = namespace(step_size)
        length = params.trajectory_length
        if length is None:
            dim = params.metric.inverse.shape[1]
            length = self.trajectory_length if self.trajectory_length else math.sqrt(dim)
        mean = xp.nan_to_num(length / step_size, nan=1.0, posinf=self.max_steps)
        steps = xp.ceil(u * jitter_scale(mean.clip(1, self.max_steps)))
        return to_int64(steps.clip(1, self.max_steps))

    def _transition(
        self, state: State, params: Params, potential: Potential, draws: HMCDraws
    ) -> tuple[State, HMCInfo, Proposal | None]:
        """One MAMS transition of every chain with the given random numbers (arrays of the
        engine of ``state``; the metric's too): the compiled graph where the energy
        compiles it, else the same arithmetic eagerly."""
        compiled = self._compiled_transition(state, params, potential, draws)
        if compiled is not None:
            return compiled
        steps = self._num_steps(params, draws.steps)
        new_state, info, _, _ = self._isokinetic(
            potential.value_and_grad, state, draws.noise, draws.accept, params.step_size,
            steps, params.metric,
        )  # fmt: skip
        return new_state, info, None

    def _lockstep(
        self,
        energy: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
        position: torch.Tensor,
        potential_energy: torch.Tensor,
        grad: torch.Tensor,
        noise: torch.Tensor,
        accept: torch.Tensor,
        step_size: torch.Tensor,
        steps: torch.Tensor,
        *metric_fields: torch.Tensor,
    ) -> tuple[tuple, tuple, torch.Tensor, torch.Tensor]:
        """One transition of every chain in torch operations, the function the energy
        compiles (the arguments of :meth:`hmc.HMC._lockstep`). Returns the new state, the
        statistics, and the proposal's position and velocity before the test."""
        metric = metric_from_fields(*metric_fields)
        state = State(position, potential_energy, grad)
        new_state, info, end, velocity = self._isokinetic(
            energy, state, noise, accept, step_size, steps, metric
        )
        return tuple(new_state), tuple(info), end, velocity

    def _isokinetic(
        self,
        value_and_grad: Callable,
        state: State,
        noise,
        accept,
        step_size,
        steps,
        metric: Metric,
    ) -> tuple[State, HMCInfo, torch.Tensor, torch.Tensor]:
        """The transition of every chain (tensors or NumPy arrays): unit momenta from
        ``noise`` ``(C, D)``, ``steps`` ``(C,)`` isokinetic leapfrog steps of ``step_size``
        ``(C,)`` (:func:`hmc.integrators.lockstep`), the Metropolis test with the uniforms
        ``accept`` ``(C,)``. Returns the new state, the statistics, and the proposal's
        position and velocity ``S u``."""
        xp = namespace(noise)
        column = step_size[:, None]

        def step(position, potential_energy, grad, u, change):
            here = State(position, potential_energy, grad)
            moved = isokinetic_leapfrog(here, u, column, metric, value_and_grad)
            return (*moved.state, moved.momentum, change + moved.kinetic_change)

        carried = (*state, unit_momentum(noise), xp.zeros_like(state.potential))
        position, potential_energy, grad, u, change = lockstep(step, carried, steps)
        proposal = State(position, potential_energy, grad)
        end_energy = potential_energy + change
        new_state, info = self._metropolis(
            state, state.potential, proposal, end_energy, accept, steps
        )
        return new_state, info, position, from_whitened(metric, u)
