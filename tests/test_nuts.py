"""NUTS: tree invariants, Stan's missed-U-turn regression, statistics against exact
moments (MCSE-based tolerances), divergences on funnels, and per-chain reproducibility."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from conftest import (
    assert_moments,
    diagonal_gaussian_log_prob,
    gaussian_log_prob,
    mcse_z_scores,
    z_bound,
)

import hmc
from hmc.arrays import as_arrays
from hmc.state import true_rows


def stats(dt, name):
    return dt["sample_stats"][name].values


def run(log_prob, dim, **kw):
    options = dict(dim=dim, chains=4, seed=1, progress=False, batched=True)
    options.update(kw)
    return hmc.sample(log_prob, **options)


def standard_normal(q):
    return -0.5 * (q**2).sum(-1)


# ---------------------------------------------------------------------- tree invariants
def test_tree_invariants_and_depth_cap(engine):
    """Stan counts only completed valid doublings in tree_depth, so a transition that ends
    on a turning or divergent subtree took between 2**depth - 1 and 2**(depth+1) - 1
    leapfrog steps; at the cap it took exactly 2**depth - 1."""
    dt = run(
        standard_normal,
        5,
        kernel=hmc.NUTS(max_tree_depth=3),
        warmup=0,
        step_size=0.05,
        draws=100,
        engine=engine,
    )
    depth, steps = stats(dt, "tree_depth"), stats(dt, "n_steps")
    assert depth.max() <= 3
    assert (steps >= 2**depth - 1).all() and (steps <= 2 ** (depth + 1) - 1).all()
    capped = stats(dt, "reached_max_treedepth")
    assert capped.all()  # 7 steps of 0.05 are far from a U-turn
    assert (steps[capped] == 2**3 - 1).all()
    assert (stats(dt, "acceptance_rate") <= 1).all()


def test_huge_step_size_diverges_at_once(engine):
    dt = run(standard_normal, 3, warmup=0, step_size=100.0, draws=20, engine=engine)
    assert stats(dt, "diverging").all()
    assert (stats(dt, "n_steps") == 1).all() and (stats(dt, "tree_depth") == 0).all()
    assert np.isfinite(dt["posterior"]["x"].values).all()


def test_small_step_size_builds_long_trees():
    """Half an orbit of a unit normal is about pi / 0.01 ~ 300 steps of 0.01 (a start near
    a turning point of the orbit, where the momentum is small, can end sooner)."""
    dt = run(standard_normal, 5, warmup=0, step_size=0.01, draws=10)
    steps = stats(dt, "n_steps")
    assert (steps > 10).mean() > 0.9 and np.median(steps) > 100
    assert not stats(dt, "diverging").any()


@pytest.mark.parametrize("step_size", [0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.2])
def test_no_missed_u_turns_on_iid_normal(step_size):
    """Stan's regression (stan#2799): on a 100-D iid normal the momentum-sum criterion
    with the extra checks never lets a tree run to the cap, and the trajectory stops after
    about half an orbit: 2**depth ~ pi / eps steps (at eps = 0.05 every tree has depth 6,
    63 steps). Without the extra checks, trees at eps 0.3..1.5 run to depth 6-10 (see
    test_nuts_oracle.py)."""
    dt = run(standard_normal, 100, warmup=0, step_size=step_size, draws=25, seed=3)
    assert not stats(dt, "reached_max_treedepth").any()
    expected = math.log2(math.pi / step_size)
    assert abs(stats(dt, "tree_depth").mean() - expected) < 1.25


# ---------------------------------------------------------------------- statistics
@pytest.mark.parametrize("engine", ["numpy", pytest.param("torch", marks=pytest.mark.slow)])
def test_correlated_gaussian_2d(engine):
    precision = torch.tensor([[10.25, -9.74], [-9.74, 10.25]], dtype=torch.float64)
    cov = torch.linalg.inv(precision).numpy()
    dt = run(gaussian_log_prob(np.zeros(2), cov), 2, chains=8, warmup=300, draws=500, engine=engine)
    assert_moments(dt["posterior"]["x"].values, np.zeros(2), cov)
    assert not stats(dt, "diverging").any()


def test_ill_conditioned_diagonal_gaussian_100d():
    sd = np.logspace(-2, 0, 100)
    # early warmup (unit metric, step ~ 0.01) would build 1023-step trees: cap it at 2**7
    kernel = hmc.NUTS(max_tree_depth=(7, 10))
    dt = run(
        diagonal_gaussian_log_prob(np.zeros(100), sd), 100, warmup=500, draws=500, kernel=kernel
    )
    assert_moments(dt["posterior"]["x"].values, np.zeros(100), sd**2, correlations=False)
    inverse = dt["adaptation"]["inverse_metric"].values
    ratio = inverse / sd**2
    assert (ratio > 0.5).all() and (ratio < 2).all()


@pytest.mark.parametrize("engine", ["numpy", pytest.param("torch", marks=pytest.mark.slow)])
def test_student_t_10d(engine):
    """t with 5 degrees of freedom (variance 5/3). Its squares have a finite variance but
    too heavy a tail for a reliable MCSE of the variance, so the tails are checked through
    indicator functions (bounded, so their MCSE is reliable) at the 0.8, 0.9 and 0.98
    central quantiles (t_5 = 1.476, 2.015, 3.365), and the pooled variance coarsely."""
    nu = 5.0

    def log_prob(q):
        return (-(nu + 1) / 2 * torch.log1p(q**2 / nu)).sum(-1)

    dt = run(log_prob, 10, chains=8, warmup=300, draws=500, engine=engine)
    x = dt["posterior"]["x"].values
    inside = np.concatenate([np.abs(x) < t for t in (1.476, 2.015, 3.365)], axis=-1)
    truth = np.repeat([0.8, 0.9, 0.98], 10)
    scores, _, _ = mcse_z_scores(
        np.concatenate((x, inside), axis=-1), np.concatenate((np.zeros(10), truth))
    )
    assert (np.abs(scores) < z_bound(scores.size)).all(), scores
    assert abs((x**2).mean() / (nu / (nu - 2)) - 1) < 0.1


def funnel_centred(q):
    v, x = q[:, 0], q[:, 1:]
    return -(v**2) / 18 - 0.5 * (x**2).sum(-1) * torch.exp(-v) - 0.5 * x.shape[-1] * v


def funnel_non_centred(q):
    return -(q[:, 0] ** 2) / 18 - 0.5 * (q[:, 1:] ** 2).sum(-1)


@pytest.mark.slow  # 13 s: the quick tier keeps within its five minutes
def test_centred_funnel_reports_divergences():
    """The neck of the centred funnel (v < -4) needs step sizes far below the adapted one:
    Stan and this sampler both report divergences there (about 1-4 % of draws). Many
    short chains: the draws that matter here are the visits to the neck. The divergent
    trajectories overflow the host's NumPy arithmetic, silently (no RuntimeWarning)."""
    kernel = hmc.NUTS(max_tree_depth=6)  # trees in the funnel's mouth are long: cap them
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        # the end-of-run count of divergences is expected here, and so is R-hat's verdict
        # on v (the chains visit the neck unevenly)
        warnings.filterwarnings("ignore", r"\d+ of \d+ kept transitions", RuntimeWarning)
        warnings.filterwarnings("ignore", r"\d+ of \d+ coordinates .* have not settled")
        dt = run(
            funnel_centred,
            10,
            chains=16,
            warmup=200,
            draws=250,
            kernel=kernel,
            seed=3,
            save_warmup=True,
        )
    assert stats(dt, "diverging").sum() > 0
    # one gradient per leapfrog step, plus each chain's start and its step-size searches
    # (one at the start and one per metric update, a few steps each)
    steps = stats(dt, "n_steps").sum() + dt["warmup_sample_stats"]["n_steps"].values.sum()
    extra = dt.attrs["n_gradient_evaluations"] - steps
    assert 16 * (1 + 2 * 4) <= extra <= 16 * 60, extra
    assert np.isfinite(dt["posterior"]["x"].values).all()


def test_non_centred_funnel_samples_cleanly():
    dt = run(funnel_non_centred, 10, warmup=300, draws=500)
    assert stats(dt, "diverging").mean() < 0.005
    v = dt["posterior"]["x"].values[..., :1]
    assert_moments(v, [0.0], [9.0])


# ---------------------------------------------------------------------- reproducibility
def test_same_seed_same_draws_and_different_seeds_differ():
    a = run(standard_normal, 3, warmup=100, draws=50, seed=5)
    b = run(standard_normal, 3, warmup=100, draws=50, seed=5)
    c = run(standard_normal, 3, warmup=100, draws=50, seed=6)
    for group in ("posterior", "sample_stats"):
        for name in a[group].data_vars:
            assert np.array_equal(a[group][name].values, b[group][name].values), name
    assert not np.array_equal(a["posterior"]["x"].values, c["posterior"]["x"].values)


def test_warmup_depth_cap_pair_and_utilization(engine):
    dt = run(
        standard_normal,
        5,
        kernel=hmc.NUTS(max_tree_depth=(2, 10)),
        engine=engine,
        warmup=50,
        draws=50,
        save_warmup=True,
        chains=6,
    )
    assert dt["warmup_sample_stats"]["tree_depth"].values.max() <= 2
    assert stats(dt, "tree_depth").max() > 2 or stats(dt, "n_steps").max() > 3
    assert dt.attrs["chain_utilization"] > 0.9


def test_a_lone_chain_uses_every_tick(engine):
    """One chain is busy in every tick of its run, the first included, so the fraction of
    chain-slots that did leapfrog work is exactly 1."""
    dt = run(
        standard_normal,
        3,
        chains=1,
        warmup=0,
        draws=30,
        step_size=0.3,
        engine=engine,
    )
    assert stats(dt, "n_steps")[0, 0] > 1  # the first transition outlasts the first tick
    assert dt.attrs["chain_utilization"] == 1.0


# ---------------------------------------------------------------------- engines
def test_both_engines_run_the_same_transitions():
    """With a given step size, the NumPy engine (each tree on the host) and the torch
    engine (batched trees) run the same transitions from the same random numbers,
    recording included: same tree sizes, depths and divergences, draws equal up to
    rounding (their arithmetic rounds differently in the last bit, which stays at
    rounding level over 100 draws at a fixed step size)."""
    target = diagonal_gaussian_log_prob(np.zeros(5), np.array([0.1, 0.5, 1.0, 2.0, 10.0]))
    numpy_run, torch_run = (
        run(target, 5, warmup=0, draws=100, step_size=0.1, seed=4, engine=engine)
        for engine in ("numpy", "torch")
    )
    for name in ("n_steps", "tree_depth", "diverging", "reached_max_treedepth"):
        assert np.array_equal(stats(numpy_run, name), stats(torch_run, name)), name
    for name in ("acceptance_rate", "energy", "step_size", "lp"):
        np.testing.assert_allclose(stats(numpy_run, name), stats(torch_run, name), atol=1e-12)
    np.testing.assert_allclose(
        numpy_run["posterior"]["x"].values, torch_run["posterior"]["x"].values, atol=1e-12
    )
    assert numpy_run.attrs["engine"] == "numpy" and torch_run.attrs["engine"] == "torch"
    assert numpy_run.attrs["n_gradient_evaluations"] == torch_run.attrs["n_gradient_evaluations"]


def test_the_layout_follows_the_engine_not_the_number_of_chains():
    """NumPy arrays get each chain's tree on the host, tensors the batched trees, at any
    number of chains; the sampler picks the engine by device alone."""
    from hmc.arrays import engine_for
    from hmc.kernels.nuts import NUTSState
    from hmc.kernels.nuts_host import HostNUTSState

    def state(chains, device="cpu"):
        q = torch.zeros(chains, 3, dtype=torch.float64, device=device)
        return hmc.State(q, torch.zeros(chains, dtype=torch.float64, device=device), q)

    kernel = hmc.NUTS()
    for chains in (1, 128, 129, 1000):
        assert isinstance(kernel.init(as_arrays(state(chains))), HostNUTSState)
        assert isinstance(kernel.init(state(chains)), NUTSState)
    assert isinstance(kernel.init(state(2, "meta")), NUTSState)
    for chains in (1, 200):
        dt = run(standard_normal, 2, chains=chains, warmup=0, draws=2, step_size=0.5)
        assert dt.attrs["engine"] == "numpy"
    with pytest.raises(ValueError, match="engine must be one of"):
        run(standard_normal, 2, engine="gpu")
    with pytest.raises(ValueError, match="engine='numpy' computes on the CPU"):
        engine_for(torch.device("meta"), "numpy")  # any device but the CPU


def test_host_trees_own_their_vectors():
    """Every vector a host-kept tree holds is its own (D,) array, not a row view that would
    keep a whole tick's (B, D) batch alive (memory stays O(C x depth x D))."""
    from hmc.kernels.base import Params, Phase
    from hmc.metric import metric_from_inverse
    from hmc.random import chain_keys

    chains, dim = 4, 3
    potential = hmc.Potential(standard_normal, batched=True)
    q = torch.randn(chains, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    U, g = potential.value_and_grad(q)
    kernel = hmc.NUTS()
    kernel_state = kernel.init(as_arrays(hmc.State(q, U, g)))
    params = Params(
        np.full(chains, 0.05), metric_from_inverse(torch.ones(chains, dim, dtype=torch.float64))
    )
    keys = chain_keys(0, torch.arange(chains))
    phase = Phase(np.ones(chains, dtype=bool), np.full(chains, 1000))
    for _ in range(40):  # deep trees at this step size: stacks several levels high
        kernel_state, _ = kernel.step(kernel_state, params, potential, keys, phase)
    arrays = []
    for chain in kernel_state.chains:
        records = [chain.edge, chain.other, chain.sample, *filter(None, chain.stack)]
        for record in records:
            for item in record:
                arrays += item if isinstance(item, tuple) else [item]
        arrays += [chain.near_p, chain.near_v, chain.other_v, chain.rho]
    vectors = [a for a in arrays if isinstance(a, np.ndarray)]
    assert len(vectors) > 20 * chains
    assert all(a.shape == (dim,) and a.base is None for a in vectors)


def test_true_rows_are_nonzero_without_a_device_read():
    """The batched trees pick the busy chains' rows from a count read with the
    loop's counters; they must be exactly ``nonzero``'s, in the same order."""
    gen = torch.Generator().manual_seed(0)
    for chains in (1, 7, 300):
        for p in (0.0, 0.3, 0.9, 1.0):
            mask = torch.rand(chains, generator=gen) < p
            expected = mask.nonzero().flatten()
            assert torch.equal(true_rows(mask, int(mask.sum())), expected)
