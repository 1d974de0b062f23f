"""A position-keyed memo cache for potential energies and gradients.

Each row of a batch of positions is keyed on its exact bytes together with its dtype,
shape and device, so a hit is only ever served for a bit-identical position. The cache is a
pure optimisation: it returns stored copies of values the energy module computed before,
never approximations.

Where it pays: a hand-written Metropolis loop that asks for the energy at the start of every
trajectory (after a rejection the start is the old start, after an acceptance it is the last
leapfrog position, both computed before), repeated evaluations in custom loops, and any
code that asks for the value and the gradient at the same point through separate calls.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

__all__ = ["MemoCache"]

DEFAULT_MAXSIZE = 4096
#: the default bound on the memory the entries hold (keys and values): 64 MiB
DEFAULT_MAX_BYTES = 64 * 2**20


class MemoCache:
    """LRU map from exact positions to ``(potential, gradient)``.

    Parameters
    ----------
    maxsize : int
        The most rows kept; the least recently used row is dropped beyond it.
    max_bytes : int
        The most memory the entries may hold (each row's key, its position's bytes, and
        its potential and gradient); least recently used rows are dropped beyond it. At
        D = 10,000 in float64 a row takes about 160 kB, so the default 64 MiB keeps about
        400 rows, not ``maxsize``.

    Attributes
    ----------
    hits, misses : int
        Rows served from the cache and rows that had to be computed.
    nbytes : int
        The memory the entries hold now.

    Examples
    --------
    >>> cache = MemoCache(maxsize=16)
    >>> potential = hmc.Potential(log_prob, cache=cache)   # doctest: +SKIP
    """

    def __init__(self, maxsize: int = DEFAULT_MAXSIZE, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        for name, value in (("maxsize", maxsize), ("max_bytes", max_bytes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self._store: OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._store)

    def clear(self) -> None:
        """Drop every entry (the counters are kept)."""
        self._store.clear()
        self.nbytes = 0

    @staticmethod
    def keys_for(positions: torch.Tensor) -> list[tuple]:
        """One key per row of ``positions`` ``(C, D)``: dtype, row shape, device, bytes."""
        rows = positions.detach().to("cpu").contiguous().numpy()
        head = (str(positions.dtype), tuple(positions.shape[1:]), str(positions.device))
        return [(*head, row.tobytes()) for row in rows]

    def lookup(self, keys: list[tuple]) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        """Stored ``(potential, gradient)`` per key, or None; counts hits and misses."""
        found = []
        for key in keys:
            entry = self._store.get(key)
            if entry is None:
                self.misses += 1
            else:
                self.hits += 1
                self._store.move_to_end(key)
            found.append(entry)
        return found

    def store(self, keys: list[tuple], potential: torch.Tensor, grad: torch.Tensor) -> None:
        """Keep rows ``potential[i]`` (0-d) and ``grad[i]`` ``(D,)`` under ``keys[i]``."""
        for i, key in enumerate(keys):
            entry = (potential[i].clone(), grad[i].clone())
            old = self._store.pop(key, None)
            if old is not None:
                self.nbytes -= _entry_bytes(key, old)
            self._store[key] = entry
            self.nbytes += _entry_bytes(key, entry)
        while len(self._store) > self.maxsize or (self.nbytes > self.max_bytes and self._store):
            key, entry = self._store.popitem(last=False)
            self.nbytes -= _entry_bytes(key, entry)


def _entry_bytes(key: tuple, entry: tuple[torch.Tensor, torch.Tensor]) -> int:
    """The memory one entry holds: its key's position bytes and its two tensors."""
    return len(key[-1]) + sum(x.numel() * x.element_size() for x in entry)
