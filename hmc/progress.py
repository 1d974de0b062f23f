"""The progress display: the run as a whole and each chain (or group of chains).

A line for the whole run (iterations done, elapsed time and an ETA, and "compiling"
while the energy compiles), then one line per chain, or per group of chains when there are
more than :data:`MAX_LINES`: its iterations, whether it is warming up or sampling, its
divergent transitions, its step size and its leapfrog steps per draw. It is tqdm's
(``tqdm.auto``: text in a terminal, widgets in Jupyter), refreshed at most
:data:`REFRESH_SECONDS` apart so that it costs nothing per leapfrog step, and it is off by
default when standard error is not a terminal or the ``CI`` variable is set.

For a log (standard error sent to a file), :class:`ProgressLines` writes plain lines
instead: one when compiling starts and one when it ends, and the run's iterations at most
every :data:`LINE_SECONDS`. ``hmc.sample(progress=...)`` takes either class, or any
callable ``(chains, warmup, draws)`` that returns a :class:`Display`. :func:`start_line`
and :func:`end_line` are the lines the command line prints (with :func:`print_now`)
before and after a run.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, Protocol, TextIO

import numpy as np
import torch

__all__ = [
    "LINE_SECONDS",
    "MAX_LINES",
    "REFRESH_SECONDS",
    "Display",
    "DisplayFactory",
    "Progress",
    "ProgressLines",
    "end_line",
    "print_now",
    "start_line",
]

#: at most this many chain lines; more chains are shown in groups
MAX_LINES = 8
#: the least time between two refreshes of the chain lines
REFRESH_SECONDS = 0.25
#: the most time between two of :class:`ProgressLines`' lines (while iterations end)
LINE_SECONDS = 10.0


class Display(Protocol):
    """What the sampler tells a progress display."""

    def compiling(self, compiling: bool) -> None:
        """The energy starts (True) or ends (False) compiling."""
        ...

    def update(
        self, iteration: Any, done: int, recorder: Any, step_size: Any, *, force: bool = False
    ) -> None:
        """``done`` iterations in all; each chain's ``iteration`` and ``step_size`` ``(C,)``
        and the ``recorder`` of its statistics; ``force`` at the end of the run."""
        ...

    def close(self) -> None:
        """The run has ended (or failed)."""
        ...


#: ``(chains, warmup, draws) -> Display``, as ``hmc.sample(progress=...)`` takes it
DisplayFactory = Callable[[int, int, int], Display]


class Progress:
    """Progress lines for ``chains`` chains of ``warmup + draws`` iterations each."""

    def __init__(self, chains: int, warmup: int, draws: int) -> None:
        from tqdm.auto import tqdm

        self.warmup = warmup
        self.total = warmup + draws
        self.groups = np.array_split(np.arange(chains), min(chains, MAX_LINES))
        self.run = tqdm(
            total=chains * self.total, desc="sampling", unit="draws", position=0, smoothing=0.1
        )
        width = len(_label(self.groups[-1]))
        self.lines = [
            tqdm(
                total=self.total,
                desc=_label(group).rjust(width),
                position=i + 1,
                bar_format="{desc} {bar:20} {n_fmt}/{total_fmt}{postfix}",
            )
            for i, group in enumerate(self.groups)
        ]
        self.shown = 0.0

    def compiling(self, compiling: bool) -> None:
        """Say that the energy is compiling (the first evaluation waits for it)."""
        self.run.set_description("compiling" if compiling else "sampling", refresh=True)

    def update(
        self,
        iteration: Any,
        done: int,
        recorder: Any,
        step_size: Any,
        *,
        force: bool = False,
    ) -> None:
        """Show ``done`` iterations in all, and each chain's ``iteration`` ``(C,)``, its
        recorded divergences and leapfrog steps, and ``step_size`` ``(C,)`` (arrays of the
        run's engine); at most every :data:`REFRESH_SECONDS` unless ``force``."""
        self.run.update(done - self.run.n)
        now = time.monotonic()
        if not force and now - self.shown < REFRESH_SECONDS:
            return
        self.shown = now
        iteration, step_size = _numpy(iteration), _numpy(step_size)
        divergences = _per_chain(recorder.chain_sums("diverging"), iteration.shape[0])
        steps = _per_chain(recorder.chain_sums("n_steps"), iteration.shape[0])
        recorded = np.clip(iteration - recorder.offset, 0, recorder.kept)
        for line, group in zip(self.lines, self.groups, strict=True):
            least = int(iteration[group].min())
            phase = "warmup" if least < self.warmup else "sampling"
            kept = int(recorded[group].sum())
            per_draw = f"{steps[group].sum() / kept:.1f}" if kept else "-"
            line.n = least
            line.set_postfix_str(
                f"{phase}, {int(divergences[group].sum())} divergent, "
                f"step {float(np.median(step_size[group])):.3g}, {per_draw} steps/draw",
                refresh=False,
            )
            line.refresh()

    def close(self) -> None:
        """Close every line (after an error too, so that a traceback is not drawn into
        them)."""
        for line in self.lines:
            line.close()
        self.run.close()


class ProgressLines:
    """Plain progress lines for a log: when compiling starts and ends, and the run's
    iterations at most every ``every`` seconds and at its end, written to ``stream``
    (standard error by default).

    Examples
    --------
    >>> import functools, hmc
    >>> every_minute = functools.partial(ProgressLines, every=60)
    >>> dt = hmc.sample(log_prob, dim=3, progress=every_minute)  # doctest: +SKIP
    """

    def __init__(
        self,
        chains: int,
        warmup: int,
        draws: int,
        *,
        every: float = LINE_SECONDS,
        stream: TextIO | None = None,
    ) -> None:
        if not isinstance(every, int | float) or isinstance(every, bool) or not every >= 0:
            raise ValueError(f"every must be a number of seconds >= 0, got {every!r}")
        self.warmup = warmup
        self.total = chains * (warmup + draws)
        self.every = float(every)
        self.stream = sys.stderr if stream is None else stream
        self.started = self.shown = time.monotonic()
        self.compile_started = self.started

    def _write(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def compiling(self, compiling: bool) -> None:
        """A line when compiling starts, and one with its time when it ends."""
        now = time.monotonic()
        if compiling:
            self.compile_started = now
            self._write("compiling the energy with torch.compile")
        else:
            self._write(f"compiling took {now - self.compile_started:.1f} s")

    def update(
        self, iteration: Any, done: int, recorder: Any, step_size: Any, *, force: bool = False
    ) -> None:
        """A line with ``done`` of all the run's iterations, the phase (warmup while a chain
        is in it), the recorded divergent transitions and the elapsed time, at most every
        :attr:`every` seconds unless ``force``; ``iteration`` ``(C,)`` as
        :meth:`Progress.update` takes it (``step_size`` is not shown)."""
        now = time.monotonic()
        if not force and now - self.shown < self.every:
            return
        self.shown = now
        phase = "warmup" if int(_numpy(iteration).min()) < self.warmup else "sampling"
        divergences = recorder.chain_sums("diverging")
        divergent = 0 if divergences is None else int(divergences.sum())
        self._write(
            f"{phase}: {done}/{self.total} iterations ({done / self.total:.0%}), "
            f"{divergent} divergent, {now - self.started:.1f} s"
        )

    def close(self) -> None:
        """Nothing to close: each line is written whole."""


def print_now(line: str) -> None:
    """Print ``line`` to standard output and flush it, so that a log shows it when it
    happens (standard output to a file is written in blocks otherwise)."""
    print(line, flush=True)


def start_line(
    model: str,
    description: str,
    dim: int,
    chains: int,
    warmup: int,
    draws: int,
    kernel: str,
    seed: int,
) -> str:
    """What a command-line run samples (``model``, a few words on it, its ``dim``
    unconstrained dimensions, and the run's settings), before it starts."""
    from hmc import __version__

    return (
        f"hmc {__version__}: {model} ({description}, {dim} unconstrained dimensions); "
        f"{chains} chains, {warmup} warmup and {draws} draws each, kernel {kernel}, "
        f"seed {seed}"
    )


def end_line(dt: Any, seconds: float) -> str:
    """What the run in the DataTree ``dt`` did, ``seconds`` after it started: its kernel,
    compile time (when compiled), gradient evaluations and divergent transitions."""
    attrs = dt.attrs
    compiled = f", compiled in {attrs['compile_time']:.1f} s" if attrs["compiled"] else ""
    divergences = int(dt["sample_stats"]["diverging"].values.sum())
    return (
        f"sampled in {seconds:.1f} s ({attrs['kernel']}{compiled}, "
        f"{attrs['n_gradient_evaluations']} gradient evaluations, "
        f"{divergences} divergent transitions)"
    )


def _label(group: np.ndarray) -> str:
    first, last = int(group[0]), int(group[-1])
    return f"chain {first}" if first == last else f"chains {first}-{last}"


def _per_chain(sums: np.ndarray | None, chains: int) -> np.ndarray:
    """Per-chain sums ``(C,)``; zeros before anything is recorded."""
    return np.zeros(chains) if sums is None else sums


def _numpy(x: Any) -> np.ndarray:
    return x.numpy(force=True) if isinstance(x, torch.Tensor) else np.asarray(x)
