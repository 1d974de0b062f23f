"""The iterative, batched NUTS kernel against the recursive transcription of Stan's
``transition``/``build_tree`` (tests/nuts_oracle.py), given the same momentum, directions
and uniforms."""

from __future__ import annotations

import itertools
import math
import zlib

import numpy as np
import pytest
import torch
from conftest import in_engine
from nuts_oracle import Oracle, Point

import hmc
from hmc.arrays import as_tensors
from hmc.integrators import leapfrog
from hmc.kernels.base import Params, Phase
from hmc.metric import metric_from_inverse
from hmc.random import Stream, chain_keys, normal, stream_keys, uniform_at
from hmc.state import State

TREE_DRAWS = 1 << 32


def gaussian(scales: torch.Tensor):
    def log_prob(q):
        return -0.5 * ((q / scales) ** 2).sum(-1)

    return log_prob


def student_t(q, nu=5.0):
    return (-(nu + 1) / 2 * torch.log1p(q**2 / nu)).sum(-1)


def funnel(q):
    v, x = q[..., 0], q[..., 1:]
    return -(v**2) / 18 - (x**2 / torch.exp(v).unsqueeze(-1)).sum(-1) / 2 - (x.shape[-1] / 2) * v


def run_fast(kernel, log_prob, q0, step_size, inverse, seed, engine="torch"):
    """One transition per chain with the batched kernel in ``engine``; per-chain
    (q, info) rows."""
    potential = hmc.Potential(log_prob, batched=True)
    U, g = potential.value_and_grad(q0)
    chains = q0.shape[0]
    kernel_state = kernel.init(in_engine(State(q0, U, g), engine))
    params = Params(in_engine(step_size, engine), metric_from_inverse(inverse))
    keys = chain_keys(seed, torch.arange(chains))
    one_each = torch.ones(chains, dtype=torch.int64)  # one transition per chain
    phase = Phase(*(in_engine(x, engine) for x in (one_each > 0, one_each)))
    results = {}
    for _ in range(5000):
        kernel_state, step = kernel.step(kernel_state, params, potential, keys, phase)
        done = step.done
        phase = phase._replace(left=phase.left - done * 1)  # the driver's count
        if engine == "torch":  # the driver reads the kernel's readout once per tick
            kernel_state = kernel.with_readout(kernel_state, kernel_state.readout.tolist())
        if done.any():
            state, info = map(as_tensors, (step.state, step.info))
            for c in np.flatnonzero(np.asarray(done)).tolist():
                results[c] = (
                    state.position[c].clone(),
                    {k: v[c].item() for k, v in info._asdict().items()},
                )
        if len(results) == chains:
            break
    return results, keys, potential


def run_oracle(log_prob, q0, step, inverse, key, max_depth, engine="torch"):
    """Stan's transition from the recursive oracle, stepping with the package's leapfrog
    in ``engine``'s arrays, as the kernel does."""
    potential = hmc.Potential(log_prob, batched=True)
    metric = metric_from_inverse(inverse.unsqueeze(0))
    engine_metric = in_engine(metric, engine)

    def one_step(z: Point, eps: float) -> Point:
        """The package's leapfrog on a one-row batch."""
        start = State(z.q.unsqueeze(0), torch.tensor([z.U], dtype=z.q.dtype), z.g.unsqueeze(0))
        eps = torch.tensor([[eps]], dtype=z.q.dtype)
        moved, p = map(
            as_tensors,
            leapfrog(
                in_engine(start, engine),
                in_engine(z.p.unsqueeze(0), engine),
                in_engine(eps, engine),
                engine_metric,
                potential,
            ),
        )
        return Point(moved.position[0], moved.potential.item(), moved.grad[0], p[0])

    noise = normal(key.view(1), Stream.MOMENTUM, torch.zeros(1, dtype=torch.int64), q0.shape[0])
    p0 = metric.momentum(noise)[0]
    U, g = potential.value_and_grad(q0.unsqueeze(0))
    U0, g0 = U.item(), g[0]
    uniforms = (
        uniform_at(stream_keys(key.view(1), Stream.TREE), torch.tensor([i])).item()
        for i in itertools.count()
    )
    oracle = Oracle(one_step, inverse, step, max_depth)
    return oracle.transition(Point(q0, U0, g0, p0), uniforms)


TARGETS = {
    "gaussian": (gaussian(torch.logspace(-1, 0.5, 6, dtype=torch.float64)), 6),
    "student_t": (student_t, 4),
    "funnel": (funnel, 5),
}


def random_cases(gen, chains, dim, step_range, dense=False):
    """Starting points ``(C, D)``, log-uniform step sizes in ``step_range`` ``(C,)`` and
    random inverse metrics (diagonal ``(C, D)`` or dense ``(C, D, D)``), from ``gen``."""
    q0 = torch.randn(chains, dim, generator=gen, dtype=torch.float64)
    low, high = (math.log(x) for x in step_range)
    step = torch.exp(torch.empty(chains, dtype=torch.float64).uniform_(low, high, generator=gen))
    if dense:
        a = torch.randn(chains, dim, dim, generator=gen, dtype=torch.float64) * 0.3
        inverse = a @ a.mT + torch.eye(dim, dtype=torch.float64)
    else:
        inverse = torch.exp(torch.randn(chains, dim, generator=gen, dtype=torch.float64) * 0.5)
    return q0, step, inverse


def assert_matches_oracle(kernel, log_prob, q0, step, inverse, seed, engine, max_depth=10):
    """Every chain's transition equals the oracle's: tree size, depth, flags, the selected
    point, the acceptance statistic and the energy. Returns the kernel's per-chain info."""
    fast, keys, _ = run_fast(kernel, log_prob, q0, step, inverse, seed=seed, engine=engine)
    for c in range(q0.shape[0]):
        expected = run_oracle(
            log_prob, q0[c], step[c].item(), inverse[c], keys[c], max_depth, engine
        )
        q, info = fast[c]
        assert info["n_steps"] == expected.n_leapfrog, c
        assert info["tree_depth"] == expected.depth, c
        assert info["diverging"] == expected.divergent, c
        assert info["reached_max_treedepth"] == (expected.depth >= max_depth), c
        torch.testing.assert_close(q, expected.q, rtol=1e-9, atol=1e-12)
        assert info["acceptance_rate"] == pytest.approx(expected.accept_stat, rel=1e-9)
        assert info["energy"] == pytest.approx(expected.energy, rel=1e-9, abs=1e-12)
    return [fast[c][1] for c in range(q0.shape[0])]


@pytest.mark.parametrize("name", sorted(TARGETS))
@pytest.mark.parametrize("max_depth", [4, 10])
@pytest.mark.parametrize("dense", [False, True])
def test_iterative_kernel_matches_recursive_oracle(name, max_depth, dense, engine):
    log_prob, dim = TARGETS[name]
    # seeded from the case's name: the same cases in every process (hash() of a str is salted)
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name} {max_depth} {dense}".encode()))
    # step sizes from 0.01 (long trees, max depth) to 30 (divergent)
    q0, step, inverse = random_cases(gen, 24, dim, (0.01, 30.0), dense)
    kernel = hmc.NUTS(max_tree_depth=max_depth)
    assert_matches_oracle(kernel, log_prob, q0, step, inverse, 7, engine, max_depth=max_depth)


def test_matches_oracle_where_the_checks_across_subtrees_matter(engine):
    """100-D iid normal, step sizes 0.3..1.5: without Stan's two extra U-turn checks per
    merge, about a fifth of these transitions run to depth 6-10 (stan#2799)."""
    chains, dim = 64, 100
    log_prob = gaussian(torch.ones(dim, dtype=torch.float64))
    q0 = torch.randn(chains, dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    step = torch.linspace(0.3, 1.5, chains, dtype=torch.float64)
    inverse = torch.ones(chains, dim, dtype=torch.float64)
    infos = assert_matches_oracle(hmc.NUTS(), log_prob, q0, step, inverse, 3, engine)
    assert all(info["tree_depth"] <= 4 for info in infos)


def test_matches_oracle_where_the_checks_within_subtrees_matter(engine):
    """2-D scaled Gaussian, step sizes 0.1..0.5, 1024 chains: 6 of these transitions end
    on a merge's check from the last point of the left half across the right half, and on
    no other check; without that check they take 2-4 more leapfrog steps. The random
    cases above meet such a transition about once in 900."""
    log_prob = gaussian(torch.tensor([0.1, 3.0], dtype=torch.float64))
    q0, step, inverse = random_cases(torch.Generator().manual_seed(0), 1024, 2, (0.1, 0.5))
    assert_matches_oracle(hmc.NUTS(), log_prob, q0, step, inverse, 7, engine)


def test_oracle_cases_cover_divergence_and_max_depth(engine):
    """The comparison above includes diverging, max-depth and ordinary U-turn cases."""
    log_prob, dim = TARGETS["gaussian"]
    chains = 40
    q0 = torch.randn(chains, dim, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    step = torch.logspace(-2, 1.5, chains, dtype=torch.float64)
    inverse = torch.ones(chains, dim, dtype=torch.float64)
    fast, _, _ = run_fast(hmc.NUTS(max_tree_depth=5), log_prob, q0, step, inverse, 1, engine)
    infos = [fast[c][1] for c in range(chains)]
    assert any(i["diverging"] for i in infos)
    assert any(i["reached_max_treedepth"] for i in infos)
    assert any(not i["diverging"] and not i["reached_max_treedepth"] for i in infos)


def test_plain_transition_call_is_one_transition_of_each_chain(engine):
    """NUTS.transition, the call for loops written by hand, runs each chain's transition
    number ``counter`` to its end: the same transitions as the kernel's ticks (and so as
    the oracle) for counter 0, other random numbers for counter 1."""
    log_prob, dim = TARGETS["student_t"]
    q0, step, inverse = random_cases(torch.Generator().manual_seed(5), 6, dim, (0.05, 1.0))
    kernel = hmc.NUTS()
    fast, keys, potential = run_fast(kernel, log_prob, q0, step, inverse, 2, engine)
    state = in_engine(hmc.State(q0, *potential.value_and_grad(q0)), engine)
    params = Params(in_engine(step, engine), metric_from_inverse(inverse))
    for counter in (0, 1):
        new, info = map(
            as_tensors,
            kernel.transition(state, params, potential, keys, torch.full((6,), counter)),
        )
        for c in range(6):
            same = torch.equal(new.position[c], fast[c][0])
            assert same == (counter == 0), (counter, c)
            if counter == 0:
                assert info.n_steps[c].item() == fast[c][1]["n_steps"]
