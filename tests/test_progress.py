"""The progress display: a line for the run and one per chain (or group of chains) with
its iterations, phase, divergences, step size and steps per draw; nothing when off; plain
lines for a log."""

from __future__ import annotations

import functools
import io
import re

import numpy as np
import pytest

import hmc
from hmc.progress import ProgressLines


def run(capsys, chains: int, progress: bool) -> list[str]:
    hmc.sample(
        lambda q: -0.5 * (q**2).sum(-1),
        dim=2,
        chains=chains,
        warmup=60,
        draws=60,
        seed=1,
        batched=True,
        progress=progress,
    )
    err = capsys.readouterr().err
    return [line for line in re.split(r"[\r\n]", err) if line.strip()]


def test_each_chain_has_a_line(capsys):
    lines = run(capsys, 3, True)
    final = {label: [line for line in lines if line.strip().startswith(label)][-1] for label in (
        "chain 0", "chain 1", "chain 2")}  # fmt: skip
    for line in final.values():
        assert "120/120" in line and "sampling" in line and "steps/draw" in line, line
        assert re.search(r"\d+ divergent, step [0-9.]+, [0-9.]+ steps/draw", line), line
    assert any("sampling: 100%" in line and "360/360" in line for line in lines)


def test_many_chains_are_grouped_in_eight_lines(capsys):
    lines = run(capsys, 20, True)
    labels = {m.group(0) for line in lines if (m := re.search(r"chains? \d+(-\d+)?", line))}
    assert len(labels) == 8 and "chains 0-2" in labels and "chains 18-19" in labels, labels


def test_nothing_is_shown_when_off(capsys):
    assert run(capsys, 3, False) == []


class Recorded:
    """A recorder's per-chain sums, as the displays read them."""

    def __init__(self, divergences=None):
        self.divergences = divergences

    def chain_sums(self, name):
        return self.divergences if name == "diverging" else None


def test_lines_for_a_log_say_when_compiling_and_how_far_the_run_is():
    log = io.StringIO()
    lines = ProgressLines(2, 10, 10, every=3600, stream=log)
    lines.compiling(True)
    lines.compiling(False)
    lines.update(np.array([3, 5]), 8, Recorded(), None)  # within the interval: nothing
    lines.update(np.array([12, 15]), 26, Recorded(np.array([1, 2])), None, force=True)
    assert re.fullmatch(
        r"compiling the energy with torch\.compile\ncompiling took 0\.0 s\n"
        r"sampling: 26/40 iterations \(65%\), 3 divergent, 0\.0 s\n",
        log.getvalue(),
    ), log.getvalue()


@pytest.mark.parametrize("every", [-1, "10", True, float("nan")])
def test_lines_need_an_interval_in_seconds(every):
    with pytest.raises(ValueError, match="every must be a number of seconds"):
        ProgressLines(2, 10, 10, every=every)


def test_sample_takes_a_display_factory():
    log = io.StringIO()
    hmc.sample(
        lambda q: -0.5 * (q**2).sum(-1), dim=2, chains=3, warmup=60, draws=60, seed=1,
        batched=True, progress=functools.partial(ProgressLines, every=0, stream=log),
    )  # fmt: skip
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("warmup: ") and len(lines) > 2, lines
    assert lines[-1].startswith("sampling: 360/360 iterations (100%), 0 divergent, "), lines
