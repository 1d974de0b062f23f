"""The batched sampler on a CUDA device: the CPU's draws, and no host sync per leapfrog.

Skipped where torch sees no CUDA device (CI has none); ``benchmarks/cuda_check.py`` runs
the same checks at larger sizes with throughput, and ``benchmarks/RESULTS.md`` keeps
their figures.

Draws are compared with a given step size and metric (no warmup). Warmup's adaptation
amplifies rounding: on the CPU alone, moving the starts by 1e-14 changes the draws by
about 1e-7 after 30 warmup iterations and by O(1) after 75-100 (its early step sizes are
far beyond the leapfrog's stability limit; ``cuda_check --parts sensitivity``). The
device rounds ``exp``, ``log`` and sums differently from the CPU, so runs with warmup
agree in distribution only.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from conftest import diagonal_gaussian_log_prob

import hmc

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SD = np.linspace(0.5, 5.0, 6)


def _run(device: str, kernel, log_prob, dim: int, chains: int, warmup: int, draws: int, step):
    return hmc.sample(
        log_prob,
        dim=dim,
        chains=chains,
        warmup=warmup,
        draws=draws,
        kernel=kernel,
        step_size=step,
        seed=3,
        device=device,
        progress=False,
        batched=True,
    )


@pytest.mark.parametrize(
    ("kernel", "step"), [(hmc.NUTS(), 0.5), (hmc.HMC(num_steps=8), 0.2)], ids=["nuts", "hmc"]
)
def test_cuda_draws_match_the_cpu(kernel, step):
    """Random numbers depend on (seed, chain, counter) only, so on an elementwise target
    the device's run is the CPU's up to rounding: every draw, every tree size and the
    gradient count."""
    log_prob = diagonal_gaussian_log_prob(np.zeros(6), SD)
    cpu = _run("cpu", kernel, log_prob, 6, chains=4, warmup=0, draws=50, step=step)
    gpu = _run("cuda", kernel, log_prob, 6, chains=4, warmup=0, draws=50, step=step)
    assert gpu.attrs["device"].startswith("cuda")
    np.testing.assert_allclose(
        gpu["posterior"]["x"].values, cpu["posterior"]["x"].values, rtol=0, atol=1e-8
    )
    assert gpu.attrs["n_gradient_evaluations"] == cpu.attrs["n_gradient_evaluations"]
    for name in ("n_steps", "diverging"):
        np.testing.assert_array_equal(
            gpu["sample_stats"][name].values, cpu["sample_stats"][name].values
        )


def _gauss2d_on_device():
    """A correlated 2-D Gaussian whose constants live on the device (a density that
    copies them from the host at every call would wait for the device itself)."""
    precision = torch.linalg.inv(torch.tensor([[1.0, 0.9], [0.9, 1.0]], dtype=torch.float64))
    precision = precision.to("cuda")

    def log_prob(q: torch.Tensor) -> torch.Tensor:
        return -0.5 * ((q @ precision) * q).sum(-1)

    return log_prob


def _syncs(kernel, warmup: int, draws: int, step: float | None) -> tuple[int, int, int]:
    """(synchronizing calls in a 64-chain run, kernel calls, syncs inside kernel calls),
    counted by torch's sync debug mode."""
    cls = type(kernel)
    original = cls.step
    calls = {"step": 0, "inside": 0}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def counted(self, *args, **kwargs):
            calls["step"] += 1
            before = len(caught)
            out = original(self, *args, **kwargs)
            calls["inside"] += sum("synchroniz" in str(w.message) for w in caught[before:])
            return out

        cls.step = counted
        torch.cuda.set_sync_debug_mode("warn")
        try:
            _run("cuda", kernel, _gauss2d_on_device(), 2, 64, warmup, draws, step)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            cls.step = original
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    return syncs, calls["step"], calls["inside"]


#: set-up and output: the starts' checks, the schedule's masks, copying the draws back
SETUP_SYNCS = 40


def test_nuts_reads_the_device_once_per_tick():
    """NUTS's tick (one leapfrog step of every running chain) never waits for the
    device; the loop reads its counters once per tick."""
    syncs, ticks, inside = _syncs(hmc.NUTS(), warmup=0, draws=100, step=0.3)
    assert ticks > 300  # several leapfrog steps per transition, 100 transitions
    assert inside == 0
    assert syncs <= ticks + SETUP_SYNCS, (syncs, ticks)


def test_nuts_ticks_do_not_wait_during_warmup():
    """Adaptation reads the device only where a chain ends a slow window (the metric
    update and the step-size search); a tick never does."""
    _, ticks, inside = _syncs(hmc.NUTS(), warmup=60, draws=20, step=None)
    assert ticks > 240
    assert inside == 0


def test_static_hmc_does_not_wait_for_the_device():
    """With a fixed number of steps, neither a transition (10 leapfrog steps) nor the loop
    around it reads the device."""
    syncs, transitions, inside = _syncs(hmc.HMC(num_steps=10), warmup=0, draws=100, step=0.2)
    assert transitions == 100
    assert inside == 0
    assert syncs <= SETUP_SYNCS, syncs


def test_device_memory_does_not_grow_with_the_run(monkeypatch):
    """The draws leave the device chunk by chunk (chunks of 20 iterations here): ten times
    the draws leave the device's peak allocation unchanged, within a megabyte."""
    import hmc.store

    monkeypatch.setattr(hmc.store, "STREAM_BYTES", 1)
    dim, chains = 50, 256

    def peak(draws: int) -> int:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        tree = hmc.sample(
            diagonal_gaussian_log_prob(np.zeros(dim), np.ones(dim)), dim=dim, chains=chains,
            warmup=0, draws=draws, kernel=hmc.HMC(num_steps=3), step_size=0.5, seed=3,
            device="cuda", progress=False, batched=True, compile=False,
        )  # fmt: skip
        assert tree["posterior"]["x"].shape == (chains, draws, dim)
        return torch.cuda.max_memory_allocated()

    peak(20)
    short, long = peak(200), peak(2000)
    assert long - short < 2**20, (short, long)  # the added draws: 1800 x 256 x 50 x 8 = 184 MB
