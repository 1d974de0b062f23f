"""What every kernel shares: its parameters and the way the driver advances it.

A kernel is a set of settings with plain methods over explicit state. The driver calls
``kernel.init(state)`` once and then ``kernel.advance(...)`` repeatedly; each call returns
which chains completed a transition, their new states and their transition statistics.
Static HMC completes one transition for every running chain per call; NUTS advances every
running chain by one leapfrog step per call, so chains never wait for each other.
No adaptation happens inside a kernel: the driver changes ``Params`` between calls.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from hmc.metric import Metric
from hmc.potential import Potential
from hmc.state import State

__all__ = ["Kernel", "Params"]


class Params(NamedTuple):
    """Per-chain kernel parameters: ``step_size`` ``(C,)`` and the metric."""

    step_size: torch.Tensor
    metric: Metric


class Kernel(Protocol):
    """The interface the driver uses (see :class:`hmc.HMC` and :class:`hmc.NUTS`)."""

    #: names of the per-transition statistics the kernel reports (ArviZ names)
    stat_names: tuple[str, ...]

    def init(self, state: State, num_transitions: int | None = None) -> NamedTuple:
        """Kernel state for chains at ``state``, each to run ``num_transitions``."""
        ...

    def advance(
        self,
        kernel_state: NamedTuple,
        params: Params,
        potential: Potential,
        keys: torch.Tensor,
        sampling: torch.Tensor,
    ) -> tuple[NamedTuple, torch.Tensor]:
        """Advance every chain that has transitions left.

        ``sampling`` ``(C,)`` is True for chains past their warmup. Returns the new kernel
        state and ``done`` ``(C,)``, the chains that completed a transition in this call.
        A kernel that needs flags from the device between calls keeps them in a ``flags``
        tensor field of its state; the driver reads them together with its own counters
        (one host read per call) and hands them back through ``with_host_flags``. A kernel
        with a true ``synchronous`` attribute promises that every call completes one
        transition of every chain with transitions left (as static HMC does), and the
        driver then keeps its counters on the host. A kernel whose state knows on the host
        which chains finished (NUTS with its trees on the host) exposes them as a list
        ``host_done`` and the number of chains that moved as ``host_busy``; the driver then
        reads nothing from the device. Such a kernel, and a synchronous one whose state has
        a true ``on_host`` attribute, keeps its chains in NumPy on the CPU: the driver
        passes ``sampling`` and the step sizes as NumPy arrays and takes ``done`` and the
        report's states and statistics as NumPy arrays.
        """
        ...

    def report(self, kernel_state: NamedTuple) -> tuple[State, NamedTuple]:
        """The new states and statistics of the chains reported ``done`` by the last
        :meth:`advance` (other rows are unspecified)."""
        ...
