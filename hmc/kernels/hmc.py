"""Static HMC: a fixed or randomised number of leapfrog steps, then a Metropolis test.

``HMC(num_steps=L)`` takes exactly ``L`` steps per transition. Without ``num_steps`` each
transition of chain ``c`` takes ``n ~ Uniform{1, ..., ceil(T / eps_c)}`` steps, with ``T`` the
``trajectory_length`` (Stan's default, 2 pi). A fixed length resonates on well-adapted
Gaussian targets (a trajectory of exactly one period returns to its start); drawing the
number of steps per transition from the chain's own random stream breaks that, keeps
the kernel reversible, and gives a mean integration time of about ``T / 2``.

A transition is divergent when the energy error ``H(proposal) - H(start)`` exceeds
``max_energy_error`` or is not finite; such a proposal is rejected.

Where the arithmetic runs (``bookkeeping``). A transition is a few tensor operations per
leapfrog step (kicks, drift, velocity) and about thirty per transition (momenta, kinetic
energies, the Metropolis test, row-wise selects). On an accelerator or for many chains
they are cheap; on a CPU each costs 2-5 microseconds of dispatch whatever its size, which
at a few chains on a cheap target is a third of the run. ``bookkeeping="host"`` keeps the
chains' positions, momenta and energies in NumPy arrays (sub-microsecond operations) and
calls the energy module through :meth:`hmc.Potential.value_and_grad_numpy`. Its random
numbers are the same (drawn as tensors, a block of transitions at a time, and read as
NumPy arrays), so the two run the same transition from the same numbers. NumPy rounds the
kicks differently (no fused multiply-add), so their draws agree to rounding, not bit for
bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from hmc.integrators import leapfrog, leapfrog_numpy
from hmc.kernels.base import BOOKKEEPING, Params
from hmc.metric import Metric, to_numpy
from hmc.potential import Potential
from hmc.random import Stream, normal, uniform
from hmc.state import State, array_module, put_rows, take_rows, where_rows

__all__ = ["HMC", "HMCDraws", "HMCInfo", "HMCState"]


class HMCInfo(NamedTuple):
    """Per-transition statistics, ``(C,)`` each, under their ArviZ names (NumPy arrays
    inside the host bookkeeping, tensors everywhere else)."""

    acceptance_rate: torch.Tensor
    n_steps: torch.Tensor
    diverging: torch.Tensor
    energy: torch.Tensor
    energy_error: torch.Tensor
    max_energy_error: torch.Tensor


class HMCDraws(NamedTuple):
    """The random numbers of transitions: momentum noise ``(C, ..., D)``, the uniform of
    the Metropolis test ``(C, ...)`` and the uniform that sets the number of steps
    ``(C, ...)`` (None for a fixed number). A block of transitions has an axis after the
    chain axis."""

    noise: torch.Tensor
    accept: torch.Tensor
    steps: torch.Tensor | None


class HostParams(NamedTuple):
    """Kernel parameters as the host bookkeeping uses them: made from ``source``, with the
    metric's fields as NumPy arrays and the step sizes as one float when every chain
    shares it (a scalar broadcasts faster than a ``(C, 1)`` array) or ``(C, 1)``."""

    source: Params
    metric: Metric
    step_size: float | np.ndarray


class HMCState(NamedTuple):
    """The chains' current states; ``transitions`` done by every chain and its ``limit``
    (host integers: static HMC moves all chains in lockstep); the last statistics;
    ``busy`` ``(C,)``, the fraction of the last call's leapfrog steps in which each chain
    moved (its steps over the longest chain's); ``block``, the random numbers of the
    transitions ``transitions - transitions % B`` onwards, drawn ``B`` at a time;
    ``everyone``, an all-True ``(C,)`` mask (the ``done`` of every call); and
    ``host_params``, the last parameters the host bookkeeping converted. With the host
    bookkeeping, ``state``, ``info``, ``busy``, ``block`` and ``everyone`` hold NumPy
    arrays."""

    state: State
    transitions: int
    limit: int
    info: HMCInfo | None
    busy: torch.Tensor | np.ndarray
    block: HMCDraws | None
    everyone: torch.Tensor | np.ndarray
    host_params: HostParams | None

    @property
    def on_host(self) -> bool:
        """Whether the host bookkeeping runs these chains."""
        return isinstance(self.state.position, np.ndarray)


#: Random numbers of a block of transitions take at most this many values (C x B x D).
BLOCK_VALUES = 1 << 22
MAX_BLOCK = 64


@dataclass(frozen=True)
class HMC:
    """Static Hamiltonian Monte Carlo.

    Parameters
    ----------
    num_steps : int, optional
        Leapfrog steps per transition. Without it, the number of steps is drawn per
        transition and chain, uniformly in ``1 .. ceil(trajectory_length / step_size)``.
    trajectory_length : float
        The longest integration time when ``num_steps`` is not given (default 2 pi).
    max_steps : int
        Cap on the drawn number of steps (guards against tiny step sizes in early warmup).
    max_energy_error : float
        Energy error above which a transition is divergent (default 1000, as in Stan).
    bookkeeping : "auto", "host" or "tensor"
        Where the arithmetic between energy calls runs: ``"tensor"`` in batched tensors
        (any device), ``"host"`` in NumPy arrays (CPU only; at one chain on a cheap target
        about a fifth less time per leapfrog step, see the module's notes). ``"auto"``
        picks ``"host"`` for CPU chains and ``"tensor"`` on other devices.

    Examples
    --------
    >>> dt = hmc.sample(log_prob, dim=2, kernel=hmc.HMC(num_steps=10))  # doctest: +SKIP
    """

    num_steps: int | None = None
    trajectory_length: float = 2 * math.pi
    max_steps: int = 1024
    max_energy_error: float = 1000.0
    bookkeeping: str = "auto"

    stat_names = HMCInfo._fields
    #: every call completes one transition of every chain with transitions left
    synchronous = True

    def __post_init__(self) -> None:
        if self.num_steps is not None and (
            not isinstance(self.num_steps, int)
            or isinstance(self.num_steps, bool)
            or self.num_steps < 1
        ):
            raise ValueError(f"num_steps must be a positive integer, got {self.num_steps!r}")
        if not self.trajectory_length > 0:
            raise ValueError(f"trajectory_length must be positive, got {self.trajectory_length!r}")
        if not isinstance(self.max_steps, int) or self.max_steps < 1:
            raise ValueError(f"max_steps must be a positive integer, got {self.max_steps!r}")
        if not self.max_energy_error > 0:
            raise ValueError(f"max_energy_error must be positive, got {self.max_energy_error!r}")
        if self.bookkeeping not in BOOKKEEPING:
            raise ValueError(f"bookkeeping must be one of {BOOKKEEPING}, got {self.bookkeeping!r}")

    def init(self, state: State, num_transitions: int | None = None) -> HMCState:
        """Kernel state for chains at ``state``, each to run ``num_transitions``."""
        device = state.position.device
        chains = state.position.shape[0]
        limit = num_transitions if num_transitions is not None else 2**62
        everyone = torch.ones(chains, dtype=torch.bool, device=device)
        on_host = self.bookkeeping == "host" or (
            self.bookkeeping == "auto" and device.type == "cpu"
        )
        if not on_host:
            return HMCState(state, 0, limit, None, everyone.double(), None, everyone, None)
        if device.type != "cpu":
            raise ValueError(
                "HMC(bookkeeping='host') runs the transitions in NumPy and needs CPU "
                f"tensors, got device {device}; use bookkeeping='tensor'"
            )
        host_state = State(*(x.detach().numpy() for x in state))
        everyone = np.ones(chains, dtype=bool)
        return HMCState(host_state, 0, limit, None, np.ones(chains), None, everyone, None)

    def advance(
        self,
        kernel_state: HMCState,
        params: Params,
        potential: Potential,
        keys: torch.Tensor,
        sampling: torch.Tensor,
    ) -> tuple[HMCState, torch.Tensor]:
        """One transition of every chain, if they have transitions left (see
        :class:`hmc.kernels.base.Kernel`); chains run in lockstep, so ``done`` is all or
        nothing. With the host bookkeeping ``done`` is a NumPy array, and the step sizes
        may be one."""
        ks = kernel_state
        if ks.transitions >= ks.limit:
            return ks._replace(busy=ks.busy * 0), ~ks.everyone
        chains, dim = ks.state.position.shape
        device, dtype = keys.device, params.metric.inverse.dtype
        block = ks.block
        size = max(1, min(MAX_BLOCK, BLOCK_VALUES // (chains * (dim + 2))))
        slot = ks.transitions % size
        on_host = ks.on_host
        if block is None or slot == 0:
            first = torch.full((chains, 1), ks.transitions, device=device)
            counters = first + torch.arange(size, device=device)
            block = self.draws(keys, counters, dim, dtype)
            if on_host:
                block = HMCDraws(*(None if x is None else x.numpy() for x in block))
        draws = HMCDraws(*(None if x is None else x[:, slot] for x in block))
        host_params = ks.host_params
        if not on_host:
            new_state, info = self._transition(ks.state, params, potential, draws)
        else:
            if host_params is None or host_params.source is not params:
                host_params = _host_params(params)
            new_state, info = self._host_transition(ks.state, host_params, potential, draws)
        busy = ks.busy  # all ones for a fixed number of steps
        if self.num_steps is None:
            steps = info.n_steps
            steps = steps.astype(np.float64) if on_host else steps.to(torch.float64)
            busy = steps / steps.max()
        return HMCState(
            new_state, ks.transitions + 1, ks.limit, info, busy, block, ks.everyone, host_params
        ), ks.everyone

    @staticmethod
    def report(kernel_state: HMCState) -> tuple[State, HMCInfo]:
        """The states and statistics of the last transitions: tensors, or NumPy arrays
        with the host bookkeeping."""
        assert kernel_state.info is not None, "report() comes after advance()"
        return kernel_state.state, kernel_state.info

    def draws(
        self, keys: torch.Tensor, counter: torch.Tensor, dim: int, dtype: torch.dtype
    ) -> HMCDraws:
        """The random numbers of each chain's transitions number ``counter`` ``(C, ...)``."""
        return HMCDraws(
            noise=normal(keys, Stream.MOMENTUM, counter, dim, dtype),
            accept=uniform(keys, Stream.ACCEPT, counter, 1, dtype)[..., 0],
            steps=None
            if self.num_steps is not None
            else uniform(keys, Stream.STEPS, counter, 1, dtype)[..., 0],
        )

    def num_steps_for(
        self, step_size: torch.Tensor, keys: torch.Tensor, counter: torch.Tensor
    ) -> torch.Tensor:
        """``(C,)`` leapfrog steps of each chain's transition number ``counter``."""
        u = self.draws(keys, counter, 1, step_size.dtype).steps
        return self._num_steps(step_size, u)

    def _num_steps(self, step_size: torch.Tensor, u: torch.Tensor | None) -> torch.Tensor:
        """``(C,)`` leapfrog steps from the chains' step sizes and uniforms ``u`` ``(C,)``."""
        if u is None:
            return torch.full(step_size.shape, self.num_steps, device=step_size.device)
        longest = torch.ceil(self.trajectory_length / step_size).clamp(1, self.max_steps)
        return (1 + torch.floor(u * longest)).to(torch.int64).clamp(1, self.max_steps)

    def transition(
        self,
        state: State,
        params: Params,
        potential: Potential,
        keys: torch.Tensor,
        counter: torch.Tensor,
    ) -> tuple[State, HMCInfo]:
        """One HMC transition of every chain.

        Parameters
        ----------
        state : current states, ``C`` chains.
        params : step sizes ``(C,)`` and metric.
        potential : the energy module.
        keys, counter : ``(C,)`` chain keys and transition numbers (random streams).
        """
        draws = self.draws(keys, counter, state.position.shape[1], state.position.dtype)
        return self._transition(state, params, potential, draws)

    def _transition(
        self, state: State, params: Params, potential: Potential, draws: HMCDraws
    ) -> tuple[State, HMCInfo]:
        """One HMC transition of every chain with the given random numbers."""
        metric = params.metric
        momentum = metric.momentum(draws.noise)
        start_energy = state.potential + metric.kinetic_energy(momentum)
        steps = self._num_steps(params.step_size, draws.steps)
        step_size = params.step_size.unsqueeze(-1)

        proposal, p = state, momentum
        if self.num_steps is not None:
            for _ in range(self.num_steps):
                proposal, p = leapfrog(proposal, p, step_size, metric, potential)
        else:
            proposal, p = _integrate_ragged(proposal, p, step_size, params, potential, steps)
        return self._metropolis(state, start_energy, proposal, p, metric, draws.accept, steps)

    def _host_transition(
        self, state: State, params: HostParams, potential: Potential, draws: HMCDraws
    ) -> tuple[State, HMCInfo]:
        """:meth:`_transition` on NumPy states and random numbers; returns NumPy arrays."""
        metric, step_size = params.metric, params.step_size
        momentum = metric.momentum(draws.noise)
        start_energy = state.potential + metric.kinetic_energy(momentum)
        q, U, g, p = *state, momentum
        if self.num_steps is not None:
            steps = np.full(state.potential.shape, self.num_steps)
            for _ in range(self.num_steps):
                q, U, g, p = leapfrog_numpy(q, g, p, step_size, metric, potential)
        else:
            u = torch.from_numpy(draws.steps)
            steps = self._num_steps(torch.as_tensor(params.source.step_size), u).numpy()
            q, U, g, p = _integrate_ragged_numpy(q, U, g, p, step_size, metric, potential, steps)
        return self._metropolis(state, start_energy, State(q, U, g), p, metric, draws.accept, steps)

    def _metropolis[A: (torch.Tensor, np.ndarray)](
        self,
        state: State,
        start_energy: A,
        proposal: State,
        p: A,
        metric: Metric,
        u: A,
        steps: A,
    ) -> tuple[State, HMCInfo]:
        """The Metropolis test of every chain's ``proposal`` with momentum ``p`` against
        its ``state`` with ``start_energy``, with uniforms ``u`` ``(C,)``; tensors or
        NumPy arrays throughout."""
        xp = array_module(u)
        energy = proposal.potential + metric.kinetic_energy(p)
        error = energy - start_energy
        error = xp.where(error == error, error, math.inf)  # NaN counts as +inf
        diverging = ~(error <= self.max_energy_error)
        accept_prob = xp.exp((-error).clip(max=0.0))
        accepted = u < accept_prob
        new_state = where_rows(accepted, proposal, state)
        info = HMCInfo(
            acceptance_rate=accept_prob,
            n_steps=steps,
            diverging=diverging,
            energy=xp.where(accepted, energy, start_energy),
            energy_error=xp.where(accepted, error, 0.0),
            max_energy_error=abs(error),
        )
        return new_state, info


def _integrate_ragged(
    state: State,
    momentum: torch.Tensor,
    step_size: torch.Tensor,
    params: Params,
    potential: Potential,
    steps: torch.Tensor,
) -> tuple[State, torch.Tensor]:
    """Chain ``c`` takes ``steps[c]`` leapfrog steps; only moving chains are evaluated."""
    order = torch.argsort(steps, descending=True, stable=True)
    # counts[i] = number of chains taking at least i steps, from one read of the steps
    # (torch.bincount on a device reads its maximum first, then its result)
    counts = np.bincount(steps.numpy(force=True), minlength=1)[::-1].cumsum()[::-1].tolist()
    p_all = momentum
    chains = steps.shape[0]
    for i in range(1, len(counts)):
        if counts[i] == chains:
            state, p_all = leapfrog(state, p_all, step_size, params.metric, potential)
            continue
        rows = order[: counts[i]]
        sub_state, sub_p = leapfrog(
            take_rows(state, rows),
            p_all.index_select(0, rows),
            step_size.index_select(0, rows),
            take_rows(params.metric, rows),
            potential,
        )
        state = put_rows(state, rows, sub_state)
        p_all = p_all.index_copy(0, rows, sub_p)
    return state, p_all


def _host_params(params: Params) -> HostParams:
    """``params`` for the host bookkeeping (CPU tensors, or NumPy step sizes)."""
    step_size = np.asarray(params.step_size)
    shared = bool((step_size == step_size[0]).all())
    return HostParams(
        params, to_numpy(params.metric), float(step_size[0]) if shared else step_size[:, None]
    )


def _integrate_ragged_numpy(
    q: np.ndarray,
    U: np.ndarray,
    g: np.ndarray,
    p: np.ndarray,
    step_size: float | np.ndarray,
    metric: Metric,
    potential: Potential,
    steps: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_integrate_ragged` on NumPy arrays: chain ``c`` takes ``steps[c]`` steps;
    ``step_size`` is a float or ``(C, 1)``."""
    for i in range(1, int(steps.max()) + 1):
        moving = np.flatnonzero(steps >= i)
        if moving.size == steps.size:  # always the first step: the arrays are then fresh
            q, U, g, p = leapfrog_numpy(q, g, p, step_size, metric, potential)
            continue
        rows = leapfrog_numpy(
            q[moving],
            g[moving],
            p[moving],
            step_size if isinstance(step_size, float) else step_size[moving],
            take_rows(metric, moving),
            potential,
        )
        for array, new in zip((q, U, g, p), rows, strict=True):
            array[moving] = new
    return q, U, g, p
