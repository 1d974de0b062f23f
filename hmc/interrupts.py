"""Interrupted runs keep their draws.

Ctrl-C (``SIGINT``, Python's ``KeyboardInterrupt``) or ``SIGTERM`` during a run ends the
sampling loop between two kernel calls; :func:`hmc.sample` then returns the draws every
chain has completed, with ``attrs["interrupted"]`` set and a warning saying how many. An
interrupt before every chain has left its warmup raises ``KeyboardInterrupt`` with a
message saying that no draws exist yet. Chains run asynchronously, so at an interrupt
some have completed more draws than others: the DataTree keeps the number every chain
has (an array of draws has one length), and the warning counts the later draws of
faster chains that this leaves out.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import warnings
from collections.abc import Iterator

import numpy as np

__all__ = ["kept_draws", "terminate_as_interrupt"]


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, ``SIGTERM`` raises ``KeyboardInterrupt`` as Ctrl-C does (in the
    main thread; elsewhere signals cannot be handled and the block changes nothing). The
    previous handler is restored afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def kept_draws(completed: np.ndarray, warmup: int, draws: int) -> int:
    """The number of draws to return from a run whose chains completed ``completed``
    ``(C,)`` iterations of ``warmup + draws``: all of them when every chain finished;
    after an interrupt, the draws every chain completed, with a warning. Raises
    ``KeyboardInterrupt`` when some chain has none (the interrupt came during warmup)."""
    total = warmup + draws
    least = int(completed.min())
    if least >= total:
        return draws
    done = np.clip(completed - warmup, 0, draws)
    kept = int(done.min())
    if kept == 0:
        in_warmup = int(np.count_nonzero(completed < warmup))
        raise KeyboardInterrupt(
            f"sampling interrupted during warmup: no draws exist yet ({in_warmup} of "
            f"{completed.shape[0]} chains had not finished their {warmup} warmup iterations)"
        )
    dropped = int(done.sum()) - kept * completed.shape[0]
    warnings.warn(
        f"sampling interrupted: returning the {kept} of {draws} draws every chain completed"
        + (f" ({dropped} later draws of faster chains left out)" if dropped else ""),
        RuntimeWarning,
        stacklevel=3,
    )
    return kept
