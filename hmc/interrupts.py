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

``SIGTERM`` is a request to stop the process (a scheduler's, ``timeout``'s): a run it
interrupts ends as above, and then the signal is delivered again to the handler there was
before the run (by default, the process ends) once what the run computed is safe: at
once where it was written to a checkpoint or a store, and otherwise when ``hmc.sample``
is called next, so a script gets its draws back but does not go on into another run
(:func:`after_run`, :func:`stop_if_terminated`).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator

import numpy as np

__all__ = ["after_run", "interrupt_requests", "kept_draws", "stop_if_terminated"]

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
        if signum == signal.SIGTERM:
            _TERMINATION["received"] = True
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


#: whether a SIGTERM came during a run and has not been delivered again yet
_TERMINATION = {"received": False}


def stop_if_terminated() -> None:
    """At the start of a run: deliver a SIGTERM that came during an earlier run whose
    draws were returned (see the module docstring)."""
    if _TERMINATION["received"]:
        _terminate("a SIGTERM came during the previous run")


def after_run(saved: bool) -> None:
    """Once a run's results are in hand: where a SIGTERM came during it, deliver it now if
    the results are ``saved`` on disk (a checkpoint, a store), else warn that the draws
    are returned and the process stops at the next run."""
    if not _TERMINATION["received"]:
        return
    if saved:
        _terminate("SIGTERM; the run is saved")
    warnings.warn(
        "the run was stopped by SIGTERM: its draws are returned and the process stops at "
        "the next hmc.sample call (pass checkpoint= or store= to keep them on disk and "
        "stop at once)",
        RuntimeWarning,
        stacklevel=3,
    )


def _terminate(why: str) -> None:
    """Deliver SIGTERM to this process's handler (by default the process ends)."""
    _TERMINATION["received"] = False
    print(f"hmc: stopping the process ({why})", file=sys.stderr, flush=True)
    signal.raise_signal(signal.SIGTERM)
