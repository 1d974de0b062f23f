"""MAMS (``kernel="mams"``): the isokinetic update against a hand computation, the
integrator's second order, the step-count jitter, the Metropolis test, the kernel's
invariance on a correlated Gaussian at a fixed step size, compiled against eager draws,
whole runs with both warmups, the length per step size (no collapse to one step),
NaN log densities as divergences (checkpoints: tests/test_checkpoint.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import assert_moments, gaussian_log_prob, mcse_z_scores, z_bound

import hmc
from hmc.adapt.trajectory_length import autocorrelation_length
from hmc.isokinetic import isokinetic_leapfrog, momentum_update, unit_momentum
from hmc.kernels.chees import halton
from hmc.kernels.mams import jitter_scale
from hmc.metric import metric_from_inverse
from hmc.potential import Potential
from hmc.random import chain_keys
from hmc.state import Params, State

F64 = torch.float64
MEAN = np.array([1.0, -2.0])
COV = np.array([[1.0, 0.8], [0.8, 2.0]])


def hand_update(u, force, t):
    """The isokinetic momentum update of one chain as BlackJAX writes it (NumPy, D > 1):
    the new unit momentum and ``(D - 1) (delta - log 2 + log(1 + u.e + (1 - u.e) z^2))``."""
    d = u.size
    e = force / np.linalg.norm(force)
    delta = t * np.linalg.norm(force) / (d - 1)
    zeta = math.exp(-delta)
    proj = u @ e
    raw = e * (1 - zeta) * (1 + zeta + proj * (1 - zeta)) + 2 * zeta * u
    change = (d - 1) * (delta - math.log(2) + math.log(1 + proj + (1 - proj) * zeta**2))
    return raw / np.linalg.norm(raw), change


def test_one_isokinetic_step_against_a_hand_computation():
    """A leapfrog step under a diagonal metric on a Gaussian: position, momentum and
    energy error against the formulas worked through by hand in NumPy."""
    rng = np.random.default_rng(0)
    precision = np.diag([1.0, 4.0, 0.25])
    inverse = np.array([0.5, 2.0, 3.0])
    q = rng.normal(size=3)
    u = rng.normal(size=3)
    u /= np.linalg.norm(u)
    eps = 0.3
    s = np.sqrt(inverse)
    grad = lambda x: precision @ x  # noqa: E731
    energy = lambda x: 0.5 * x @ precision @ x  # noqa: E731
    u1, k1 = hand_update(u, -s * grad(q), eps / 2)
    q1 = q + eps * s * u1
    u2, k2 = hand_update(u1, -s * grad(q1), eps / 2)
    error = energy(q1) - energy(q) + k1 + k2

    def value_and_grad(x):
        return 0.5 * ((x @ torch.as_tensor(precision)) * x).sum(-1), x @ torch.as_tensor(precision)

    x = torch.as_tensor(q)[None]
    state = State(x, *value_and_grad(x))
    metric = metric_from_inverse(torch.as_tensor(inverse)[None])
    moved = isokinetic_leapfrog(
        state, torch.as_tensor(u)[None], torch.tensor([[eps]], dtype=F64), metric, value_and_grad
    )
    np.testing.assert_allclose(moved.state.position[0].numpy(), q1, rtol=1e-12)
    np.testing.assert_allclose(moved.momentum[0].numpy(), u2, rtol=1e-12, atol=1e-14)
    total = moved.state.potential[0] - state.potential[0] + moved.kinetic_change[0]
    np.testing.assert_allclose(float(total), error, rtol=1e-10)
    assert abs(error) > 1e-4  # a step large enough for the energy error to show


def test_the_update_without_cancellation_and_with_no_force():
    """At a small ``delta`` the ``log1p`` form keeps the digits BlackJAX's form loses; a
    zero force keeps the momentum, with no energy change."""
    u = np.array([0.6, 0.8, 0.0])
    force = np.array([0.0, 1.0, 0.0])
    t = 1e-9
    _, change = momentum_update(
        torch.as_tensor(u)[None], -torch.as_tensor(force)[None], torch.tensor([[t]], dtype=F64),
        metric_from_inverse(torch.ones(1, 3, dtype=F64)),
    )  # fmt: skip
    # d/dt of the change at t = 0 is |f| (u . e) = 0.8: the first-order term, exactly
    np.testing.assert_allclose(float(change[0]), 0.8 * t, rtol=1e-6)
    zero = torch.zeros(1, 3, dtype=F64)
    same, none = momentum_update(
        torch.as_tensor(u)[None], zero, torch.tensor([[0.5]], dtype=F64),
        metric_from_inverse(torch.ones(1, 3, dtype=F64)),
    )  # fmt: skip
    np.testing.assert_allclose(same[0].numpy(), u, rtol=1e-15)
    assert float(none[0]) == 0.0


def test_the_energy_error_falls_as_the_square_of_the_step_size():
    """Over a fixed time on a non-Gaussian density, halving the step size divides the
    energy error by about 4: the integrator is second order and the kinetic energy change
    is the right one (a wrong sign or factor leaves an O(1) error)."""
    potential = Potential(lambda q: -0.5 * (q**2).sum() - 0.1 * q[0] ** 4 + torch.sin(q[1]))
    x = torch.tensor([[0.7, -0.4, 1.1]], dtype=F64)
    u = unit_momentum(torch.tensor([[0.3, 1.0, -0.5]], dtype=F64))
    metric = metric_from_inverse(torch.tensor([[1.0, 0.5, 2.0]], dtype=F64))
    errors = []
    for steps in (20, 40, 80):
        state, p, change = State(x, *potential.value_and_grad(x)), u, 0.0
        start = state.potential
        for _ in range(steps):
            state, p, k = isokinetic_leapfrog(
                state, p, torch.tensor([[2.0 / steps]], dtype=F64), metric,
                potential.value_and_grad,
            )  # fmt: skip
            change = change + k
        errors.append(abs(float(state.potential - start + change)))
    assert errors[0] > 1e-4
    assert 3.5 < errors[0] / errors[1] < 4.5 and 3.5 < errors[1] / errors[2] < 4.5


def test_the_jitter_has_the_mean_number_of_steps():
    """``ceil(h s)`` with ``h`` uniform has the mean ``L / eps`` exactly (summed over its
    values), and over 4096 Halton numbers to 1e-3."""
    means = torch.tensor([1.0, 1.2, 2.0, 3.7, 10.0, 55.5], dtype=F64)
    s = jitter_scale(means)
    for mean, scale in zip(means.tolist(), s.tolist(), strict=True):
        k = math.floor(scale)
        exact = (sum(range(1, k + 1)) + (k + 1) * (scale - k)) / scale
        assert exact == pytest.approx(mean, rel=1e-12)
    h = halton(torch.arange(1, 4097))
    steps = torch.ceil(h[:, None] * s)
    np.testing.assert_allclose(steps.mean(0).numpy(), means.numpy(), rtol=1e-3)
    kernel = hmc.MAMS()
    params = Params(torch.full((3,), 0.5, dtype=F64), None, torch.tensor([0.1, 2.0, 4000.0]))
    drawn = kernel._num_steps(params, torch.tensor([0.999, 0.999, 0.999], dtype=F64))
    assert drawn.tolist() == [1, 7, 1024]  # at least one step, at most max_steps


def transition(log_prob, step_size, length, q, counter=0):
    """One MAMS transition of every chain of ``q`` ``(C, D)``, unit metric."""
    potential = Potential(log_prob, batched=True)
    chains, dim = q.shape
    params = Params(
        torch.full((chains,), step_size, dtype=F64),
        metric_from_inverse(torch.ones(chains, dim, dtype=F64)),
        torch.full((chains,), length, dtype=F64),
    )
    state = State(q, *potential.value_and_grad(q))
    keys = chain_keys(3, torch.arange(chains))
    counters = torch.full((chains,), counter)
    new, info = hmc.MAMS().transition(state, params, potential, keys, counters)
    return state, new, info


def test_the_accept_probability_is_that_of_the_energy_error():
    """A one-step transition: the acceptance probability is ``min(1, exp(-W))`` of its
    energy error; a proposal is kept where the uniform falls below it."""
    log_prob = gaussian_log_prob(MEAN, COV)
    q = torch.randn(64, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    state, new, info = transition(log_prob, 1.5, 1.5, q)
    assert (info.n_steps == 1).all()
    error = info.max_energy_error  # |W|, the test's own number
    moved = (new.position != state.position).any(1)
    accepted_error = info.energy_error[moved]
    np.testing.assert_allclose(
        info.acceptance_rate[moved].numpy(), np.exp(-accepted_error.clip(min=0).numpy()),
        rtol=1e-12,
    )  # fmt: skip
    assert 0 < moved.sum() < 64 and (error[moved] == accepted_error.abs()).all()
    rejected = ~moved
    assert (info.energy_error[rejected] == 0).all() and (info.acceptance_rate[rejected] < 1).all()


def test_a_nan_log_density_is_a_rejected_divergence():
    """Where the log density is NaN the transition is divergent and rejected, with
    nothing NaN in the state or the statistics."""

    def log_prob(q):
        lp = -0.5 * (q**2).sum(-1)
        return torch.where(q[:, 0] > 0.5, torch.nan, lp)

    q = torch.tensor([[0.0, 0.0], [-1.0, 0.3]], dtype=F64)
    state, new, info = transition(log_prob, 0.1, 3.0, q)  # 30 steps: many cross x > 0.5
    assert info.diverging.any()
    assert (new.position[info.diverging] == state.position[info.diverging]).all()
    for x in (*new, *info[:-1]):  # the last, |W|, is +inf where divergent (as for HMC)
        assert torch.isfinite(x.to(F64)).all()
    assert (info.max_energy_error[info.diverging] == math.inf).all()


def sample(log_prob, **kw):
    options = dict(chains=4, warmup=300, draws=1000, seed=2, progress=False, batched=True)
    return hmc.sample(log_prob, **{**options, **kw})


def test_the_kernel_leaves_a_correlated_gaussian_invariant():
    """A fixed step size and length, no warmup, under the identity metric: means,
    variances and the correlation within MCSE."""
    dt = sample(
        gaussian_log_prob(MEAN, COV), dim=2, warmup=0, draws=3000, step_size=0.4,
        kernel=hmc.MAMS(trajectory_length=2.0), metric="identity", init=torch.tensor(MEAN),
    )  # fmt: skip
    assert_moments(dt["posterior"]["x"].values, MEAN, COV)
    assert dt["sample_stats"]["n_steps"].values.mean() == pytest.approx(5.0, rel=1e-2)


def test_a_compiled_transition_gives_the_eager_draws():
    """The same seed, step size and length: the compiled graph and the eager transition
    (NumPy engine) give the same draws to 1e-10, the same steps and evaluations."""

    def wavy(q):
        return -0.5 * (q**2).sum() + torch.sin(q[0] * q[1]) - 0.1 * torch.logsumexp(q, 0) ** 2

    runs = [
        hmc.sample(
            wavy, dim=3, chains=6, warmup=0, draws=100, step_size=0.35, seed=3, progress=False,
            kernel=hmc.MAMS(trajectory_length=2.0), compile=compile, engine="numpy",
        )
        for compile in (True, False)
    ]  # fmt: skip
    compiled, eager = runs
    assert compiled.attrs["compiled"] == 1 and eager.attrs["compiled"] == 0
    np.testing.assert_allclose(
        compiled["posterior"]["x"].values, eager["posterior"]["x"].values, atol=1e-10
    )
    for name in ("n_steps", "diverging"):
        np.testing.assert_array_equal(
            compiled["sample_stats"][name].values, eager["sample_stats"][name].values
        )
    np.testing.assert_allclose(
        compiled["sample_stats"]["energy_error"].values,
        eager["sample_stats"]["energy_error"].values, atol=1e-10,
    )  # fmt: skip
    assert compiled.attrs["n_gradient_evaluations"] == eager.attrs["n_gradient_evaluations"]
    assert 0.3 < eager["sample_stats"]["acceptance_rate"].values.mean() < 1


ILL_SD = np.geomspace(0.1, 10.0, 10)


def ill_conditioned(q):
    return -0.5 * ((q / torch.as_tensor(ILL_SD)) ** 2).sum(-1)


@pytest.mark.parametrize(("adapt", "chains"), [("stan", 4), ("ensemble", 32)])
def test_a_run_adapts_to_an_ill_conditioned_gaussian(adapt, chains):
    """Warmup learns the metric, the step size (acceptance near 0.9) and a trajectory
    length; the draws have the Gaussian's means and variances, and the transitions take
    ``L / eps`` steps on average (not one: BlackJAX's collapse to MALA)."""
    dt = sample(ill_conditioned, dim=10, adapt=adapt, chains=chains, draws=500, kernel="mams")
    assert_moments(dt["posterior"]["x"].values, np.zeros(10), ILL_SD**2)
    stats, adaptation = dt["sample_stats"], dt["adaptation"]
    assert 0.8 < stats["acceptance_rate"].values.mean() < 0.99
    assert not stats["diverging"].values.any()
    expected = (adaptation["trajectory_length"] / adaptation["step_size"]).values  # (chain,)
    np.testing.assert_allclose(stats["n_steps"].values.mean(1), expected, rtol=0.02)
    assert expected.min() > 1.3  # far enough from one step for the comparison to tell


@pytest.mark.filterwarnings("ignore:.*were divergent")
def test_nan_log_densities_shrink_the_step_size_in_warmup():
    """A density that is NaN beyond a radius, started with a step size far too large:
    warmup's transitions into the NaN region are divergent, dual averaging shrinks the
    step size, and no NaN reaches the output."""

    def log_prob(q):
        lp = -0.5 * (q**2).sum(-1)
        return torch.where((q**2).sum(-1) > 16.0, torch.nan, lp)

    dt = sample(log_prob, dim=3, warmup=150, draws=200, step_size=30.0, kernel="mams",
                save_warmup=True, init=0.5)  # fmt: skip
    warm = dt["warmup_sample_stats"]
    assert warm["diverging"].values[:, :20].any()
    assert (dt["adaptation"]["step_size"].values < 3.0).all()
    assert np.isfinite(dt["posterior"]["x"].values).all()
    assert np.isfinite(dt["sample_stats"]["energy"].values).all()


def test_mams_is_refused_in_one_dimension():
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        hmc.sample(lambda q: -0.5 * (q**2).sum(), dim=1, kernel="mams", progress=False)
    with pytest.raises(ValueError, match="num_steps"):
        hmc.MAMS(num_steps=3)


def banana(q):
    """Haario's banana: ``x1 ~ N(0, 100)``, ``x2 - 0.03 (x1^2 - 100) ~ N(0, 1)``, whose
    ``x2`` has mean 0 and variance ``1 + 2 (0.03 * 100)^2 = 19``, uncorrelated with ``x1``."""
    x1, x2 = q[..., 0], q[..., 1]
    return -0.5 * (x1**2 / 100 + (x2 - 0.03 * (x1**2 - 100)) ** 2)


def funnel(q):
    """Neal's funnel in 10 dimensions: ``v ~ N(0, 9)``, ``x_i | v ~ N(0, e^v)``."""
    v, x = q[..., 0], q[..., 1:]
    return -0.5 * v**2 / 9 - 0.5 * (x**2).sum(-1) * torch.exp(-v) - 0.5 * x.shape[-1] * v


@pytest.mark.slow  # 20 s
def test_a_run_draws_the_banana():
    dt = sample(banana, dim=2, warmup=1000, draws=2000, kernel="mams")
    assert_moments(dt["posterior"]["x"].values, np.zeros(2), np.diag([100.0, 19.0]))
    assert not dt["sample_stats"]["diverging"].values.any()


@pytest.mark.slow  # 20 s
def test_a_pooled_run_draws_the_funnels_neck():
    """At a target acceptance of 0.99 (the paper's setting for the funnel), pooled over
    64 chains: the mean, variance and 5 % and 95 % quantile indicators of ``v`` within
    MCSE of the exact ``N(0, 9)``."""
    dt = sample(funnel, dim=10, chains=64, warmup=1000, draws=2000, kernel="mams",
                adapt="ensemble", target_accept=0.99)  # fmt: skip
    v = dt["posterior"]["x"].values[..., 0]
    quantile = 3 * 1.6448536269514722
    values = np.stack((v, v**2, v < -quantile, v > quantile), -1).astype(float)
    z, _, _ = mcse_z_scores(values, np.array([0.0, 9.0, 0.05, 0.05]))
    assert (np.abs(z) < z_bound(4)).all(), z
    assert dt["sample_stats"]["diverging"].values.mean() < 1e-3


def test_a_chains_draws_do_not_depend_on_the_chains_beside_it():
    """Stan's warmup adapts each chain on its own, trajectory length included: the first
    two chains of a run of four are those of a run of two (to rounding)."""
    runs = [
        sample(ill_conditioned, dim=10, chains=chains, warmup=150, draws=50, kernel="mams")
        for chains in (2, 4)
    ]
    two, four = runs
    np.testing.assert_allclose(
        four["posterior"]["x"].values[:2], two["posterior"]["x"].values, rtol=1e-10, atol=1e-10
    )
    np.testing.assert_allclose(
        four["adaptation"]["trajectory_length"].values[:2],
        two["adaptation"]["trajectory_length"].values, rtol=1e-10,
    )  # fmt: skip


def test_without_warmup_the_kernels_own_length_is_used():
    """No warmup, the step size from the heuristic alone: the steps follow the kernel's
    ``trajectory_length`` over that step size."""
    dt = sample(
        ill_conditioned, dim=10, warmup=0, draws=256, kernel=hmc.MAMS(trajectory_length=3.0)
    )
    step_size = dt["adaptation"]["step_size"].values
    assert "trajectory_length" not in dt["adaptation"]
    np.testing.assert_allclose(
        dt["sample_stats"]["n_steps"].values.mean(1), 3.0 / step_size, rtol=0.02
    )


def test_a_stored_run_holds_the_draws_of_one_in_memory(tmp_path):
    options = dict(dim=10, warmup=100, draws=60, kernel="mams")
    held = sample(ill_conditioned, **options)
    stored = sample(ill_conditioned, store=tmp_path / "run.nc", **options)
    np.testing.assert_array_equal(stored["posterior"]["x"].values, held["posterior"]["x"].values)
    np.testing.assert_array_equal(
        stored["adaptation"]["trajectory_length"].values,
        held["adaptation"]["trajectory_length"].values,
    )
    stored.close()


@pytest.mark.parametrize("pooled", [False, True])
def test_the_length_follows_the_autocorrelation_time(pooled):
    """On AR(1) draws with ``phi = 0.5`` (``tau = (1 + phi) / (1 - phi) = 3``) the length
    becomes ``0.5 L tau = 1.5 L``; with ``phi = 0.9`` (``tau = 19``) it is capped at ``2 L``;
    a trace with a NaN keeps the length."""
    rng = np.random.default_rng(1)
    for phi, expected in ((0.5, 1.5), (0.9, 2.0)):
        noise = rng.normal(size=(8, 4000, 3))
        trace = np.zeros_like(noise)
        trace[:, 0] = noise[:, 0] / math.sqrt(1 - phi**2)
        for t in range(1, trace.shape[1]):
            trace[:, t] = phi * trace[:, t - 1] + noise[:, t]
        length = np.full(1 if pooled else 8, 2.0)
        new = autocorrelation_length(trace, length, pooled)
        np.testing.assert_allclose(new / length, expected, rtol=0.15 if pooled else 0.25)
    trace[0, 5, 0] = np.nan
    assert autocorrelation_length(trace, length, pooled)[0] == 2.0


@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_a_dense_metric_run_draws_a_correlated_gaussian(engine):
    """The whitening ``S`` is the dense metric's Cholesky factor (``S u`` and
    ``S^T grad``), in both engines."""
    cov = np.array([[1.0, 0.95, 0.0], [0.95, 1.0, 0.3], [0.0, 0.3, 4.0]])
    dt = sample(gaussian_log_prob(np.zeros(3), cov), dim=3, metric="dense", kernel="mams",
                engine=engine, draws=600)  # fmt: skip
    assert_moments(dt["posterior"]["x"].values, np.zeros(3), cov)
    inverse = dt["adaptation"]["inverse_metric"].values.mean(0)
    assert abs(inverse[0, 1] / math.sqrt(inverse[0, 0] * inverse[1, 1]) - 0.95) < 0.05


@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_a_low_rank_metric_run_draws_a_correlated_gaussian(engine):
    """With the low-rank metric the whitening ``S`` is its factor ``F`` (``F F^T = M^-1``:
    ``F u`` and ``F^T grad``), in both engines."""
    cov = np.array([[1.0, 0.95, 0.0], [0.95, 1.0, 0.3], [0.0, 0.3, 4.0]])
    dt = sample(gaussian_log_prob(np.zeros(3), cov), dim=3, metric="low-rank", kernel="mams",
                engine=engine, draws=600)  # fmt: skip
    assert_moments(dt["posterior"]["x"].values, np.zeros(3), cov)
    assert dt["adaptation"]["metric_eigenvalues"].values.max() > 2  # the correlation found
