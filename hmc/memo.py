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


class MemoCache:
    """LRU map from exact positions to ``(potential, gradient)``.

    Parameters
    ----------
    maxsize : int
        The most rows kept; the least recently used row is dropped beyond it.

    Attributes
    ----------
    hits, misses : int
        Rows served from the cache and rows that had to be computed.

    Examples
    --------
    >>> cache = MemoCache(maxsize=16)
    >>> potential = hmc.Potential(log_prob, cache=cache)   # doctest: +SKIP
    """

    def __init__(self, maxsize: int = DEFAULT_MAXSIZE) -> None:
        if not isinstance(maxsize, int) or isinstance(maxsize, bool) or maxsize < 1:
            raise ValueError(f"maxsize must be a positive integer, got {maxsize!r}")
        self.maxsize = maxsize
        self.hits = 0
        self.misses = 0
        self._store: OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._store)

    def clear(self) -> None:
        """Drop every entry (the counters are kept)."""
        self._store.clear()

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
            self._store[key] = (potential[i].clone(), grad[i].clone())
            self._store.move_to_end(key)
        while len(self._store) > self.maxsize:
            self._store.popitem(last=False)
