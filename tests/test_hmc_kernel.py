"""The static HMC kernel, with hand-set parameters (no adaptation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import assert_moments, in_engine

import hmc
from hmc.arrays import as_arrays
from hmc.kernels.base import Params, Phase
from hmc.kernels.hmc import HMCState
from hmc.metric import metric_from_inverse
from hmc.random import Stream, chain_keys, normal, uniform

DTYPE = torch.float64


def elementwise(q: torch.Tensor) -> torch.Tensor:
    """A non-Gaussian elementwise log density (so subsets of rows give the same bits)."""
    return (-0.5 * q**2 - 0.1 * q**4 + 0.3 * q).sum(-1)


def initial(potential, q):
    U, grad = potential.value_and_grad(q)
    return hmc.State(q, U, grad)


def params(step_size, inverse):
    return hmc.Params(torch.as_tensor(step_size, dtype=DTYPE), metric_from_inverse(inverse))


Q0 = torch.tensor(
    [[0.3, -0.2, 1.0], [1.2, 0.1, -0.5], [-0.8, 0.9, 0.0], [0.0, 0.0, 0.4]], dtype=DTYPE
)


def test_transition_matches_a_hand_written_one():
    potential = hmc.Potential(elementwise, batched=True)
    kernel = hmc.HMC(num_steps=7)
    inverse = torch.tensor([0.5, 1.0, 2.0], dtype=DTYPE).expand(4, 3).clone()
    p = params([0.5, 0.6, 0.7, 0.8], inverse)
    keys = chain_keys(3, torch.arange(4))
    counter = torch.tensor([0, 5, 9, 2])
    state = initial(potential, Q0)
    new, info = kernel.transition(state, p, potential, keys, counter)

    noise = normal(keys, Stream.MOMENTUM, counter, 3, DTYPE)
    momentum = noise / inverse.sqrt()  # ~ N(0, M) with M = 1 / inverse
    h0 = state.potential + 0.5 * (momentum**2 * inverse).sum(-1)
    s, m = state, momentum
    for _ in range(7):
        s, m = hmc.leapfrog(s, m, p.step_size.unsqueeze(-1), p.metric, potential)
    h = s.potential + 0.5 * (m**2 * inverse).sum(-1)
    error = h - h0
    accept_prob = torch.exp(torch.clamp(-error, max=0.0))
    u = uniform(keys, Stream.ACCEPT, counter, 1, DTYPE)[:, 0]
    accepted = u < accept_prob
    assert accepted.any() and not accepted.all()  # both branches are exercised
    expected = torch.where(accepted.unsqueeze(-1), s.position, Q0)
    torch.testing.assert_close(new.position, expected, rtol=0, atol=0)
    torch.testing.assert_close(
        new.potential, torch.where(accepted, s.potential, state.potential), rtol=0, atol=0
    )
    torch.testing.assert_close(
        new.grad, torch.where(accepted.unsqueeze(-1), s.grad, state.grad), rtol=0, atol=0
    )
    torch.testing.assert_close(info.acceptance_rate, accept_prob, rtol=1e-15, atol=0)
    assert info.n_steps.tolist() == [7, 7, 7, 7]
    assert not info.diverging.any()
    torch.testing.assert_close(info.energy, torch.where(accepted, h, h0), rtol=1e-15, atol=0)
    torch.testing.assert_close(
        info.energy_error, torch.where(accepted, error, 0.0), rtol=1e-12, atol=1e-15
    )
    torch.testing.assert_close(info.max_energy_error, error.abs(), rtol=1e-12, atol=1e-15)


def test_gradient_count_is_one_per_leapfrog_step():
    potential = hmc.Potential(elementwise, batched=True)
    state = initial(potential, Q0)
    assert potential.evaluations == 4
    keys = chain_keys(0, torch.arange(4))
    p = params([0.2] * 4, torch.ones(4, 3, dtype=DTYPE))
    hmc.HMC(num_steps=5).transition(state, p, potential, keys, torch.zeros(4, dtype=torch.int64))
    assert potential.evaluations == 4 + 4 * 5
    _, info = hmc.HMC().transition(state, p, potential, keys, torch.ones(4, dtype=torch.int64))
    assert len(set(info.n_steps.tolist())) > 1  # ragged
    assert potential.evaluations == 4 + 4 * 5 + int(info.n_steps.sum())


def test_random_number_of_steps_equals_separate_fixed_runs():
    """Chains with different drawn lengths integrate exactly as if each ran alone."""
    potential = hmc.Potential(elementwise, batched=True)
    kernel = hmc.HMC(trajectory_length=3.0)
    inverse = torch.tensor([[1.0, 0.5, 2.0]], dtype=DTYPE).expand(4, 3).clone()
    p = params([0.2, 0.3, 0.15, 0.25], inverse)
    keys = chain_keys(9, torch.arange(4))
    counter = torch.tensor([1, 2, 3, 4])
    state = initial(potential, Q0)
    new, info = kernel.transition(state, p, potential, keys, counter)
    steps = info.n_steps.tolist()
    assert len(set(steps)) > 1
    for c in range(4):
        alone = hmc.HMC(num_steps=steps[c])
        rows = torch.tensor([c])
        single_state = hmc.State(*(x[c : c + 1] for x in state))
        single_params = hmc.Params(p.step_size[rows], metric_from_inverse(inverse[rows]))
        s, i = alone.transition(single_state, single_params, potential, keys[rows], counter[rows])
        torch.testing.assert_close(new.position[rows], s.position, rtol=0, atol=1e-15)
        torch.testing.assert_close(
            info.acceptance_rate[rows], i.acceptance_rate, rtol=1e-12, atol=1e-15
        )


def test_drawn_number_of_steps_is_uniform_up_to_the_trajectory_length():
    kernel = hmc.HMC(trajectory_length=2.0)
    chains = 2000
    keys = chain_keys(1, torch.arange(chains))
    step_size = torch.full((chains,), 0.3, dtype=DTYPE)  # ceil(2 / 0.3) = 7
    counts = np.zeros(8, dtype=int)
    for counter in range(5):
        n = kernel.num_steps_for(Params(step_size, None), keys, torch.full((chains,), counter))
        assert n.dtype == torch.int64
        assert n.min() >= 1 and n.max() <= 7
        counts += np.bincount(n.numpy(), minlength=8)
    assert counts[0] == 0
    expected = counts.sum() / 7
    chi2 = ((counts[1:] - expected) ** 2 / expected).sum()
    assert chi2 < 6 + 4.5 * math.sqrt(12), counts  # 6 degrees of freedom
    # the cap
    capped = hmc.HMC(max_steps=3).num_steps_for(
        Params(torch.full((50,), 1e-4, dtype=DTYPE), None),
        keys[:50],
        torch.zeros(50, dtype=torch.int64),
    )
    assert capped.max() <= 3 and capped.min() >= 1
    fixed = hmc.HMC(num_steps=4).num_steps_for(
        Params(step_size[:3], None), keys[:3], torch.zeros(3, dtype=torch.int64)
    )
    assert fixed.tolist() == [4, 4, 4]


def test_divergent_transitions_are_flagged_and_rejected():
    potential = hmc.Potential(lambda q: -0.5 * (q**2).sum(-1) * 100.0, batched=True)
    state = initial(potential, Q0)
    keys = chain_keys(0, torch.arange(4))
    # chains 0-1: a step size far beyond the stability limit 2 / 10; chains 2-3: tiny
    p = params([5.0, 3.0, 1e-3, 1e-3], torch.ones(4, 3, dtype=DTYPE))
    new, info = hmc.HMC(num_steps=20).transition(
        state, p, potential, keys, torch.zeros(4, dtype=torch.int64)
    )
    assert info.diverging.tolist() == [True, True, False, False]
    assert torch.equal(new.position[:2], Q0[:2])
    assert (info.acceptance_rate[:2] == 0).all()
    assert (info.acceptance_rate[2:] > 0.99).all()
    assert not torch.isnan(info.energy).any()
    # the threshold is the kernel's setting, and one-sided: only H - H0 > threshold
    # diverges (a divergent proposal is rejected, so its reported energy_error is 0)
    _, info = hmc.HMC(num_steps=20, max_energy_error=1e-12).transition(
        state, p, potential, keys, torch.zeros(4, dtype=torch.int64)
    )
    assert (info.energy_error < 0).any()
    assert torch.equal(info.diverging, ~(info.energy_error < 0))


def test_proposal_into_zero_density_is_a_divergent_rejection():
    def wall(q):
        lp = -0.5 * (q**2).sum(-1)
        return torch.where(q[..., 0] < 0.5, lp, -torch.inf)

    potential = hmc.Potential(wall, batched=True)
    q = torch.tensor([[0.4, 0.0], [-1.0, 0.0]], dtype=DTYPE)
    state = initial(potential, q)
    keys = chain_keys(0, torch.arange(2))
    # momentum draws are random: try counters until chain 0 is pushed across the wall
    for counter in range(50):
        c = torch.full((2,), counter)
        new, info = hmc.HMC(num_steps=3).transition(
            state, params([0.5, 0.01], torch.ones(2, 2, dtype=DTYPE)), potential, keys, c
        )
        assert not torch.isnan(new.position).any() and not torch.isnan(info.energy).any()
        assert torch.isfinite(new.potential).all()
        if info.diverging[0]:
            assert torch.equal(new.position[0], q[0]) and info.acceptance_rate[0] == 0
            return
    pytest.fail("no proposal crossed the wall")


def test_step_completes_a_transition_of_every_chain():
    potential = hmc.Potential(elementwise, batched=True)
    state = initial(potential, Q0)
    kernel = hmc.HMC(num_steps=3)
    p = params([0.5] * 4, torch.ones(4, 3, dtype=DTYPE))
    keys = chain_keys(0, torch.arange(4))
    kernel_state = kernel.init(state)
    assert isinstance(kernel_state, HMCState) and kernel_state.transitions == 0
    phase = Phase(torch.ones(4, dtype=torch.bool), torch.full((4,), 2))
    positions = []
    for _ in range(2):
        kernel_state, step = kernel.step(kernel_state, p, potential, keys, phase)
        assert step.done.tolist() == [True] * 4
        positions.append(kernel_state.state.position)
        assert step.info.n_steps.tolist() == [3] * 4
    assert kernel_state.transitions == 2
    assert not torch.equal(positions[0], Q0)  # step 0.5: mostly accepted
    # the transitions equal direct calls of transition() with counters 0, 1
    s = state
    for t in range(2):
        s, _ = kernel.transition(s, p, potential, keys, torch.full((4,), t))
    assert torch.equal(s.position, positions[1])


@pytest.mark.parametrize("num_steps", [None, 2])
def test_step_draws_in_blocks_what_transition_draws_one_by_one(num_steps):
    """step() draws the random numbers of 64 transitions at a time; across a block
    boundary its chain stays bit-identical to transition() with counters 0, 1, 2, ..."""
    potential = hmc.Potential(elementwise, batched=True)
    state = initial(potential, Q0)
    kernel = hmc.HMC(num_steps=num_steps, trajectory_length=2.0)
    p = params([0.4] * 4, torch.ones(4, 3, dtype=DTYPE))
    keys = chain_keys(2, torch.arange(4))
    kernel_state = kernel.init(state)
    phase = Phase(torch.ones(4, dtype=torch.bool), torch.full((4,), 70))
    s = state
    for t in range(70):
        kernel_state, step = kernel.step(kernel_state, p, potential, keys, phase)
        s, info = kernel.transition(s, p, potential, keys, torch.full((4,), t))
        assert step.done.all()
        assert torch.equal(step.state.position, s.position), t
        assert torch.equal(step.info.n_steps, info.n_steps), t
    assert kernel_state.block is not None and kernel_state.block.noise.shape[1] == 64


# ---------------------------------------------------------------------- engines
@pytest.mark.parametrize("num_steps", [None, 4])
@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("chains", [1, 4])
def test_both_engines_run_the_same_transitions(num_steps, dense, chains):
    """The NumPy engine's transitions are the torch engine's from the same random numbers
    (one transition function runs on both kinds of arrays): over 70
    transitions (a block boundary included) the chains agree to rounding, with the same
    numbers of steps, acceptances and gradient evaluations. An unbatched density, so
    that one chain takes the energy module's one-row shortcut."""
    step_size = [0.45, 0.3, 0.6, 0.5][:chains]  # per chain: some rejections
    inverse = torch.tensor([0.5, 1.0, 2.0], dtype=DTYPE).expand(chains, 3).clone()
    if dense:
        inverse = torch.diag_embed(inverse) + 0.2 * (1 - torch.eye(3, dtype=DTYPE))
    p = params(step_size, inverse)
    keys = chain_keys(4, torch.arange(chains))
    phase = Phase(torch.ones(chains, dtype=torch.bool), torch.full((chains,), 70))
    runs = {}
    for engine in ("torch", "numpy"):
        potential = hmc.Potential(elementwise)
        kernel = hmc.HMC(num_steps=num_steps, trajectory_length=2.0)
        kernel_state = kernel.init(in_engine(initial(potential, Q0[:chains]), engine))
        assert kernel_state.on_host == (engine == "numpy")
        engine_params = Params(in_engine(p.step_size, engine), p.metric)
        reports = []
        for _ in range(70):
            engine_phase = Phase(*(in_engine(x, engine) for x in phase))
            kernel_state, step = kernel.step(
                kernel_state, engine_params, potential, keys, engine_phase
            )
            assert step.done.all()
            reports.append((step.state, step.info))
        runs[engine] = (reports, potential.evaluations)
    (tensor, tensor_count), (host, host_count) = runs["torch"], runs["numpy"]
    assert host_count == tensor_count
    for (state_t, info_t), (state_h, info_h) in zip(tensor, host, strict=True):
        for a, b in zip(state_h, state_t, strict=True):  # the host reports NumPy arrays
            assert isinstance(a, np.ndarray) and torch.from_numpy(a).dtype == b.dtype
            np.testing.assert_allclose(a, b.numpy(), rtol=1e-12, atol=1e-12)
        for name, a, b in zip(info_h._fields, info_h, info_t, strict=True):
            assert torch.from_numpy(a).dtype == b.dtype, name
            np.testing.assert_allclose(a, b.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)
    rates = np.stack([info.acceptance_rate for _, info in host])
    assert (rates < 1).mean() > 0.3 and (rates > 0.5).mean() > 0.3


def test_numpy_engine_rejects_a_divergence_without_nan():
    """A proposal into zero density (a log density of NaN beyond a wall), NumPy engine."""

    def wall(q):
        return torch.where(q[0] < 0.5, -0.5 * (q**2).sum(), torch.nan)

    potential = hmc.Potential(wall)
    q = torch.tensor([[0.4, 0.0]], dtype=DTYPE)
    kernel = hmc.HMC(num_steps=3)
    kernel_state = kernel.init(as_arrays(initial(potential, q)))
    keys, phase = chain_keys(0, torch.arange(1)), Phase(np.ones(1, dtype=bool), np.full(1, 40))
    diverged = 0
    for _ in range(40):
        kernel_state, step = kernel.step(
            kernel_state,
            Params(np.array([0.5]), metric_from_inverse(torch.ones(1, 2, dtype=DTYPE))),
            potential,
            keys,
            phase,
        )
        state, info = step.state, step.info
        assert np.isfinite(state.potential).all() and not np.isnan(info.energy).any()
        if info.diverging[0]:
            diverged += 1
            assert info.acceptance_rate[0] == 0 and info.energy_error[0] == 0
    assert diverged > 0


def test_static_hmc_with_hand_set_parameters_is_exact():
    """No adaptation: a mismatched metric and a large step size (many rejections) still
    leave N(mean, cov) invariant."""
    mean = np.array([1.0, -2.0])
    cov = np.array([[1.0, 0.6], [0.6, 2.0]])
    precision = torch.linalg.inv(torch.tensor(cov))
    mean_t = torch.tensor(mean)

    def log_prob(q):
        d = q - mean_t
        return -0.5 * ((d @ precision) * d).sum(-1)

    chains = 16
    potential = hmc.Potential(log_prob, batched=True)
    gen = torch.Generator().manual_seed(5)
    start = (
        mean_t
        + torch.randn(chains, 2, generator=gen, dtype=DTYPE)
        @ torch.linalg.cholesky(torch.tensor(cov)).T
    )
    state = initial(potential, start)
    kernel = hmc.HMC(num_steps=4)
    p = params([0.9] * chains, torch.tensor([[0.3, 3.0]], dtype=DTYPE).expand(chains, 2).clone())
    keys = chain_keys(21, torch.arange(chains))
    draws, accepted = [], []
    for t in range(1000):
        state, info = kernel.transition(state, p, potential, keys, torch.full((chains,), t))
        draws.append(state.position)
        accepted.append(info.acceptance_rate)
    x = torch.stack(draws, dim=1).numpy()
    rate = torch.stack(accepted).mean().item()
    assert 0.3 < rate < 0.9, rate  # the Metropolis correction matters here
    assert_moments(x, mean, cov)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_steps": 0}, "num_steps"),
        ({"num_steps": 2.5}, "num_steps"),
        ({"num_steps": True}, "num_steps"),
        ({"trajectory_length": 0.0}, "trajectory_length"),
        ({"max_steps": 0}, "max_steps"),
        ({"max_energy_error": -1.0}, "max_energy_error"),
    ],
)
def test_settings_are_validated(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hmc.HMC(**kwargs)
