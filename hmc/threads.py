"""The run's intra-op threads: one, unless more are measured to shorten the wall time.

torch runs each tensor operation on all its intra-op threads (by default one per core).
The operations of a run are small (a few chains' positions and the user's density), so
extra threads mostly wait on each other: on a 2-core machine a 4-chain eager run of
kidscore_interaction took 80 CPU s for 41.9 s with two threads against 44.5 CPU s for
44.5 s with one, and on a loaded machine the two threads' waiting took the same run from
78 to 1,313 CPU s. Stan runs a chain on one thread.

So :func:`run_threads` times one evaluation of the energy at the run's initial points on
one thread and on torch's default count, and keeps more than one only where they make it
at least :data:`SPEEDUP_FOR_MORE` times faster (a density over much data). A count the
user set (``torch.set_num_threads``, ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``) is never
changed. The choice is recorded in the run's ``threads`` attribute and undone when the run
ends.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator

import torch

__all__ = ["DEFAULT_THREADS", "SPEEDUP_FOR_MORE", "run_threads"]

#: torch's own intra-op thread count, as it was when this package was imported
DEFAULT_THREADS = torch.get_num_threads()
#: how much faster an evaluation must be on more threads for a run to keep them
SPEEDUP_FOR_MORE = 1.5
#: timed evaluations per thread count (the fastest counts)
TRIALS = 3


def user_set_threads() -> bool:
    """Whether the user chose the thread count: an environment variable that torch reads,
    or a count other than torch's default."""
    chosen = any(os.environ.get(name) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"))
    return chosen or torch.get_num_threads() != DEFAULT_THREADS


@contextlib.contextmanager
def run_threads(evaluate: Callable[[], object]) -> Iterator[str]:
    """Within the block, the run's thread count (see the module docstring), chosen by
    timing ``evaluate`` (one evaluation of the energy); yields the choice in words."""
    before = torch.get_num_threads()
    if user_set_threads() or before == 1:
        yield f"{before} (as set)" if user_set_threads() else "1"
        return
    evaluate()  # once untimed: a first call pays for what later calls reuse
    seconds = {count: _fastest(evaluate, count) for count in (1, before)}
    speedup = seconds[1] / max(seconds[before], 1e-12)
    keep = before if speedup >= SPEEDUP_FOR_MORE else 1
    torch.set_num_threads(keep)
    try:
        yield f"{keep} (an evaluation {speedup:.2f} times as fast on {before} threads as on 1)"
    finally:
        torch.set_num_threads(before)


def _fastest(evaluate: Callable[[], object], threads: int) -> float:
    """The fastest of :data:`TRIALS` wall times of ``evaluate`` on ``threads`` threads."""
    torch.set_num_threads(threads)
    best = float("inf")
    for _ in range(TRIALS):
        started = time.perf_counter()
        evaluate()
        best = min(best, time.perf_counter() - started)
    return best
