"""The progress display: a line for the run and one per chain (or group of chains) with
its iterations, phase, divergences, step size and steps per draw; nothing when off."""

from __future__ import annotations

import re

import hmc


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
