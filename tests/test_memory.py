"""Long runs in bounded memory: beyond the draws themselves, a run's memory does not grow
with its length (measured with tracemalloc, which sees NumPy's allocations: the CPU
engine's draws, states and statistics)."""

from __future__ import annotations

import gc
import tracemalloc

import hmc

DIM, CHAINS = 50, 4


def peak_bytes(draws: int) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        dt = hmc.sample(
            lambda q: -0.5 * (q**2).sum(-1),
            dim=DIM,
            chains=CHAINS,
            warmup=0,
            draws=draws,
            kernel=hmc.HMC(num_steps=3),
            step_size=0.5,
            seed=1,
            batched=True,
            progress=False,
            compile=False,
        )
        assert dt["posterior"]["x"].shape == (CHAINS, draws, DIM)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_grows_with_the_draws_only():
    """Ten times the draws: the peak grows by less than twice the added draws' bytes (the
    recorder's buffer and the output's copy), and the short run's peak is within a small
    constant of its own draws."""
    short, long = 400, 4000
    itemsize = 8
    draw_bytes = CHAINS * DIM * itemsize
    peak_bytes(10)  # the first run pays for lazy imports and caches
    peaks = {n: peak_bytes(n) for n in (short, long)}
    growth = peaks[long] - peaks[short]
    assert growth < 2 * (long - short) * draw_bytes, peaks
    assert peaks[short] < 2 * short * draw_bytes + 4 * 2**20, peaks
