"""The progress display: the run as a whole and each chain (or group of chains).

A line for the whole run (iterations done, elapsed time and an ETA, and "compiling"
while the energy compiles), then one line per chain, or per group of chains when there are
more than :data:`MAX_LINES`: its iterations, whether it is warming up or sampling, its
divergent transitions, its step size and its leapfrog steps per draw. It is tqdm's
(``tqdm.auto``: text in a terminal, widgets in Jupyter), refreshed at most
:data:`REFRESH_SECONDS` apart so that it costs nothing per leapfrog step, and it is off by
default when standard error is not a terminal or the ``CI`` variable is set.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

__all__ = ["MAX_LINES", "REFRESH_SECONDS", "Progress"]

#: at most this many chain lines; more chains are shown in groups
MAX_LINES = 8
#: the least time between two refreshes of the chain lines
REFRESH_SECONDS = 0.25


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


def _label(group: np.ndarray) -> str:
    first, last = int(group[0]), int(group[-1])
    return f"chain {first}" if first == last else f"chains {first}-{last}"


def _per_chain(sums: np.ndarray | None, chains: int) -> np.ndarray:
    """Per-chain sums ``(C,)``; zeros before anything is recorded."""
    return np.zeros(chains) if sums is None else sums


def _numpy(x: Any) -> np.ndarray:
    return x.numpy(force=True) if isinstance(x, torch.Tensor) else np.asarray(x)
