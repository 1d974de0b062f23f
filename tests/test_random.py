"""Counter-based per-chain random streams (hmc/random.py)."""

from __future__ import annotations

import math

import numpy as np
import torch

from hmc.random import Stream, chain_keys, normal, uniform

Z = 4.5  # bound on each z-score below (a dozen checks, fixed seeds)


def counters(chains: int, draws: int) -> torch.Tensor:
    return torch.arange(draws).expand(chains, draws)


def test_uniform_is_inside_the_open_unit_interval_and_uniform():
    keys = chain_keys(123, torch.arange(8))
    u = uniform(keys, Stream.ACCEPT, counters(8, 250), 500)  # 1e6 values
    assert u.shape == (8, 250, 500) and u.dtype == torch.float64
    assert (u > 0).all() and (u < 1).all()
    x = u.flatten().numpy()
    n = x.size
    # mean 1/2 and variance 1/12, iid: standard errors from the exact moments
    assert abs(x.mean() - 0.5) / math.sqrt(1 / 12 / n) < Z
    var_se = math.sqrt((1 / 80 - 1 / 144) / n)  # sd of (u - 1/2)^2 is sqrt(1/80 - 1/144)
    assert abs(((x - 0.5) ** 2).mean() - 1 / 12) / var_se < Z
    # chi-square over 100 equal bins (99 degrees of freedom)
    counts = np.bincount((x * 100).astype(int), minlength=100)
    chi2 = ((counts - n / 100) ** 2 / (n / 100)).sum()
    assert chi2 < 99 + Z * math.sqrt(2 * 99), chi2
    # 53 bits of resolution: a million draws are all distinct
    assert np.unique(x).size == n


def test_float32_uniform_never_returns_one():
    """Regression: a value above 1 - 2**-25 used to round to 1.0 in float32 (this draw)."""
    keys = chain_keys(0, torch.arange(1))
    u = uniform(keys, Stream.ACCEPT, torch.tensor([371]), 4096, torch.float32)
    assert u.dtype == torch.float32
    assert (u < 1).all(), f"u[0, {int((u >= 1).nonzero()[0, 1])}] == 1.0"


def test_normal_moments_within_standard_errors():
    keys = chain_keys(7, torch.arange(6))
    z = normal(keys, Stream.MOMENTUM, counters(6, 400), 401)  # odd n: uses half a pair
    assert z.shape == (6, 400, 401) and z.dtype == torch.float64
    x = z.flatten().numpy()
    n = x.size
    assert abs(x.mean()) / math.sqrt(1 / n) < Z
    assert abs((x**2).mean() - 1) / math.sqrt(2 / n) < Z
    assert abs((x**3).mean()) / math.sqrt(15 / n) < Z
    assert abs((x**4).mean() - 3) / math.sqrt(96 / n) < Z
    # tails: P(|z| > 3) = 0.0026998
    p = 2 * (1 - 0.5 * (1 + math.erf(3 / math.sqrt(2))))
    assert abs((np.abs(x) > 3).mean() - p) / math.sqrt(p * (1 - p) / n) < Z
    # neighbouring coordinates and neighbouring counters are uncorrelated
    for a, b in ((z[..., :-1], z[..., 1:]), (z[:, :-1], z[:, 1:]), (z[:-1], z[1:])):
        r = (a * b).mean().item()
        assert abs(r) * math.sqrt(a.numel()) < Z, r


def test_dtype_argument():
    keys = chain_keys(1, torch.arange(2))
    assert uniform(
        keys, Stream.INIT, torch.zeros(2, dtype=torch.int64), 3, torch.float32
    ).dtype == (torch.float32)
    z32 = normal(keys, Stream.INIT, torch.zeros(2, dtype=torch.int64), 3, torch.float32)
    z64 = normal(keys, Stream.INIT, torch.zeros(2, dtype=torch.int64), 3, torch.float64)
    assert z32.dtype == torch.float32
    torch.testing.assert_close(z32, z64.float(), rtol=0, atol=0)


def test_chain_numbers_do_not_depend_on_the_other_chains():
    seed = 2024
    everything = chain_keys(seed, torch.arange(10))
    some = chain_keys(seed, torch.tensor([7, 2, 9]))
    assert torch.equal(some, everything[[7, 2, 9]])
    alone = chain_keys(seed, torch.tensor([2]))
    counter_all = torch.full((10,), 5)
    full = normal(everything, Stream.MOMENTUM, counter_all, 4)
    assert torch.equal(normal(some, Stream.MOMENTUM, torch.full((3,), 5), 4), full[[7, 2, 9]])
    assert torch.equal(normal(alone, Stream.MOMENTUM, torch.tensor([5]), 4), full[[2]])
    # and not on the other chains' counters either
    mixed = torch.arange(10) * 3
    draws = uniform(everything, Stream.ACCEPT, mixed, 2)
    for c in (0, 4, 9):
        single = uniform(everything[c : c + 1], Stream.ACCEPT, mixed[c : c + 1], 2)
        assert torch.equal(draws[c : c + 1], single)


def test_pure_function_of_seed_chain_stream_counter():
    keys = chain_keys(5, torch.arange(3))
    c = torch.tensor([0, 10, 20])
    assert torch.equal(uniform(keys, Stream.TREE, c, 8), uniform(keys, Stream.TREE, c, 8))
    assert torch.equal(chain_keys(5, torch.arange(3)), keys)
    # counters (C, K): the same numbers as K separate (C,) calls
    k2 = torch.stack((c, c + 1), dim=1)
    both = uniform(keys, Stream.TREE, k2, 8)
    assert torch.equal(both[:, 0], uniform(keys, Stream.TREE, c, 8))
    assert torch.equal(both[:, 1], uniform(keys, Stream.TREE, c + 1, 8))


def test_different_streams_chains_seeds_and_counters_differ():
    base = chain_keys(11, torch.arange(4))
    counter = counters(4, 100)
    reference = uniform(base, Stream.MOMENTUM, counter, 50)
    others = {
        "stream": uniform(base, Stream.ACCEPT, counter, 50),
        "seed": uniform(chain_keys(12, torch.arange(4)), Stream.MOMENTUM, counter, 50),
        "counter": uniform(base, Stream.MOMENTUM, counter + 100, 50),
        "chain": uniform(base.roll(1), Stream.MOMENTUM, counter, 50),
    }
    n = reference.numel()
    for name, other in others.items():
        assert (other != reference).float().mean() > 0.999, name
        # and look independent: correlation of the centred values near 0
        r = ((reference - 0.5) * (other - 0.5)).mean().item() * 12
        assert abs(r) * math.sqrt(n) < Z, (name, r)
    assert len({int(k) for k in chain_keys(0, torch.arange(1000))}) == 1000
    streams = [uniform(base, s, counter[:, :1], 4) for s in Stream]
    for i in range(len(streams)):
        for j in range(i):
            assert not torch.equal(streams[i], streams[j])


def test_large_and_zero_seeds():
    for seed in (0, 1, 2**62, 2**63 - 1, 2**63, 2**64 - 1):
        keys = chain_keys(seed, torch.arange(2))
        u = uniform(keys, Stream.INIT, torch.zeros(2, dtype=torch.int64), 3)
        assert ((u > 0) & (u < 1)).all()
    assert not torch.equal(chain_keys(0, torch.arange(2)), chain_keys(1, torch.arange(2)))
