"""Long runs in bounded memory: beyond the draws themselves, a run's memory does not grow
with its length (measured with tracemalloc, which sees NumPy's allocations: the CPU
engine's draws, states and statistics)."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

import hmc
import hmc.run_warnings
import hmc.store

DIM, CHAINS = 50, 4


def peak_bytes(draws: int, store=None) -> int:
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
            store=store,
        )
        assert dt["posterior"]["x"].shape == (CHAINS, draws, DIM)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow  # 10 s: the quick tier keeps within its five minutes
def test_memory_grows_with_the_draws_only():
    """Ten times the draws: the peak grows by less than twice the added draws' bytes (the
    recorder's buffer and the output's copy), and the short run's peak is within a small
    constant of its own draws."""
    short, long = 400, 4000
    itemsize = 8
    draw_bytes = CHAINS * DIM * itemsize
    peak_bytes(100)  # the first run pays for lazy imports and caches (the settled check too)
    peaks = {n: peak_bytes(n) for n in (short, long)}
    growth = peaks[long] - peaks[short]
    assert growth < 2 * (long - short) * draw_bytes, peaks
    assert peaks[short] < 2 * short * draw_bytes + 4 * 2**20, peaks


@pytest.mark.slow
def test_a_stored_run_holds_one_chunk_whatever_its_length(tmp_path, monkeypatch):
    """With ``store=``, ten times the draws add less than a tenth of their bytes to the
    peak (chunks of about 100 iterations, the settled check reading 256 kB blocks); the
    same growth without a store is at least the added draws (checked above), so this
    can fail."""
    monkeypatch.setattr(hmc.store, "STREAM_BYTES", 200 * 2**10)
    monkeypatch.setattr(hmc.run_warnings, "BLOCK_BYTES", 256 * 2**10)
    short, long = 400, 4000
    draw_bytes = CHAINS * DIM * 8
    peak_bytes(100, tmp_path / "warm.nc")
    peaks = {n: peak_bytes(n, tmp_path / f"{n}.nc") for n in (short, long)}
    in_memory = {n: peak_bytes(n) for n in (short, long)}
    added = (long - short) * draw_bytes
    assert in_memory[long] - in_memory[short] > added, in_memory
    assert peaks[long] - peaks[short] < 0.1 * added, peaks
