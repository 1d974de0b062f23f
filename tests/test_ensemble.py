"""Ensemble warmup (``adapt="ensemble"``) and ChEES-HMC.

The statistical tests compare means, variances and correlations with the truth within
Monte Carlo standard errors (``conftest.assert_moments``, fixed seeds). The pieces have
oracles of their own: the pooled moments against NumPy's, the Fisher diagonal against a
Gaussian's variances, the ChEES gradient against the analytic optimum of the criterion on a
standard Gaussian.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from conftest import (
    assert_moments,
    diagonal_gaussian_log_prob,
    gaussian_log_prob,
    minor_mode_log_prob,
)

import hmc
from hmc.adapt.ensemble import (
    EnsembleWarmup,
    TrajectoryState,
    adam_ascent,
    chees_gradient,
    ensemble_schedule,
    moments_add,
    moments_init,
    pooled_inverse_metric,
    settled,
    stranded_chains,
)
from hmc.kernels.chees import halton
from hmc.random import chain_keys
from hmc.state import Params, Proposal
from hmc.step_size_search import find_reasonable_step_size

DTYPE = torch.float64


def run(log_prob, dim, **kw):
    options = dict(dim=dim, batched=True, progress=False, adapt="ensemble")
    options.update(kw)
    return hmc.sample(log_prob, **options)


# ------------------------------------------------------------------------- the pieces
def test_schedule_is_short_windows_and_a_terminal_buffer():
    schedule = ensemble_schedule(200)
    assert schedule.windows == [(20, 39), (40, 79), (80, 159)]
    longer = ensemble_schedule(1000).windows  # the same start, more windows of 160
    assert longer[:3] == schedule.windows
    assert longer[3:] == [(160, 319), (320, 479), (480, 639), (640, 799), (800, 959)]
    assert ensemble_schedule(100).windows == [(10, 19), (20, 39), (40, 79)]
    assert ensemble_schedule(10).windows == []  # too short: step size only


@pytest.mark.parametrize("dense", [False, True])
def test_pooled_moments_match_numpy_over_batches(dense):
    rng = np.random.default_rng(0)
    batches = [rng.normal(size=(n, 3)) * [1.0, 5.0, 0.1] + 2.0 for n in (4, 7, 1, 16)]
    moments = moments_init(torch.zeros(4, 3, dtype=DTYPE), dense)
    for batch in batches:
        moments = moments_add(moments, torch.from_numpy(batch))
    every = np.concatenate(batches)
    assert int(moments.count) == len(every)
    np.testing.assert_allclose(moments.mean.numpy(), every.mean(0), rtol=1e-12)
    covariance = np.cov(every.T)
    expected = covariance if dense else np.diag(covariance)
    np.testing.assert_allclose(moments.m2.numpy() / (len(every) - 1), expected, rtol=1e-12)


def test_fisher_diagonal_is_a_gaussians_variance():
    """For a Gaussian the gradient of log p is -x / var: Var x / Var grad = var^2."""
    rng = np.random.default_rng(1)
    sd = np.array([0.01, 1.0, 30.0])
    x = rng.normal(size=(4000, 3)) * sd
    position = moments_add(moments_init(torch.zeros(1, 3, dtype=DTYPE), False), torch.tensor(x))
    gradient = moments_add(
        moments_init(torch.zeros(1, 3, dtype=DTYPE), False), torch.tensor(-x / sd**2)
    )
    inverse = pooled_inverse_metric(position, gradient).numpy()
    n = len(x)
    # exact (the two sample variances share their draws) up to Stan's regulariser
    np.testing.assert_allclose(inverse, n / (n + 5) * sd**2 + 5e-3 / (n + 5), rtol=1e-12)
    # a coordinate whose gradient does not vary falls back on the variance
    flat = gradient._replace(m2=gradient.m2 * torch.tensor([1.0, 0.0, 1.0], dtype=DTYPE))
    fallback = pooled_inverse_metric(position, flat).numpy()
    np.testing.assert_allclose(fallback[1], x[:, 1].var(ddof=1), rtol=1e-2)


def test_stranded_chains_are_far_below_the_others():
    rng = np.random.default_rng(2)
    lp = rng.normal(size=(8, 40)) * 2.0 - 50.0
    lp[3] -= 200.0  # far below: stranded
    lp[5] -= 5.0  # a little below (2.5 spreads, under 10 nats): healthy
    stranded = stranded_chains(torch.from_numpy(lp))
    assert stranded.tolist() == [i == 3 for i in range(8)]
    lp[3, 7] = -np.inf  # a chain whose density is not finite is stranded too
    assert stranded_chains(torch.from_numpy(lp))[3]


def test_settled_needs_a_stable_metric_and_no_trend():
    rng = np.random.default_rng(3)
    lp = torch.from_numpy(rng.normal(size=(64, 40)))
    metric = torch.ones(5, dtype=DTYPE)
    assert settled(lp, metric, metric * 1.1)
    assert not settled(lp, metric, metric.new_zeros(0))  # the first window
    assert not settled(lp, metric, metric * torch.tensor([1.0, 1, 1, 1, 1.5]))
    trend = lp + torch.linspace(0, 3, 40, dtype=DTYPE)  # chains still drifting
    assert not settled(trend, metric, metric)
    assert not settled(lp[:, :4], metric, metric)  # too few draws for the ESS


def test_halton_numbers():
    values = halton(torch.arange(1, 8)).tolist()
    assert values == [0.5, 0.25, 0.75, 0.125, 0.625, 0.375, 0.875]


def test_chees_steps_follow_the_learnt_length_and_the_jitter():
    """Transition t takes ceil(h_{t+1} T / eps) steps, the same in every chain."""
    keys = chain_keys(0, torch.arange(3))
    eps, length = torch.full((3,), 0.125, dtype=DTYPE), torch.full((3,), 1.5, dtype=DTYPE)
    for counter, expected in enumerate([6, 3, 9, 2]):  # ceil(h * 12): h = 1/2, 1/4, 3/4, 1/8
        steps = hmc.ChEES().num_steps_for(
            Params(eps, None, length), keys, torch.full((3,), counter)
        )
        assert steps.tolist() == [expected] * 3


def test_chees_gradient_vanishes_at_the_criterions_optimum():
    """On a standard Gaussian ``|x_t|^2 - |x_0|^2`` has mean square ``4 D sin^2 t``; with
    the jitter ``t = h T``, ``h ~ U(0, 1)``, its average ``1/2 - sin(2T) / (4T)`` is largest
    at ``tan(2T) = 2T``, ``T = 2.247``: the estimated gradient in log T is positive below
    and negative above (step size 0.05, nearly exact dynamics)."""
    dim, chains = 10, 512
    potential = hmc.Potential(lambda q: -0.5 * (q**2).sum(-1), batched=True)
    kernel = hmc.ChEES()
    keys = chain_keys(0, torch.arange(chains))
    generator = torch.Generator().manual_seed(0)
    means = {}
    for length in (1.5, 3.0):
        q = torch.randn(chains, dim, dtype=DTYPE, generator=generator)
        state = hmc.State(q, *potential.value_and_grad(q))
        params = hmc.Params(
            torch.full((chains,), 0.05, dtype=DTYPE),
            hmc.metric_from_inverse(torch.ones(chains, dim, dtype=DTYPE)),
            torch.full((chains,), length, dtype=DTYPE),
        )
        gradients = []
        for t in range(48):
            draws = kernel.draws(keys, torch.full((chains,), t), dim, DTYPE)
            state, info, proposal = kernel._transition(state, params, potential, draws)
            gradients.append(float(chees_gradient(proposal, info.acceptance_rate)))
        mean, error = np.mean(gradients), np.std(gradients) / math.sqrt(len(gradients))
        means[length] = (mean, error)
    assert means[1.5][0] > 3 * means[1.5][1], means
    assert means[3.0][0] < -3 * means[3.0][1], means


def test_chees_gradient_does_not_depend_on_the_scale_of_the_positions():
    """Scaled by the chains' spread, the gradient stays of order one while warmup shrinks
    the chains from their starts towards the bulk (Adam's running scale would lag)."""
    generator = torch.Generator().manual_seed(5)
    start, end, velocity = torch.randn(3, 16, 4, dtype=DTYPE, generator=generator)
    time = torch.rand(16, dtype=DTYPE, generator=generator)
    accept = torch.rand(16, dtype=DTYPE, generator=generator)
    gradient = chees_gradient(Proposal(start, end, velocity, time), accept)
    scaled = chees_gradient(Proposal(100 * start, 100 * end, 100 * velocity, time), accept)
    torch.testing.assert_close(scaled, gradient)
    assert gradient != 0


def test_chees_gradient_leaves_out_the_chains_not_counted():
    """A stranded chain far from the others counts neither in the weights nor in the
    centre and scale of the starts: the gradient is the one without it."""
    generator = torch.Generator().manual_seed(6)
    start, end, velocity = torch.randn(3, 16, 4, dtype=DTYPE, generator=generator)
    time = torch.rand(16, dtype=DTYPE, generator=generator)
    accept = torch.rand(16, dtype=DTYPE, generator=generator)
    alone = chees_gradient(Proposal(start, end, velocity, time), accept)
    far = torch.full((1, 4), 1e3, dtype=DTYPE)
    with_far = Proposal(
        torch.cat((start, far)), torch.cat((end, far)), torch.cat((velocity, far)),
        torch.cat((time, time[:1])),
    )  # fmt: skip
    counted = torch.arange(17) < 16
    accept = torch.cat((accept, accept[:1]))
    torch.testing.assert_close(chees_gradient(with_far, accept, counted), alone)
    assert not torch.isclose(chees_gradient(with_far, accept), alone)


def test_adam_ignores_an_outlier_gradient():
    state = TrajectoryState(*torch.zeros(4, dtype=DTYPE))
    for _ in range(10):
        state = adam_ascent(state, torch.tensor(1.0, dtype=DTYPE))
    grown = state.log_length
    state = adam_ascent(state, torch.tensor(-1e6, dtype=DTYPE))  # clipped to 5 rms
    state = adam_ascent(state, torch.tensor(1.0, dtype=DTYPE))
    assert state.log_length > grown - 0.35  # still learning afterwards
    unchanged = adam_ascent(state, torch.tensor(math.nan, dtype=DTYPE))
    assert unchanged == state


def test_one_dual_averaging_for_all_chains():
    """The pooled update moves every chain's step size together, from the mean acceptance."""
    chains = 6
    potential = hmc.Potential(lambda q: -0.5 * (q**2).sum(-1), batched=True)
    search = functools.partial(find_reasonable_step_size, potential=potential)
    adapter = EnsembleWarmup(ensemble_schedule(100), search)
    q = torch.randn(chains, 3, dtype=DTYPE, generator=torch.Generator().manual_seed(4))
    state = hmc.State(q, *potential.value_and_grad(q))
    keys = chain_keys(4, torch.arange(chains))
    params = hmc.Params(
        torch.ones(chains, dtype=DTYPE), hmc.metric_from_inverse(torch.ones(chains, 3, dtype=DTYPE))
    )
    adaptation, params = adapter.init(state, params, keys)
    assert (params.step_size == params.step_size[0]).all()
    done = torch.ones(chains, dtype=torch.bool)
    accept = torch.linspace(0.0, 1.0, chains, dtype=DTYPE)  # mean 0.5 < 0.8: shrink
    iteration = torch.zeros(chains)

    def pooled_step(accept):
        updated, _ = adapter.update(adaptation, params, done, iteration, accept, state, keys)
        return adapter.pool(updated, params, state, 0, keys).params.step_size

    step = pooled_step(accept)
    assert (step == step[0]).all()
    torch.testing.assert_close(pooled_step(accept * 0 + 0.5), step)  # only the mean counts
    assert pooled_step(accept * 0 + 0.95)[0] > step[0]  # a higher acceptance, a longer step


# -------------------------------------------------------------------- whole runs, moments
@pytest.mark.parametrize("kernel", ["nuts", "hmc", "chees"])
def test_ensemble_warmup_draws_a_correlated_gaussian(kernel):
    """Correlation 0.9 and scales 0.1 and 3 (a diagonal metric leaves the correlation):
    moments within MCSE after the short pooled warmup, with 32 chains."""
    sd = np.array([0.1, 3.0])
    correlation = np.array([[1.0, 0.9], [0.9, 1.0]])
    cov = correlation * np.outer(sd, sd)
    mean = np.array([1.0, -2.0])
    dt = run(gaussian_log_prob(mean, cov), 2, chains=32, draws=100, seed=5, kernel=kernel)
    assert dt.attrs["adapt"] == "ensemble"
    assert_moments(dt["posterior"]["x"].values, mean, cov)
    step = dt["adaptation"]["step_size"].values
    assert (step == step[0]).all()
    inverse = dt["adaptation"]["inverse_metric"].values
    assert (inverse == inverse[0]).all()


def test_chees_takes_the_same_steps_in_every_chain_and_learns_a_length():
    sd = np.logspace(-1, 0.5, 8)
    dt = run(
        diagonal_gaussian_log_prob(np.zeros(8), sd), 8, chains=64, draws=100, seed=6, kernel="chees"
    )
    steps = dt["sample_stats"]["n_steps"].values  # (chain, draw)
    assert (steps == steps[:1]).all()
    assert len(np.unique(steps)) >= 2  # jittered
    length = dt["adaptation"]["trajectory_length"].values
    assert (length == length[0]).all()
    # the whitened target is a standard normal: the optimum length is about 2.2 (exact
    # dynamics); a leapfrog with steps near 1 shortens it
    assert 1.0 < length[0] < 4.0, length[0]
    assert_moments(dt["posterior"]["x"].values, np.zeros(8), sd**2)
    accept = dt["sample_stats"]["acceptance_rate"].values
    assert 0.6 < accept.mean() < 0.95


def test_many_chains_stop_warmup_early_and_record_what_ran():
    """64 chains settle by the second window's end (iteration 79): the third window is
    skipped and the terminal buffer (160-199) runs; the warmup groups hold the iterations
    that ran."""
    sd = np.array([0.2, 1.0, 5.0])
    dt = run(
        diagonal_gaussian_log_prob(np.zeros(3), sd), 3, chains=64, draws=40, seed=7,
        kernel="hmc", save_warmup=True,
    )  # fmt: skip
    assert dt.attrs["tuning_steps"] == 120
    assert dt["warmup_posterior"].sizes["draw"] == 120
    assert dt["warmup_sample_stats"]["lp"].values.shape == (64, 120)
    assert (dt["warmup_sample_stats"]["lp"].values != 0).all()  # no unwritten slot
    assert list(dt.attrs["restarted_chains"]) == []
    np.testing.assert_allclose(dt["adaptation"]["inverse_metric"].values[0], sd**2, rtol=0.1)


def test_few_chains_run_the_whole_schedule():
    """Two chains cannot reach the early stop's ESS over a window: they run every
    iteration asked for (by default as many as Stan's warmup)."""
    target = diagonal_gaussian_log_prob(np.zeros(2), np.ones(2))
    dt = run(target, 2, chains=2, draws=20, seed=8, warmup=200)
    assert dt.attrs["tuning_steps"] == 200
    assert run(target, 2, chains=2, draws=20, seed=8).attrs["tuning_steps"] == 1000


def test_a_stranded_chain_restarts_from_a_healthy_one():
    """Chain 0 starts in a minor mode 60 nats below the main one (mass e^-60: nothing a
    sampler should report), which it cannot leave in a short warmup; it restarts from
    another chain and its draws then match the others'."""
    init = torch.zeros(16, 2, dtype=DTYPE)
    init[0] = torch.tensor([20.0, 0.0])
    with pytest.warns(RuntimeWarning, match=r"chains \[0\] stayed far below"):
        dt = run(
            minor_mode_log_prob, 2, chains=16, draws=50, seed=9, kernel="hmc", init=init,
            warmup=60,
        )  # fmt: skip
    assert list(dt.attrs["restarted_chains"]) == [0]
    x = dt["posterior"]["x"].values
    assert abs(x[0, :, 0].mean()) < 1.5  # at the mode now


def test_a_stuck_chain_spoils_neither_metric_nor_step_size():
    """Chain 0 starts on a wall (log density -1e12, gradient 2e10) where the shared step
    size cannot move it. Pooled, its gradients would shrink the Fisher metric by orders of
    magnitude and its zero acceptance the step size: it is left out of both while it is
    stranded, and restarts from a healthy chain at the first window's end, in time to part
    from it before sampling."""
    sd = torch.tensor([0.5, 2.0], dtype=DTYPE)

    def log_prob(q):
        wall = torch.relu(q[:, 0] - 50.0)
        return -0.5 * ((q / sd) ** 2).sum(-1) - 1e8 * wall**2

    init = torch.zeros(32, 2, dtype=DTYPE)
    init[0, 0] = 150.0
    with pytest.warns(RuntimeWarning, match=r"chains \[0\] stayed far below"):
        dt = run(log_prob, 2, chains=32, draws=50, seed=3, kernel="hmc", init=init, warmup=200)
    assert list(dt.attrs["restarted_chains"]) == [0]
    inverse = dt["adaptation"]["inverse_metric"].values[0]
    np.testing.assert_allclose(inverse, (sd**2).numpy(), rtol=0.25)
    x = dt["posterior"]["x"].values
    assert (x[0] != x[1:, None]).all(-1).all(-1).all()  # parted from its source
    assert_moments(x, np.zeros(2), (sd**2).numpy())


# --------------------------------------------------------------------------- arguments
def test_adapt_is_checked():
    log_prob = lambda q: -0.5 * (q**2).sum(-1)  # noqa: E731
    with pytest.raises(ValueError, match="adapt must be one of"):
        hmc.sample(log_prob, dim=1, adapt="pooled", batched=True)
    with pytest.raises(ValueError, match="ChEES learns its trajectory length"):
        hmc.sample(log_prob, dim=1, kernel="chees", adapt="stan", batched=True)
    with pytest.raises(ValueError, match="trajectory_length must be positive"):
        hmc.ChEES(trajectory_length=0.0)


def test_default_warmup_depends_on_the_adaptation():
    log_prob = lambda q: -0.5 * (q**2).sum(-1)  # noqa: E731
    dt = hmc.sample(
        log_prob, dim=1, chains=2, draws=5, kernel="chees", batched=True, progress=False, seed=1
    )
    assert dt.attrs["tuning_steps"] == 1000 and dt.attrs["adapt"] == "ensemble"


@pytest.mark.slow
def test_short_pooled_warmup_reaches_what_stans_long_warmup_reaches():
    """A 100-D Gaussian with standard deviations log-spaced over two orders of magnitude
    (variances over four): Stan's 1,000-iteration warmup (4 chains, NUTS) against the
    pooled warmup of 200 iterations (64 chains, which stop early at 120).

    Both estimate the variances; Stan's per-chain estimates are within 10 % of the truth
    in the median coordinate (up to 40 % in the worst), the pooled Fisher diagonal within
    10 % of the truth in every coordinate and of Stan's (geometric mean over chains) in
    the median one. The step size is within 10 % of Stan's or larger: a more accurate
    metric allows a longer step at the same acceptance."""
    dim = 100
    sd = np.logspace(-1, 1, dim)
    log_prob = diagonal_gaussian_log_prob(np.zeros(dim), sd)
    options = dict(dim=dim, batched=True, progress=False, draws=1, compile=False)
    stan = hmc.sample(log_prob, chains=4, warmup=1000, seed=1, **options)
    pooled = hmc.sample(log_prob, chains=64, adapt="ensemble", seed=1, **options)
    assert pooled.attrs["tuning_steps"] <= 250
    stan_inverse = np.exp(np.log(stan["adaptation"]["inverse_metric"].values).mean(0))
    stan_step = np.exp(np.log(stan["adaptation"]["step_size"].values).mean())
    inverse = pooled["adaptation"]["inverse_metric"].values[0]
    step = pooled["adaptation"]["step_size"].values[0]
    assert np.median(np.abs(stan_inverse / sd**2 - 1)) < 0.1
    assert np.abs(inverse / sd**2 - 1).max() < 0.1
    assert np.median(np.abs(inverse / stan_inverse - 1)) < 0.1
    assert step > 0.9 * stan_step, (step, stan_step)
    assert step < 1.5 * stan_step, (step, stan_step)
