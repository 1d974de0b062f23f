"""Warmup adaptation: Stan's schedule, dual averaging, Welford (co)variances."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest
import torch

import hmc
from hmc.adapt import (
    build_schedule,
    dual_averaging_final,
    dual_averaging_init,
    dual_averaging_update,
    welford_covariance,
    welford_init,
    welford_update,
)
from hmc.adapt.warmup import StanWarmup
from hmc.kernels.base import Params
from hmc.metric import metric_from_inverse
from hmc.random import chain_keys
from hmc.step_size_search import find_reasonable_step_size

DTYPE = torch.float64


# ---------------------------------------------------------------------- schedule
@pytest.mark.parametrize(
    ("num_warmup", "windows"),
    [
        (150, [(75, 99)]),
        (200, [(75, 99), (100, 149)]),
        (280, [(75, 99), (100, 229)]),
        (500, [(75, 99), (100, 149), (150, 249), (250, 449)]),
        (1000, [(75, 99), (100, 149), (150, 249), (250, 449), (450, 949)]),
        (151, [(75, 99), (100, 100)]),  # Stan stretches/shrinks the last window to fit
        (2000, [(75, 99), (100, 149), (150, 249), (250, 449), (450, 849), (850, 1949)]),
        # fewer than 75 + 25 + 50: buffers of 15 % and 10 %, one window in between
        (100, [(15, 89)]),
        (149, [(22, 134)]),
        (20, [(3, 17)]),
        # under 20 iterations: no metric adaptation
        (19, []),
        (10, []),
        (0, []),
    ],
)
def test_schedule_table(num_warmup, windows):
    schedule = build_schedule(num_warmup)
    assert schedule.num_warmup == num_warmup
    assert schedule.windows == windows
    assert schedule.adapts_metric == bool(windows)
    assert schedule.in_window.shape == (num_warmup,) and schedule.window_end.shape == (num_warmup,)
    expected_in = np.zeros(num_warmup, dtype=bool)
    expected_end = np.zeros(num_warmup, dtype=bool)
    for first, last in windows:
        expected_in[first : last + 1] = True
        expected_end[last] = True
    np.testing.assert_array_equal(schedule.in_window.numpy(), expected_in)
    np.testing.assert_array_equal(schedule.window_end.numpy(), expected_end)
    ends = [t for t in range(-1, num_warmup + 1) if schedule.ends_window(t)]
    assert ends == [last for _, last in windows]


def test_schedule_windows_are_contiguous_and_doubling():
    for num_warmup in range(150, 3000, 37):
        windows = build_schedule(num_warmup).windows
        assert windows[0] == (75, 99)
        assert windows[-1][1] == num_warmup - 50 - 1
        for (a0, a1), (b0, b1) in itertools.pairwise(windows):
            assert b0 == a1 + 1
            if (b0, b1) != windows[-1]:
                assert b1 - b0 + 1 == 2 * (a1 - a0 + 1)


# ---------------------------------------------------------------------- dual averaging
def stan_learn_stepsize(eps0, accepts, delta=0.8, gamma=0.05, kappa=0.75, t0=10.0):
    """Stan's stepsize_adaptation::learn_stepsize with plain floats; returns the history."""
    mu = math.log(10 * eps0)
    counter, s_bar, x_bar = 0.0, 0.0, 0.0
    history = []
    for a in accepts:
        a = min(a, 1.0)
        counter += 1
        eta = 1.0 / (counter + t0)
        s_bar = (1 - eta) * s_bar + eta * (delta - a)
        x = mu - s_bar * math.sqrt(counter) / gamma
        w = counter**-kappa
        x_bar = (1 - w) * x_bar + w * x
        history.append((counter, s_bar, x, x_bar))
    return history


def test_dual_averaging_matches_hand_computed_sequence():
    eps0 = [0.5, 2.0, 0.013]
    rng = np.random.default_rng(3)
    accepts = rng.uniform(0.2, 1.3, size=(40, 3))  # values above 1 are clipped to 1
    state = dual_averaging_init(torch.tensor(eps0, dtype=DTYPE))
    torch.testing.assert_close(state.mu, torch.log(10 * torch.tensor(eps0, dtype=DTYPE)))
    torch.testing.assert_close(state.log_step_size, torch.log(torch.tensor(eps0, dtype=DTYPE)))
    for delta in (0.8, 0.65):
        expected = [stan_learn_stepsize(eps0[c], accepts[:, c], delta) for c in range(3)]
        state = dual_averaging_init(torch.tensor(eps0, dtype=DTYPE))
        for t in range(40):
            state = dual_averaging_update(
                state, torch.tensor(accepts[t], dtype=DTYPE), target=delta
            )
            for c in range(3):
                counter, s_bar, x, x_bar = expected[c][t]
                assert state.counter[c].item() == counter
                assert state.s_bar[c].item() == pytest.approx(s_bar, rel=1e-13, abs=1e-15)
                assert state.log_step_size[c].item() == pytest.approx(x, rel=1e-13)
                assert state.x_bar[c].item() == pytest.approx(x_bar, rel=1e-13)
        final = dual_averaging_final(state)
        for c in range(3):
            assert final[c].item() == pytest.approx(math.exp(expected[c][-1][3]), rel=1e-12)


def test_dual_averaging_mask_and_nan():
    state = dual_averaging_init(torch.tensor([1.0, 1.0], dtype=DTYPE))
    mask = torch.tensor([True, False])
    new = dual_averaging_update(state, torch.tensor([0.3, 0.3], dtype=DTYPE), mask)
    assert new.counter.tolist() == [1.0, 0.0]
    for field in ("s_bar", "x_bar", "log_step_size"):
        assert getattr(new, field)[1] == getattr(state, field)[1]
    # a NaN acceptance statistic counts as 0 (a divergent transition)
    nan = dual_averaging_update(state, torch.tensor([math.nan, 0.0], dtype=DTYPE))
    assert torch.equal(nan.s_bar[0], nan.s_bar[1]) and not torch.isnan(nan.x_bar).any()


def test_dual_averaging_converges_to_the_target_on_a_model_problem():
    """With acceptance exp(-eps^2) the step size converges to sqrt(-log delta)."""
    state = dual_averaging_init(torch.tensor([0.01, 10.0], dtype=DTYPE))
    for _ in range(3000):
        eps = torch.exp(state.log_step_size)
        state = dual_averaging_update(state, torch.exp(-(eps**2)))
    final = dual_averaging_final(state)
    torch.testing.assert_close(
        final, torch.full((2,), math.sqrt(-math.log(0.8)), dtype=DTYPE), rtol=0.02, atol=0
    )


# ---------------------------------------------------------------------- Welford
@pytest.mark.parametrize("dense", [False, True])
def test_welford_matches_numpy_with_masks(dense):
    rng = np.random.default_rng(1)
    chains, dim, steps = 3, 4, 60
    x = rng.normal(size=(steps, chains, dim)) * [1.0, 10.0, 0.1, 3.0] + [0.0, 100.0, -5.0, 1.0]
    masks = rng.uniform(size=(steps, chains)) < [0.9, 0.5, 0.2]
    state = welford_init(torch.zeros(chains, dim, dtype=DTYPE), dense)
    for t in range(steps):
        state = welford_update(state, torch.tensor(x[t], dtype=DTYPE), torch.tensor(masks[t]))
    estimate = welford_covariance(state)
    assert estimate.shape == ((chains, dim, dim) if dense else (chains, dim))
    for c in range(chains):
        rows = x[masks[:, c], c]
        n = rows.shape[0]
        assert state.count[c].item() == n
        np.testing.assert_allclose(state.mean[c].numpy(), rows.mean(0), rtol=1e-12)
        sample = np.cov(rows, rowvar=False, ddof=1)
        if dense:
            expected = n / (n + 5) * sample + 1e-3 * 5 / (n + 5) * np.eye(dim)
        else:
            expected = n / (n + 5) * np.diag(sample) + 1e-3 * 5 / (n + 5)
        np.testing.assert_allclose(estimate[c].numpy(), expected, rtol=1e-10, atol=1e-14)


def test_welford_regularisation_of_a_constant_sample():
    """Zero sample variance: what is left is the 1e-3 * 5 / (n + 5) jitter."""
    state = welford_init(torch.zeros(1, 2, dtype=DTYPE), dense=False)
    for _ in range(15):
        state = welford_update(state, torch.full((1, 2), 3.0, dtype=DTYPE), torch.tensor([True]))
    torch.testing.assert_close(
        welford_covariance(state), torch.full((1, 2), 1e-3 * 5 / 20, dtype=DTYPE)
    )


# ---------------------------------------------------------------------- step-size heuristic
@pytest.mark.parametrize("scale", [0.01, 1.0, 100.0])
def test_reasonable_step_size_tracks_the_scale(scale):
    def log_prob(q):
        return -0.5 * ((q / scale) ** 2).sum(-1)

    potential = hmc.Potential(log_prob, batched=True)
    chains = 4
    q = torch.full((chains, 3), 0.5 * scale, dtype=DTYPE)
    U, grad = potential.value_and_grad(q)
    state = hmc.State(q, U, grad)
    eps0 = torch.ones(chains, dtype=DTYPE)
    metric = metric_from_inverse(torch.ones(chains, 3, dtype=DTYPE))
    keys = chain_keys(0, torch.arange(chains))
    eps, counter = find_reasonable_step_size(
        state, eps0, metric, keys, torch.zeros(chains, dtype=torch.int64), potential=potential
    )
    # a power of two times the start, of the order of the scale
    powers = torch.log2(eps)
    torch.testing.assert_close(powers, powers.round(), rtol=0, atol=1e-12)
    assert ((eps > 0.1 * scale) & (eps < 10 * scale)).all(), eps
    assert (counter >= 2).all()


def test_first_dual_averaging_shrinks_towards_ten_times_the_initial_step_size(standard_normal):
    """Stan sets mu = log(10 * stepsize) from its ``stepsize`` argument before the
    heuristic runs: the first dual averaging starts at the heuristic's step size but
    shrinks towards ten times the initial one."""
    potential = hmc.Potential(standard_normal, batched=True)
    chains = 3
    q = torch.full((chains, 2), 0.3, dtype=DTYPE)
    state = hmc.State(q, *potential.value_and_grad(q))
    initial = torch.tensor([1.0, 0.01, 30.0], dtype=DTYPE)
    params = Params(initial, metric_from_inverse(torch.ones(chains, 2, dtype=DTYPE)))
    search = functools.partial(find_reasonable_step_size, potential=potential)
    adapter = StanWarmup(build_schedule(100), search)
    warm, tuned = adapter.init(state, params, chain_keys(0, torch.arange(chains)))
    assert not torch.equal(tuned.step_size, initial)  # the heuristic moved every chain
    torch.testing.assert_close(warm.dual_averaging.mu, torch.log(10 * initial))
    torch.testing.assert_close(warm.dual_averaging.log_step_size, torch.log(tuned.step_size))


# ---------------------------------------------------------------------- warmup, end to end
def test_warmup_reaches_the_target_acceptance(standard_normal):
    """Dual averaging holds the acceptance statistic at the target during warmup; the
    final step size exp(x_bar) is frozen for sampling (and, as in Stan, accepts a little
    more often than the target on a Gaussian)."""
    finals = {}
    for target_accept in (0.6, 0.9):
        dt = hmc.sample(
            standard_normal,
            dim=5,
            chains=4,
            warmup=400,  # windows (75, 99), (100, 149), (150, 349); terminal buffer 50
            draws=300,
            kernel=hmc.HMC(),
            target_accept=target_accept,
            seed=11,
            batched=True,
            progress=False,
            save_warmup=True,
        )
        warm = dt["warmup_sample_stats"]["acceptance_rate"].values
        assert warm.shape == (4, 400)
        # 150 iterations per chain, 50 after the restart at iteration 149
        settled = warm[:, 200:350].mean()
        assert abs(settled - target_accept) < 0.04, (target_accept, settled)
        stats = dt["sample_stats"]
        accept = stats["acceptance_rate"].values.mean()
        # exp(x_bar) is smaller than the last iterates: at target 0.6, runs of 4 chains
        # accept 0.75-0.82 on average over seeds 11-13 (chains 0.68-0.85)
        assert target_accept - 0.05 < accept < target_accept + 0.25, (target_accept, accept)
        # the step size is frozen after warmup, per chain, at the adapted value
        step = stats["step_size"].values
        assert (step == step[:, :1]).all()
        np.testing.assert_array_equal(step[:, 0], dt["adaptation"]["step_size"].values)
        warm_step = dt["warmup_sample_stats"]["step_size"].values
        assert not (warm_step == warm_step[:, :1]).all()  # it did adapt
        finals[target_accept] = step[:, 0]
    # a higher target needs smaller steps
    assert finals[0.9].max() < finals[0.6].min(), finals


def test_numpy_engine_adaptation_matches_the_torch_one(standard_normal):
    """Warmup adapts in NumPy (and on tensors sharing that memory at a
    window end): over a whole warmup schedule, with chains finishing on their own
    iterations, it gives the tensor loop's step sizes, metric and estimates to rounding."""

    from hmc.arrays import as_arrays

    chains, dim, warmup = 3, 2, 150  # one slow window, (75, 99)
    potential = hmc.Potential(standard_normal, batched=True)
    keys = chain_keys(3, torch.arange(chains))
    schedule = build_schedule(warmup)
    search = functools.partial(find_reasonable_step_size, potential=potential)
    adapter = StanWarmup(schedule, search)
    host_adapter = StanWarmup(as_arrays(schedule), search)
    q = torch.full((chains, dim), 0.3, dtype=DTYPE)
    unit = torch.ones(chains, dim, dtype=DTYPE)
    params = Params(torch.ones(chains, dtype=DTYPE), metric_from_inverse(unit))
    start = hmc.State(q, *potential.value_and_grad(q))
    warm, params = adapter.init(start, params, keys)
    host_warm, host_params = as_arrays(warm), Params(params.step_size.numpy(), params.metric)
    iteration = torch.zeros(chains, dtype=torch.int64)
    rng = np.random.default_rng(0)
    ends = 0
    while int(iteration.min()) < warmup:
        done = torch.from_numpy(rng.random(chains) < 0.6) & (iteration < warmup)
        q = torch.from_numpy(rng.normal(size=(chains, dim)) * [1.0, 3.0])
        state = hmc.State(q, *potential.value_and_grad(q))
        accept = torch.from_numpy(rng.random(chains))
        window_ends = any(schedule.ends_window(int(i)) for i in iteration[done])
        ends += window_ends
        warm, params = adapter.update(
            warm, params, done, iteration, accept, state, keys, window_ends
        )
        host_warm, host_params = host_adapter.update(
            host_warm, host_params, done.numpy(), iteration.numpy(),
            accept.numpy(), as_arrays(state), keys, window_ends,
        )  # fmt: skip
        leaving = done & (iteration == warmup - 1)
        params = adapter.final(warm, params, leaving)
        host_params = host_adapter.final(host_warm, host_params, leaving.numpy())
        assert isinstance(host_params.step_size, np.ndarray)
        iteration = iteration + done
    assert ends >= 1
    np.testing.assert_allclose(host_params.step_size, params.step_size.numpy(), rtol=1e-12)
    assert not torch.equal(params.metric.inverse, unit)  # the window end set the metric
    np.testing.assert_allclose(host_params.metric.inverse.numpy(), params.metric.inverse.numpy())
    for host, tensor in zip(host_warm.dual_averaging, warm.dual_averaging, strict=True):
        np.testing.assert_allclose(host, tensor.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(host_warm.search_counter, warm.search_counter.numpy())


def test_a_window_end_elsewhere_leaves_a_chains_dual_averaging_bit_for_bit(standard_normal):
    """With the NumPy engine, dual averaging computes in NumPy whether or not another chain
    ends its window in the same call (NumPy's and torch's powers differ in their last
    bits): a chain's step size depends on its own transitions, not on which chains finish
    with it. Chain 0 ends its window; the 63 others are past theirs."""
    from hmc.arrays import as_arrays, as_tensors

    chains, dim = 64, 2
    potential = hmc.Potential(standard_normal, batched=True)
    keys = chain_keys(5, torch.arange(chains))
    schedule = build_schedule(150)  # one slow window, (75, 99)
    search = functools.partial(find_reasonable_step_size, potential=potential)
    adapter = StanWarmup(as_arrays(schedule), search)
    rng = np.random.default_rng(1)

    def draws() -> hmc.State:
        q = rng.normal(size=(chains, dim))
        return hmc.State(q, *potential.value_and_grad(q))

    unit = metric_from_inverse(torch.ones(chains, dim, dtype=DTYPE))
    warm, tuned = adapter.init(
        as_tensors(draws()), Params(torch.ones(chains, dtype=DTYPE), unit), keys
    )
    warm, params = as_arrays(warm), Params(tuned.step_size.numpy(), unit)
    everyone = np.ones(chains, dtype=bool)
    for t in range(75, 99):  # chain 0 fills its window; the others are in the last buffer
        iteration = np.where(np.arange(chains) == 0, t, 120)
        warm, params = adapter.update(
            warm, params, everyone, iteration, rng.random(chains), draws(), keys, False
        )
    da = warm.dual_averaging  # chains at different counts of their dual averaging
    warm = warm._replace(dual_averaging=da._replace(counter=np.arange(chains) + 1.0))
    iteration, accept, state = (
        np.where(np.arange(chains) == 0, 99, 120),
        rng.random(chains),
        draws(),
    )
    others = np.arange(chains) > 0
    with_end, with_end_params = adapter.update(
        warm, params, everyone, iteration, accept, state, keys, window_ends=True
    )
    without, without_params = adapter.update(
        warm, params, others, iteration, accept, state, keys, window_ends=False
    )
    assert not np.array_equal(with_end_params.metric.inverse[0], params.metric.inverse[0])
    for name, a, b in zip(da._fields, with_end.dual_averaging, without.dual_averaging, strict=True):
        np.testing.assert_array_equal(a[1:], b[1:], err_msg=name)
    np.testing.assert_array_equal(with_end_params.step_size[1:], without_params.step_size[1:])
