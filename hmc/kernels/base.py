"""What every kernel shares: its parameters, the record one call returns, and the calls
the driver makes.

A kernel is a set of settings with plain functions over explicit state. The driver calls
``kernel.init(state)`` (again after each checkpoint) and then ``kernel.step(...)``
repeatedly, telling each call in a :class:`Phase` which chains are past their warmup and
how many transitions each has left (the run's counts live in the driver); each call
returns the new kernel state and a :class:`Step`: which chains completed a transition,
their new states and their transition statistics, and how much leapfrog work each chain
did. Static HMC completes one transition of every running chain per call; NUTS advances
every running chain by one leapfrog step per call, so chains never wait for each other.
No adaptation happens inside a kernel: the driver changes :class:`~hmc.state.Params`
between calls. Each kernel also has a plain ``transition`` call, in which every chain
completes one transition, for loops written by hand.

The arrays are those of the run's engine (:mod:`hmc.arrays`). With the torch engine a
kernel may need a few numbers from the device before its next call (whether any chain
starts a transition, say): it keeps them in its state's ``readout`` ``(K,)`` int64 tensor
(``K`` may be 0); the driver reads them together with its own counters, one host read per
call, and hands them back through ``with_readout``.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np
import torch

from hmc.potential import Potential
from hmc.state import Params, Proposal, State

__all__ = ["Kernel", "Params", "Phase", "Proposal", "Step"]


class Phase(NamedTuple):
    """What the driver tells a kernel call about each chain, ``(C,)`` arrays of the run's
    engine.

    sampling : bool, the chain is past its warmup (a transition it begins now uses the
        sampling settings, such as NUTS's sampling depth cap).
    left : int, the transitions the chain has still to run, the one in flight included;
        a chain with none left begins none.
    """

    sampling: torch.Tensor
    left: torch.Tensor


class Step(NamedTuple):
    """What one kernel call did.

    done : ``(C,)`` bool, the chains whose transition ended in this call.
    state, info : their new states and transition statistics (ArviZ names), valid in the
        rows of ``done``; None when no chain finished and the kernel knows it.
    work : ``(C,)`` the fraction of this call's leapfrog steps in which each chain moved.
    finished : the indices of the chains in ``done`` as a NumPy array, when the kernel
        knows them on the host (the NumPy engine; static HMC, whose every call completes a
        transition of every chain); None when only the device knows (the driver then reads
        its counters from the device).
    proposal : the trajectories of this call's transitions, from kernels whose adaptation
        needs them (:class:`hmc.ChEES`); None otherwise.
    """

    done: torch.Tensor
    state: State | None
    info: NamedTuple | None
    work: torch.Tensor
    finished: np.ndarray | None
    proposal: Proposal | None = None


class Kernel(Protocol):
    """The interface the driver uses (see :class:`hmc.HMC` and :class:`hmc.NUTS`)."""

    #: names of the per-transition statistics the kernel reports (ArviZ names)
    stat_names: tuple[str, ...]
    #: whether a transition can outlast a call (NUTS): the driver then starts the kernel
    #: afresh (``init``) whenever the chains' transitions left change at a stop
    spans_calls: bool
    #: what the kernel compiles whole with the energy when it compiles
    #: (:meth:`hmc.Potential.loop`): ``"transition"``, every chain's trajectory of a
    #: transition in one loop; ``"trees"``, every chain's NUTS tree; None, nothing (the
    #: energy compiles alone)
    compiled_loop: str | None

    def init(self, state: State, first_transition: int = 0) -> NamedTuple:
        """Kernel state for chains at ``state`` (its arrays pick the engine), each to begin
        its transition number ``first_transition`` at the first call."""
        ...

    def step(
        self,
        kernel_state: NamedTuple,
        params: Params,
        potential: Potential,
        keys: torch.Tensor,
        phase: Phase,
    ) -> tuple[NamedTuple, Step]:
        """Advance every chain that has transitions left (``phase``)."""
        ...

    def with_readout(self, kernel_state: NamedTuple, values: list[int]) -> NamedTuple:
        """The kernel state with its ``readout`` as read by the driver."""
        ...
