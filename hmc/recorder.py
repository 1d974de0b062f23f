"""The recorder: buffers for the draws and their statistics, written per chain at its own
iteration.

The buffers are arrays of the run's engine (:mod:`hmc.arrays`: NumPy on the CPU, tensors
on the chains' device). Each has one spare column past the kept iterations it holds: a
write sends every chain, those with nothing to record to the spare column, so a write is
one scatter per buffer and never asks the device which chains finished.

Without a store the buffers hold every kept iteration. With one (:mod:`hmc.store`: host
memory for the draws of a run on an accelerator, or a netCDF file) they hold a chunk of
``chunk`` iterations: the loop stops every chain at each chunk's end (:meth:`Recorder.ends`)
and :meth:`Recorder.flush` moves the chunk to the store, so the device holds one chunk
and, with a file, memory holds one chunk whatever the length of the run.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np
import torch

from hmc.arrays import namespace, zeros
from hmc.state import State

__all__ = ["Recorder", "Store"]


class Store(Protocol):
    """Where a streaming recorder sends its complete chunks."""

    def append(self, first: int, positions: np.ndarray, stats: dict[str, np.ndarray]) -> None:
        """Take the kept iterations ``first, first + n`` of every chain: ``positions``
        ``(C, n, D)`` and each statistic ``(C, n)``."""
        ...

    def held(self) -> tuple[np.ndarray, dict[str, np.ndarray]] | None:
        """What a checkpoint must hold of the draws so far (None: the store keeps them)."""
        ...

    def restore(
        self, positions: np.ndarray, stats: dict[str, np.ndarray], iteration: int
    ) -> dict[str, np.ndarray]:
        """Go back to a checkpoint written at ``iteration`` with :meth:`held`'s arrays;
        return each statistic's per-chain sums so far."""
        ...


class Recorder:
    """Draws ``(C, kept, D)`` and statistics ``(C, kept)`` of ``C`` chains.

    Parameters
    ----------
    chains, warmup, draws, dim : the run's sizes.
    save_warmup : keep the warmup iterations too (else only the ``draws`` are kept).
    like : an array of the run's engine, dtype and device (the initial positions).
    store : where complete chunks go (None: the buffers hold the whole run).
    chunk : kept iterations per chunk, with a store.
    """

    def __init__(
        self,
        chains: int,
        warmup: int,
        draws: int,
        dim: int,
        save_warmup: bool,
        like: torch.Tensor | np.ndarray,
        store: Store | None = None,
        chunk: int | None = None,
    ) -> None:
        self.offset = 0 if save_warmup else warmup
        self.kept = warmup + draws - self.offset
        self.store = store
        self.chunk = self.kept if store is None or chunk is None else max(1, min(chunk, self.kept))
        #: the kept iteration held in the buffers' first column
        self.base = 0
        self.width = width = self.chunk + 1  # the spare column
        self.rows = namespace(like).arange(chains)
        if isinstance(self.rows, torch.Tensor):
            self.rows = self.rows.to(like.device)
        self.positions = zeros(like, (chains, width, dim))
        self.buffers: dict[str, torch.Tensor | np.ndarray] = {}
        #: divergent transitions recorded so far: an int, or a tensor on the device (no
        #: device read per write)
        self.divergences: int | torch.Tensor = 0
        #: per-chain sums of the statistics already sent to the store ``(C,)`` each
        self.sent: dict[str, np.ndarray] = {}

    def ends(self, first: int, total: int) -> list[int]:
        """The iterations after ``first`` and before ``total`` where a chunk is complete
        and every chain must wait for the flush (none without a store)."""
        if self.store is None:
            return []
        return [i for i in range(self.offset + self.chunk, total, self.chunk) if i > first]

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
        start = self.offset + self.base  # the iteration of the buffers' first column
        if common_iteration is not None:
            slot = common_iteration - start
            if 0 <= slot < self.chunk:
                self.positions[:, slot] = state.position
                for name, value in values.items():
                    self._buffer(name, value)[:, slot] = value
                self.divergences = self.divergences + info.diverging.sum()
            return
        xp = namespace(done)
        slot = iteration - start
        keep = done & (slot >= 0) & (slot < self.chunk)
        slot = xp.where(keep, slot, self.chunk)  # the others write the spare column
        rows = self.rows
        self.positions[rows, slot] = state.position
        for name, value in values.items():
            self._buffer(name, value)[rows, slot] = value
        self.divergences = self.divergences + (info.diverging & keep).sum()

    def flush(self, upto: int, resume_at: int | None = None) -> None:
        """Send the buffered iterations before ``upto`` (every chain has completed them)
        to the store and go on at iteration ``resume_at`` (default ``upto``; later after
        the pooled warmup's early stop, leaving out the iterations skipped). Nothing to do
        without a store."""
        if self.store is None:
            return
        count = min(upto - self.offset, self.base + self.chunk) - self.base
        if count > 0:
            stats = {name: _numpy(buffer[:, :count]) for name, buffer in self.buffers.items()}
            self.store.append(self.base, _numpy(self.positions[:, :count]), stats)
            for name, value in stats.items():
                self.sent[name] = self.sent.get(name, 0) + value.sum(1)
            for buffer in (self.positions, *self.buffers.values()):
                buffer[:, :count] = 0  # (per-chain sums read the buffers whole)
        self.base = max(0, (upto if resume_at is None else resume_at) - self.offset)

    def chain_sums(self, name: str) -> np.ndarray | None:
        """Each chain's sum of statistic ``name`` over its recorded iterations ``(C,)``,
        None before anything is recorded."""
        buffer = self.buffers.get(name)
        if buffer is None:
            return None
        return self.sent.get(name, 0) + _numpy(buffer[:, : self.chunk].sum(1))

    def held(self) -> tuple[torch.Tensor | np.ndarray, dict[str, torch.Tensor | np.ndarray]]:
        """The positions ``(C, kept + 1, D)`` and statistics ``(C, kept + 1)`` recorded so
        far, for a checkpoint (after a flush when streaming; none when streaming to a file,
        which holds them)."""
        if self.store is None:
            return self.positions, self.buffers
        held = self.store.held()
        if held is None:
            chains, _, dim = self.positions.shape
            return np.zeros((chains, 0, dim), dtype=_numpy(self.positions[:1, :1]).dtype), {}
        return held

    def restore(
        self,
        positions: torch.Tensor,
        stats: dict[str, torch.Tensor],
        divergences: int,
        iteration: int,
    ) -> None:
        """Take the draws, statistics and divergence count of a checkpoint written at
        ``iteration`` (CPU tensors of :meth:`held`'s shapes) in place of its own."""
        self.divergences = divergences
        self.base = max(0, iteration - self.offset) if self.store is not None else 0
        if self.store is not None:
            numpy = {name: x.numpy() for name, x in stats.items()}
            self.sent = self.store.restore(positions.numpy(), numpy, iteration)
            return
        like = self.positions

        def convert(x: torch.Tensor) -> torch.Tensor | np.ndarray:
            return x.numpy() if isinstance(like, np.ndarray) else x.to(like.device)

        self.positions = convert(positions)
        self.buffers = {name: convert(x) for name, x in stats.items()}

    def _buffer(self, name: str, like: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
        """The buffer of statistic ``name``, made on first use with the dtype of ``like``."""
        buffer = self.buffers.get(name)
        if buffer is None:
            buffer = self.buffers[name] = zeros(like, (self.rows.shape[0], self.width))
        return buffer

    def draws(self, window: slice) -> np.ndarray:
        """The positions of the kept iterations ``window`` ``(C, W, D)``, as NumPy."""
        positions, _ = self.held()
        return _numpy(positions[:, window])

    def stats(self, window: slice) -> dict[str, np.ndarray]:
        """Every statistic of the kept iterations ``window``, ``(C, W)`` NumPy each."""
        _, stats = self.held()
        return {name: _numpy(buffer[:, window]) for name, buffer in stats.items()}


def _numpy(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else x.numpy(force=True)
