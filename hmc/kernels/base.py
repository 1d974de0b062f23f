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

    def init(self, state: State) -> NamedTuple:
        """Kernel state (in-flight work, per-chain counters) for chains at ``state``."""
        ...

    def advance(
        self,
        kernel_state: NamedTuple,
        params: Params,
        potential: Potential,
        keys: torch.Tensor,
        running: torch.Tensor,
        phase: int,
    ) -> tuple[NamedTuple, torch.Tensor, State, NamedTuple]:
        """Advance the chains where ``running`` ``(C,)`` is True.

        ``phase`` is 0 during warmup and 1 while sampling. Returns the new kernel state,
        ``done`` ``(C,)`` (chains that completed a transition in this call), the states
        they moved to and their statistics (rows where ``done`` is False are unspecified).
        """
        ...
