"""The position-keyed memo cache: counting, LRU eviction, exact-bytes keys."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hmc
from hmc.memo import MemoCache
from hmc.metric import metric_from_inverse

DTYPE = torch.float64


def rows(*values):
    return torch.tensor(values, dtype=DTYPE)


def entry(value: float, dim: int = 2):
    return torch.tensor([value], dtype=DTYPE), torch.full((1, dim), value, dtype=DTYPE)


def test_hits_and_misses_are_counted_per_row():
    cache = MemoCache()
    q = rows([1.0, 2.0], [3.0, 4.0])
    keys = cache.keys_for(q)
    assert cache.lookup(keys) == [None, None]
    assert (cache.hits, cache.misses) == (0, 2)
    cache.store(keys, torch.tensor([10.0, 20.0], dtype=DTYPE), q * 2)
    found = cache.lookup(cache.keys_for(rows([3.0, 4.0], [5.0, 6.0], [1.0, 2.0])))
    assert (cache.hits, cache.misses) == (2, 3)
    assert found[1] is None
    assert found[0][0] == 20.0 and torch.equal(found[0][1], torch.tensor([6.0, 8.0], dtype=DTYPE))
    assert found[2][0] == 10.0 and torch.equal(found[2][1], torch.tensor([2.0, 4.0], dtype=DTYPE))
    assert len(cache) == 2


def test_stored_values_are_copies():
    cache = MemoCache()
    q = rows([1.0, 2.0])
    U, grad = torch.tensor([1.0], dtype=DTYPE), torch.tensor([[5.0, 6.0]], dtype=DTYPE)
    cache.store(cache.keys_for(q), U, grad)
    U.fill_(-1.0)
    grad.fill_(-1.0)
    (hit,) = cache.lookup(cache.keys_for(q))
    assert hit[0] == 1.0 and torch.equal(hit[1], torch.tensor([5.0, 6.0], dtype=DTYPE))


def test_least_recently_used_row_is_evicted():
    cache = MemoCache(maxsize=2)
    a, b, c = rows([1.0]), rows([2.0]), rows([3.0])
    cache.store(cache.keys_for(a), *entry(1.0, 1))
    cache.store(cache.keys_for(b), *entry(2.0, 1))
    assert cache.lookup(cache.keys_for(a))[0][0] == 1.0  # a is now the most recent
    cache.store(cache.keys_for(c), *entry(3.0, 1))  # evicts b
    assert len(cache) == 2
    assert cache.lookup(cache.keys_for(b)) == [None]
    assert cache.lookup(cache.keys_for(a))[0][0] == 1.0
    assert cache.lookup(cache.keys_for(c))[0][0] == 3.0
    cache.clear()
    assert len(cache) == 0 and cache.hits == 3 and cache.misses == 1


def test_keys_are_exact_bytes():
    cache = MemoCache()
    q = rows([0.1, 0.7])
    cache.store(cache.keys_for(q), *entry(1.0))
    last_bit = q.clone()
    last_bit[0, 1] = float(np.nextafter(0.7, 1.0))
    assert last_bit[0, 1] != q[0, 1]
    assert cache.lookup(cache.keys_for(last_bit)) == [None]
    # -0.0 == 0.0 numerically, but the bytes differ
    zero = rows([0.0, 0.0])
    cache.store(cache.keys_for(zero), *entry(2.0))
    assert cache.lookup(cache.keys_for(rows([-0.0, 0.0]))) == [None]
    assert cache.lookup(cache.keys_for(rows([0.0, 0.0])))[0][0] == 2.0
    # a copy made elsewhere with the same bytes hits
    assert cache.lookup(cache.keys_for(torch.tensor([[0.1, 0.7]], dtype=DTYPE)))[0][0] == 1.0


def test_dtype_and_shape_are_part_of_the_key():
    cache = MemoCache()
    zeros64 = torch.zeros(1, 2, dtype=torch.float64)  # 16 zero bytes
    cache.store(cache.keys_for(zeros64), *entry(1.0))
    # same bytes, other dtype or row shape
    assert cache.lookup(cache.keys_for(torch.zeros(1, 2, dtype=torch.int64))) == [None]
    assert cache.lookup(cache.keys_for(torch.zeros(1, 4, dtype=torch.float32))) == [None]
    # same values, other dtype
    assert cache.lookup(cache.keys_for(torch.zeros(1, 2, dtype=torch.float32))) == [None]
    assert cache.lookup(cache.keys_for(zeros64.clone()))[0][0] == 1.0


def test_potential_with_cache_float32_and_float64_do_not_mix():
    cache = MemoCache()
    potential = hmc.Potential(lambda q: -0.5 * (q**2).sum() * 1.1, cache=cache)
    q = rows([0.1, 0.2])
    _U64, _ = potential.value_and_grad(q)
    U32, g32 = potential.value_and_grad(q.float())
    assert U32.dtype == torch.float32 and g32.dtype == torch.float32
    assert cache.hits == 0 and cache.misses == 2 and potential.evaluations == 2


def test_maxsize_validated():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="maxsize"):
            MemoCache(maxsize=bad)
        with pytest.raises(ValueError, match="max_bytes"):
            MemoCache(max_bytes=bad)


def test_memory_is_bounded_in_bytes_not_only_rows():
    """At D = 10,000 in float64 a row holds 160 kB (its key's bytes, the gradient and the
    potential): a 1 MiB bound keeps 6 rows, whatever maxsize allows, and counts them."""
    dim = 10_000
    cache = MemoCache(maxsize=4096, max_bytes=2**20)
    q = torch.arange(20 * dim, dtype=torch.float64).reshape(20, dim)
    keys = MemoCache.keys_for(q)
    cache.store(keys, torch.zeros(20, dtype=torch.float64), q.clone())
    row = dim * 8 * 2 + 8
    assert len(cache) == 2**20 // row == 6
    assert cache.nbytes == 6 * row <= cache.max_bytes
    # the most recent rows are the ones kept
    assert all(found is not None for found in cache.lookup(keys[-6:]))
    assert cache.lookup(keys[:14]) == [None] * 14
    cache.store(keys[-1:], torch.ones(1, dtype=torch.float64), q[-1:])  # a key stored again
    assert cache.nbytes == 6 * row
    cache.clear()
    assert cache.nbytes == 0 and len(cache) == 0


# ---------------------------------------------------------------------- a hand-written loop
def hmc_basic(potential, q0, iterations, n_steps=10, step_size=0.25, seed=0):
    """The hand-rolled loop people write (``energy(pos).backward()`` per step, ``.data``
    updates), rewritten with the energy module: the energy at the start of every
    trajectory, ``hmc.leapfrog`` steps, and a Metropolis test."""
    gen = torch.Generator().manual_seed(seed)
    q = q0.reshape(1, -1)
    metric = metric_from_inverse(torch.ones_like(q))
    eps = torch.full((1, 1), step_size, dtype=q.dtype)
    potential.value_and_grad(q)  # the initial evaluation
    draws = []
    for _ in range(iterations):
        U, grad = potential.value_and_grad(q)  # after a rejection or an acceptance: known
        p0 = torch.randn(q.shape, generator=gen, dtype=q.dtype)
        state, p = hmc.State(q, U, grad), p0
        for _ in range(n_steps):
            state, p = hmc.leapfrog(state, p, eps, metric, potential)
        log_ratio = (U + 0.5 * (p0**2).sum(-1)) - (state.potential + 0.5 * (p**2).sum(-1))
        if torch.rand((), generator=gen, dtype=q.dtype).log() < log_ratio:
            q = state.position
        draws.append(q[0])
    return torch.stack(draws)


def test_hand_written_loop_costs_one_gradient_per_leapfrog_step():
    def energy_log_prob(q):
        return -0.5 * ((q / torch.tensor([1.0, 2.0], dtype=q.dtype)) ** 2).sum(-1)

    q0 = torch.tensor([0.5, -0.5], dtype=DTYPE)
    iterations, L = 300, 10
    cache = MemoCache()
    with_cache = hmc.Potential(energy_log_prob, cache=cache)
    draws = hmc_basic(with_cache, q0, iterations, n_steps=L)
    assert cache.hits == iterations
    assert with_cache.evaluations == 1 + iterations * L
    assert cache.misses == with_cache.evaluations
    without = hmc.Potential(energy_log_prob)
    plain = hmc_basic(without, q0, iterations, n_steps=L)
    assert without.evaluations == 1 + iterations * (L + 1)
    assert torch.equal(draws, plain)  # the cache changes nothing but the cost
    # and the loop is a correct sampler (one chain: a loose check of the variances)
    x = draws.numpy()
    assert len(np.unique(x[:, 0])) > iterations // 2  # it moves
    assert abs(x[:, 0].var() / 1.0 - 1) < 0.5 and abs(x[:, 1].var() / 4.0 - 1) < 0.5
