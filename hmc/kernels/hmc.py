"""Static HMC: a fixed or randomised number of leapfrog steps, then a Metropolis test.

``HMC(num_steps=L)`` takes exactly ``L`` steps per transition. Without ``num_steps`` each
transition of chain ``c`` takes ``n ~ Uniform{1, ..., ceil(T / eps_c)}`` steps, with ``T`` the
``trajectory_length`` (Stan's default, 2 pi). A fixed length resonates on well-adapted
Gaussian targets (a trajectory of exactly one period returns to its start); drawing the
number of steps per transition from the chain's own random stream breaks that, keeps
the kernel reversible, and gives a mean integration time of about ``T / 2``.

A transition is divergent when the energy error ``H(proposal) - H(start)`` exceeds
``max_energy_error`` or is not finite; such a proposal is rejected.

The arithmetic is written once and runs in the engine of the state it is given
(:mod:`hmc.arrays`): NumPy arrays on the CPU, tensors on an accelerator. The random
numbers are drawn as tensors, a block of transitions at a time, and read as NumPy arrays
by the NumPy engine, so both run the same transition from the same numbers.

When the energy compiles (:meth:`hmc.Potential.loop`) the whole transition, momentum,
every leapfrog step (:func:`hmc.integrators.leapfrog_lockstep`), the Metropolis test and
the statistics, is one compiled graph, from the same random numbers; the eager path above
stays the oracle it is checked against. In the graph every chain steps while the longest
trajectory goes on, and a chain whose trajectory has ended keeps its point: those extra
evaluations are counted, so a compiled run with numbers of steps that differ between
chains reports more gradient evaluations than the eager run of the same draws.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from hmc.arrays import as_arrays, namespace, to_float64, to_int64
from hmc.integrators import leapfrog, leapfrog_lockstep
from hmc.kernels.base import Params, Phase, Proposal, Step
from hmc.metric import Metric, metric_from_fields
from hmc.potential import Potential
from hmc.random import Stream, normal, uniform
from hmc.state import State, put_rows, take_rows, where_rows

__all__ = ["HMC", "HMCDraws", "HMCInfo", "HMCState"]


class HMCInfo(NamedTuple):
    """Per-transition statistics, ``(C,)`` each, under their ArviZ names."""

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


class HMCState(NamedTuple):
    """The chains' current ``state`` (arrays of the run's engine); ``transitions`` done by
    every chain, the position of their random numbers (a host integer: static HMC moves
    all chains in lockstep); the last statistics ``info``; ``busy`` ``(C,)``, the
    fraction of the last call's leapfrog steps in which each chain moved (its steps over
    the longest chain's); ``block``, the random numbers of the transitions
    ``transitions - transitions % B`` onwards, drawn ``B`` at a time; ``all_chains``, an
    all-True ``(C,)`` mask (the ``done`` of every call); ``metric_source`` and
    ``metric``, the last metric passed in and the same in the engine's arrays; ``readout``,
    empty (the driver needs nothing from the device for this kernel: every call
    completes a transition of every chain)."""

    state: State
    transitions: int
    info: HMCInfo | None
    busy: torch.Tensor
    block: HMCDraws | None
    all_chains: torch.Tensor
    metric_source: Metric | None = None
    metric: Metric | None = None
    readout: torch.Tensor | None = None

    @property
    def on_host(self) -> bool:
        """Whether the chains run in the NumPy engine."""
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
        Cap on the drawn number of steps (guards against tiny step sizes in early warmup),
        and the most ``num_steps`` may be.
    max_energy_error : float
        Energy error above which a transition is divergent (default 1000, as in Stan).

    Examples
    --------
    >>> dt = hmc.sample(log_prob, dim=2, kernel=hmc.HMC(num_steps=10))  # doctest: +SKIP
    """

    num_steps: int | None = None
    trajectory_length: float = 2 * math.pi
    max_steps: int = 1024
    max_energy_error: float = 1000.0

    stat_names = HMCInfo._fields
    spans_calls = False  # every call completes a transition of every chain
    #: whether each call's :class:`~hmc.kernels.base.Step` carries the trajectories
    #: (their start, end and final velocity), which an adaptation across chains may need
    reports_proposal = False
    #: whether every chain's trajectory of a transition integrates in one loop, which
    #: compiles whole with the energy (:meth:`hmc.Potential.loop`)
    compiled_loop = "transition"  # every chain's trajectory in one loop

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
        if self.num_steps is not None and self.num_steps > self.max_steps:
            raise ValueError(
                f"num_steps ({self.num_steps}) exceeds max_steps ({self.max_steps}): raise "
                "max_steps for trajectories that long (a transition is not interrupted "
                "midway, so Ctrl-C waits for it)"
            )
        if not self.max_energy_error > 0:
            raise ValueError(f"max_energy_error must be positive, got {self.max_energy_error!r}")

    def init(self, state: State, first_transition: int = 0) -> HMCState:
        """Kernel state for chains at ``state`` (tensors, or NumPy arrays for the NumPy
        engine), each to begin its transition number ``first_transition`` at the first
        call."""
        xp = namespace(state.position)
        ones = xp.ones_like(state.potential)
        readout = ones[:0].astype(np.int64) if xp is np else ones[:0].to(torch.int64)
        return HMCState(state, first_transition, None, ones, None, ones > 0, readout=readout)

    def step(
        self,
        kernel_state: HMCState,
        params: Params,
        potential: Potential,
        keys: torch.Tensor,
        phase: Phase,
    ) -> tuple[HMCState, Step]:
        """One transition of every chain (see :class:`hmc.kernels.base.Kernel`). The
        chains run in lockstep, so they all have the same number of transitions left:
        the driver stops calling when none is (``phase`` changes nothing here)."""
        chains, dim = kernel_state.state.position.shape
        dtype = params.metric[0].dtype
        block = kernel_state.block
        size = max(1, min(MAX_BLOCK, BLOCK_VALUES // (chains * (dim + 2))))
        slot = kernel_state.transitions % size
        on_numpy = kernel_state.on_host
        if block is None or slot == 0:  # the block of transitions this one belongs to
            first = torch.full((chains, 1), kernel_state.transitions - slot, device=keys.device)
            counters = first + torch.arange(size, device=keys.device)
            block = self.draws(keys, counters, dim, dtype)
            if on_numpy:
                block = as_arrays(block)
        draws = HMCDraws(*(None if x is None else x[:, slot] for x in block))
        source, metric = params.metric, kernel_state.metric
        if kernel_state.metric_source is not source:
            metric = as_arrays(source) if on_numpy else source
        new_state, info, proposal = self._transition(
            kernel_state.state, params._replace(metric=metric), potential, draws
        )
        busy = kernel_state.busy  # all ones for a fixed number of steps
        if self.num_steps is None:
            steps = to_float64(info.n_steps)
            busy = steps / steps.max()
        kernel_state = HMCState(
            new_state,
            kernel_state.transitions + 1,
            info,
            busy,
            block,
            kernel_state.all_chains,
            source,
            metric,
            kernel_state.readout,
        )
        step = Step(kernel_state.all_chains, new_state, info, busy, np.arange(chains), proposal)
        return kernel_state, step

    @staticmethod
    def with_readout(kernel_state: HMCState, values: list[int]) -> HMCState:
        """The kernel state as it is: static HMC reads nothing from the device."""
        return kernel_state

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
        self, params: Params, keys: torch.Tensor, counter: torch.Tensor
    ) -> torch.Tensor:
        """``(C,)`` leapfrog steps of each chain's transition number ``counter`` under
        ``params`` (its step sizes, and the trajectory lengths where the kernel uses them)."""
        u = self.draws(keys, counter, 1, params.step_size.dtype).steps
        return self._num_steps(params, u)

    def _num_steps(self, params: Params, u: torch.Tensor | None) -> torch.Tensor:
        """``(C,)`` leapfrog steps from the chains' step sizes and uniforms ``u`` ``(C,)``."""
        step_size = params.step_size
        xp = namespace(step_size)
        if u is None:
            return to_int64(xp.zeros_like(step_size)) + self.num_steps
        longest = xp.ceil(self.trajectory_length / step_size).clip(1, self.max_steps)
        return to_int64(1 + xp.floor(u * longest)).clip(1, self.max_steps)

    def transition(
        self,
        state: State,
        params: Params,
        potential: Potential,
        keys: torch.Tensor,
        counter: torch.Tensor,
    ) -> tuple[State, HMCInfo]:
        """One HMC transition of every chain, for loops written by hand.

        Parameters
        ----------
        state : current states, ``C`` chains (tensors, or NumPy arrays for the NumPy
            engine; the step sizes in the same kind of arrays, the metric tensors).
        params : step sizes ``(C,)`` and metric.
        potential : the energy module.
        keys, counter : ``(C,)`` chain keys and transition numbers (random streams).
        """
        position = state.position
        if isinstance(position, np.ndarray):
            dtype = torch.from_numpy(position[:0]).dtype
            draws = as_arrays(self.draws(keys, torch.as_tensor(counter), position.shape[1], dtype))
            params = params._replace(metric=as_arrays(params.metric))
        else:
            draws = self.draws(keys, counter, position.shape[1], position.dtype)
        return self._transition(state, params, potential, draws)[:2]

    def _transition(
        self, state: State, params: Params, potential: Potential, draws: HMCDraws
    ) -> tuple[State, HMCInfo, Proposal | None]:
        """One HMC transition of every chain with the given random numbers (arrays of the
        engine of ``state``; the metric's too), and its trajectories when the kernel
        reports them."""
        compiled = self._compiled_transition(state, params, potential, draws)
        if compiled is not None:
            return compiled
        metric = params.metric
        momentum = metric.momentum(draws.noise)
        start_energy = state.potential + metric.kinetic_energy(momentum)
        steps = self._num_steps(params, draws.steps)
        step_size = params.step_size[:, None]

        proposal, p = state, momentum
        if self.num_steps is not None:
            if isinstance(step_size, np.ndarray) and (step_size == step_size[0, 0]).all():
                step_size = float(step_size[0, 0])  # a number broadcasts faster than a column
            for _ in range(self.num_steps):
                proposal, p = leapfrog(proposal, p, step_size, metric, potential)
        else:
            proposal, p = _integrate_ragged(proposal, p, step_size, params, potential, steps)
        trajectory = None
        if self.reports_proposal:
            time = steps * params.step_size
            trajectory = Proposal(state.position, proposal.position, metric.velocity(p), time)
        end_energy = proposal.potential + metric.kinetic_energy(p)
        new_state, info = self._metropolis(
            state, start_energy, proposal, end_energy, draws.accept, steps
        )
        return new_state, info, trajectory

    def _compiled_transition(
        self, state: State, params: Params, potential: Potential, draws: HMCDraws
    ) -> tuple[State, HMCInfo, Proposal | None] | None:
        """:meth:`_transition` through the energy's compiled loop, or None where the
        energy does not compile it (the eager path then runs)."""
        if not potential.compiles_loops:  # nothing computed, nothing read from the device
            return None
        steps = self._num_steps(params, draws.steps)
        on_numpy = isinstance(steps, np.ndarray)
        longest = int(steps.max())
        tensors = tuple(
            torch.as_tensor(x)
            for x in (*state, draws.noise, draws.accept, params.step_size, steps, *params.metric)
        )
        key = (self, type(params.metric))
        result = potential.loop(key, self._lockstep, _one_step, tensors, steps.shape[0] * longest)
        if result is None:
            return None
        new_state, info, end, velocity = result
        outputs = (State(*new_state), HMCInfo(*info), end, velocity)
        if on_numpy:
            outputs = tuple(map(as_arrays, outputs))
        new_state, info, end, velocity = outputs
        trajectory = None
        if self.reports_proposal:
            time = steps * params.step_size
            trajectory = Proposal(state.position, end, velocity, time)
        return new_state, info, trajectory

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
        compiles: the state ``(C, D)``, ``(C,)``, ``(C, D)``, the random numbers, the step
        sizes ``(C,)``, the steps ``(C,)`` int64 and the metric's fields (diagonal
        ``(C, D)``, dense ``(C, D, D)``, or the low-rank metric's three). Returns the new
        state, the statistics, and the proposal's position and velocity before the test,
        as plain tuples."""
        metric = metric_from_fields(*metric_fields)
        state = State(position, potential_energy, grad)
        momentum = metric.momentum(noise)
        start_energy = potential_energy + metric.kinetic_energy(momentum)
        proposal, p = leapfrog_lockstep(state, momentum, step_size[:, None], metric, energy, steps)
        end_energy = proposal.potential + metric.kinetic_energy(p)
        new_state, info = self._metropolis(state, start_energy, proposal, end_energy, accept, steps)
        return tuple(new_state), tuple(info), proposal.position, metric.velocity(p)

    def _metropolis[A: (torch.Tensor, np.ndarray)](
        self,
        state: State,
        start_energy: A,
        proposal: State,
        energy: A,
        u: A,
        steps: A,
    ) -> tuple[State, HMCInfo]:
        """The Metropolis test of every chain's ``proposal`` with total energy ``energy``
        ``(C,)`` against its ``state`` with ``start_energy`` ``(C,)``, with uniforms ``u``
        ``(C,)``. An energy error that is not finite counts as ``+inf``: a rejection and a
        divergence."""
        xp = namespace(u)
        error = energy - start_energy
        error = xp.where(xp.isfinite(error), error, math.inf)
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


def _one_step(tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The arguments of :meth:`HMC._lockstep` with one leapfrog step for every chain: the
    transition the compiled graph is first checked on (no rounding amplified by a long
    trajectory)."""
    steps = tensors[_STEPS]
    return (*tensors[:_STEPS], torch.ones_like(steps), *tensors[_STEPS + 1 :])


#: the position of the steps among :meth:`HMC._lockstep`'s tensors
_STEPS = 7


def _integrate_ragged(
    state: State,
    momentum: torch.Tensor,
    step_size: torch.Tensor,
    params: Params,
    potential: Potential,
    steps: torch.Tensor,
) -> tuple[State, torch.Tensor]:
    """Chain ``c`` takes ``steps[c]`` leapfrog steps; only moving chains are evaluated."""
    # counts[i] = number of chains taking at least i steps, from one read of the steps
    host_steps = np.asarray(steps) if isinstance(steps, np.ndarray) else steps.numpy(force=True)
    counts = np.bincount(host_steps, minlength=1)[::-1].cumsum()[::-1].tolist()
    if isinstance(steps, np.ndarray):
        order = np.argsort(-steps, kind="stable")
    else:  # sorted on the device: a copy of the order from the host would wait for it
        order = torch.argsort(steps, descending=True, stable=True)
    p_all = momentum
    chains = host_steps.shape[0]
    for i in range(1, len(counts)):
        if counts[i] == chains:
            state, p_all = leapfrog(state, p_all, step_size, params.metric, potential)
            continue
        rows = order[: counts[i]]
        sub_state, sub_p = leapfrog(
            take_rows(state, rows),
            p_all[rows],
            step_size[rows],
            take_rows(params.metric, rows),
            potential,
        )
        state, p_all = put_rows((state, p_all), rows, (sub_state, sub_p))
    return state, p_all
