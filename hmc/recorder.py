"""The recorder: buffers for the draws and their statistics, written per chain at its own
iteration.

The buffers are arrays of the run's engine (:mod:`hmc.arrays`: NumPy on the CPU, tensors
on the chains' device). Each has one spare column past the kept iterations: a write sends
every chain, those with nothing to record to the spare column, so a write is one scatter
per buffer and never asks the device which chains finished.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from hmc.arrays import namespace, zeros
from hmc.state import State

__all__ = ["Recorder"]


class Recorder:
    """Draws ``(C, kept, D)`` and statistics ``(C, kept)`` of ``C`` chains.

    Parameters
    ----------
    chains, warmup, draws, dim : the run's sizes.
    save_warmup : keep the warmup iterations too (else only the ``draws`` are kept).
    like : an array of the run's engine, dtype and device (the initial positions).
    """

    def __init__(
        self,
        chains: int,
        warmup: int,
        draws: int,
        dim: int,
        save_warmup: bool,
        like: torch.Tensor | np.ndarray,
    ) -> None:
        self.offset = 0 if save_warmup else warmup
        self.kept = warmup + draws - self.offset
        self.width = width = self.kept + 1  # the spare column
        self.rows = namespace(like).arange(chains)
        if isinstance(self.rows, torch.Tensor):
            self.rows = self.rows.to(like.device)
        self.positions = zeros(like, (chains, width, dim))
        self.buffers: dict[str, torch.Tensor | np.ndarray] = {}
        #: divergent transitions recorded so far: an int, or a tensor on the device (no
        #: device read per write)
        self.divergences: int | torch.Tensor = 0

    def write(
        self,
        done: torch.Tensor,
        iteration: torch.Tensor,
        state: State,
        info: NamedTuple,
        step_size: torch.Tensor,
        common_iteration: int | None = None,
    ) -> None:
        """Record the chains ``done`` ``(C,)`` at their ``iteration`` ``(C,)``: their
        ``state``, the transition statistics ``info`` and the ``step_size`` ``(C,)`` they
        ran with (rows of other chains are ignored). ``common_iteration``, when the caller
        knows that every chain finished at that one iteration (static HMC), lets the write
        be a column of each buffer."""
        values = {"lp": -state.potential, "step_size": step_size, **info._asdict()}
        if common_iteration is not None:
            slot = common_iteration - self.offset
            if 0 <= slot < self.kept:
                self.positions[:, slot] = state.position
                for name, value in values.items():
                    self._buffer(name, value)[:, slot] = value
                self.divergences = self.divergences + info.diverging.sum()
            return
        xp = namespace(done)
        slot = iteration - self.offset
        keep = done & (slot >= 0) & (slot < self.kept)
        slot = xp.where(keep, slot, self.kept)  # the others write the spare column
        rows = self.rows
        self.positions[rows, slot] = state.position
        for name, value in values.items():
            self._buffer(name, value)[rows, slot] = value
        self.divergences = self.divergences + (info.diverging & keep).sum()

    def restore(
        self, positions: torch.Tensor, stats: dict[str, torch.Tensor], divergences: int
    ) -> None:
        """Take the buffers and the divergence count of a checkpoint (CPU tensors of this
        recorder's shapes) in place of its own."""
        like = self.positions

        def convert(x: torch.Tensor) -> torch.Tensor | np.ndarray:
            return x.numpy() if isinstance(like, np.ndarray) else x.to(like.device)

        self.positions = convert(positions)
        self.buffers = {name: convert(x) for name, x in stats.items()}
        self.divergences = divergences

    def _buffer(self, name: str, like: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
        """The buffer of statistic ``name``, made on first use with the dtype of ``like``."""
        buffer = self.buffers.get(name)
        if buffer is None:
            buffer = self.buffers[name] = zeros(like, (self.rows.shape[0], self.width))
        return buffer

    def draws(self, window: slice) -> np.ndarray:
        """The positions of the kept iterations ``window`` ``(C, W, D)``, as NumPy."""
        return _numpy(self.positions[:, window])

    def stats(self, window: slice) -> dict[str, np.ndarray]:
        """Every statistic of the kept iterations ``window``, ``(C, W)`` NumPy each."""
        return {name: _numpy(buffer[:, window]) for name, buffer in self.buffers.items()}


def _numpy(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else x.numpy(force=True)
