"""Interrupted runs keep their draws.

Ctrl-C (``SIGINT``) or ``SIGTERM`` during a run ends the sampling loop between two kernel
calls (:func:`interrupt_requests`); :func:`hmc.sample` then returns the draws every chain
has completed, with ``attrs["interrupted"]`` set and a warning saying how many. An
interrupt before every chain has left its warmup raises ``KeyboardInterrupt`` with a
message saying that no draws exist yet. With ``checkpoint=``, the chains first finish the
iteration in flight (those behind catch up with the furthest) and a checkpoint is written
there, so the run resumes from the moment of the interrupt; a second signal stops at once,
keeping the last checkpoint written. A ``KeyboardInterrupt`` raised by the user's code
stops at once too. Chains run asynchronously, so at an interrupt
some have completed more draws than others: the DataTree keeps the number every chain
has (an array of draws has one length), and the warning counts the later draws of
faster chains that this leaves out.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import warnings
from collections.abc import Callable, Iterator

import numpy as np

__all__ = ["interrupt_requests", "kept_draws"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def interrupt_requests() -> Iterator[Callable[[], bool]]:
    """Within the block, the first ``SIGINT`` or ``SIGTERM`` is recorded, not raised: the
    block gets a function saying whether one came, for the loop to read between kernel
    calls. A second raises ``KeyboardInterrupt`` at once. In a thread other than the
    main one signals cannot be handled: nothing is recorded and Ctrl-C raises as usual.
    The previous handlers are restored afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    received: list[int] = []

    def record(signum: int, frame: object) -> None:
        if received:
            raise KeyboardInterrupt(signal.Signals(signum).name)
        received.append(signum)

    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    for signum in SIGNALS:
        signal.signal(signum, record)
    try:
        yield lambda: bool(received)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


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
