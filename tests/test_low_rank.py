"""The low-rank plus diagonal metric (``metric="low-rank"``): its operations against a dense
oracle, its construction against exact answers and a full-space oracle, its adaptation
in both warmups and for every kernel, its storage, and draws from the right distribution.

The oracles are slow and obviously correct: the full ``D x D`` inverse metric built from
the record's fields term by term (its operations then those of
:class:`hmc.metric.DenseMetric`), and the construction done in the full space, rooted at
the other matrix, instead of in the subspace of the draws.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings

import numpy as np
import pytest
import torch
from conftest import assert_moments, gaussian_log_prob
from test_models_posteriordb import FAST, FAST_CHECKS

import hmc
from hmc.adapt.low_rank import (
    VALUE_FLOOR,
    LowRank,
    low_rank_from_dense,
    low_rank_metric,
    window_add,
    window_init,
)
from hmc.arrays import as_arrays
from hmc.checkpoint import read_checkpoint
from hmc.metric import (
    DenseMetric,
    LowRankMetric,
    inverse_diagonal,
    kinetic_energy_and_velocity,
    metric_from_fields,
    metric_from_inverse,
    unit_metric,
)
from hmc.warm_start import LOW_RANK_VARIABLES

F64 = torch.float64


# ---------------------------------------------------------------------- oracles
def dense_oracle(metric: LowRankMetric) -> torch.Tensor:
    """``(C, D, D)``: ``diag(s) (I + sum_j (values_j - 1) u_j u_j^T) diag(s)``, term by term
    in float64."""
    scale, vectors, values = (torch.as_tensor(x).to(F64) for x in metric)
    chains, dim, rank = vectors.shape
    out = torch.zeros(chains, dim, dim, dtype=F64)
    for c in range(chains):
        whitened = torch.eye(dim, dtype=F64)
        for j in range(rank):
            u = vectors[c, :, j]
            whitened = whitened + (values[c, j] - 1.0) * torch.outer(u, u)
        out[c] = torch.diag(scale[c]) @ whitened @ torch.diag(scale[c])
    return out


def spd_root(m: np.ndarray, power: float = 0.5) -> np.ndarray:
    """``m ** power`` of a symmetric positive definite matrix, through its eigenvalues."""
    values, vectors = np.linalg.eigh(0.5 * (m + m.T))
    return (vectors * values**power) @ vectors.T


def construction_oracle(x: np.ndarray, g: np.ndarray, gamma: float) -> tuple:
    """One window ``(n, D)`` of draws and gradients: the whitening scale, the whitened
    inverse metric ``(D, D)`` in the full space, ``A # B^-1 =
    A^1/2 (A^-1/2 B^-1 A^-1/2)^1/2 A^1/2`` (rooted at ``A``, where the package roots at
    ``B`` and works in the subspace), and ``A``, ``B``."""
    xc, gc = x - x.mean(0), g - g.mean(0)
    scale = (xc.var(0) / gc.var(0)) ** 0.25
    y, h = xc / scale, gc * scale
    eye = np.eye(x.shape[1])
    a, b = y.T @ y / gamma + eye, h.T @ h / gamma + eye
    a_root, a_inverse_root = spd_root(a), spd_root(a, -0.5)
    inner = spd_root(a_inverse_root @ np.linalg.inv(b) @ a_inverse_root)
    return scale, a_root @ inner @ a_root, a, b


def random_low_rank(chains: int, dim: int, rank: int, unused: int, seed: int, dtype=F64):
    """A record with orthonormal vectors, values spread over 1e-3..1e3, and ``unused``
    empty slots per chain."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.linalg.qr(torch.randn(chains, dim, rank, generator=generator, dtype=F64)).Q
    values = torch.exp(torch.empty(chains, rank, dtype=F64).uniform_(-7, 7, generator=generator))
    values[:, rank - unused :] = 1.0
    q[:, :, rank - unused :] = 0.0
    scale = torch.exp(torch.randn(chains, dim, generator=generator, dtype=F64))
    return LowRankMetric(scale.to(dtype), q.to(dtype), values.to(dtype))


def rotated_gaussian(dim: int, condition: float, seed: int) -> np.ndarray:
    """A covariance with eigenvalues log-spaced over ``condition``, randomly rotated."""
    rng = np.random.default_rng(seed)
    rotation = np.linalg.qr(rng.standard_normal((dim, dim)))[0]
    eigenvalues = np.logspace(-0.5, 0.5, dim) ** np.log10(condition)
    return rotation @ np.diag(eigenvalues) @ rotation.T


# ---------------------------------------------------------------------- the record
def test_operations_equal_the_dense_oracle():
    """Velocity, kinetic energy, momentum draw (its covariance is M) and the diagonal, for
    3 chains in 7 dimensions with 4 slots (one unused), to 1e-12 in float64."""
    metric = random_low_rank(3, 7, 4, unused=1, seed=0)
    inverse = dense_oracle(metric)
    dense = metric_from_inverse(inverse)
    p = torch.randn(3, 7, dtype=F64, generator=torch.Generator().manual_seed(1))
    kinetic, velocity = kinetic_energy_and_velocity(metric, p)
    dense_kinetic, dense_velocity = kinetic_energy_and_velocity(dense, p)
    torch.testing.assert_close(velocity, dense_velocity, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(metric.velocity(p), dense_velocity, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(kinetic, dense_kinetic, rtol=1e-12, atol=0)
    torch.testing.assert_close(metric.kinetic_energy(p), dense_kinetic, rtol=1e-12, atol=0)
    # momenta G z with G G^T = M = inverse^-1: the columns of G from unit noise
    eye = torch.eye(7, dtype=F64)
    columns = torch.stack([metric.momentum(eye[i].expand(3, 7)) for i in range(7)], -1)
    mass = columns @ columns.mT
    torch.testing.assert_close(mass @ inverse, eye.expand(3, 7, 7), rtol=0, atol=1e-10)
    torch.testing.assert_close(
        inverse_diagonal(metric), inverse.diagonal(dim1=-2, dim2=-1), rtol=1e-12, atol=0
    )


def test_numpy_fields_give_the_same_operations():
    """The NumPy engine applies the record to arrays (the host NUTS trees)."""
    metric = random_low_rank(2, 5, 3, unused=0, seed=2)
    arrays = as_arrays(metric)
    p = torch.randn(2, 5, dtype=F64, generator=torch.Generator().manual_seed(3))
    for name in ("velocity", "kinetic_energy", "momentum"):
        ours = getattr(arrays, name)(p.numpy())
        assert isinstance(ours, np.ndarray)
        np.testing.assert_allclose(ours, getattr(metric, name)(p).numpy(), rtol=1e-13)
    kinetic, velocity = kinetic_energy_and_velocity(arrays, p.numpy())
    np.testing.assert_allclose(kinetic, metric.kinetic_energy(p).numpy(), rtol=1e-13)
    np.testing.assert_allclose(velocity, metric.velocity(p).numpy(), rtol=1e-13)


def test_float32_record_stays_positive_definite():
    """With values at the floor and float32 fields (vectors orthonormal only to float32's
    rounding), the kinetic energy of every momentum is positive and the record's matrix,
    evaluated exactly from its float32 fields, is positive definite. (Applied as
    ``diag(s)(I + U (values - 1) U^T)diag(s)`` it would not be: ``1 + (v - 1)|u|^2`` is
    ``v`` minus float32's rounding of ``|u|^2``.)"""
    metric = random_low_rank(64, 40, 8, unused=0, seed=4)
    metric = metric._replace(values=metric.values.clamp(max=1.0) * 0 + VALUE_FLOOR)
    metric = LowRankMetric(*(x.to(torch.float32) for x in metric))
    p = metric.vectors[:, :, 0] / metric.scale  # along the smallest direction
    assert (metric.kinetic_energy(p) > 0).all()
    factor = torch.stack(
        [metric.factor(torch.eye(40).expand(64, 40, 40)[:, i].contiguous()) for i in range(40)], -1
    ).to(F64)
    assert (torch.linalg.eigvalsh(factor @ factor.mT) > 0).all()


def test_a_trajectory_equals_the_dense_oracles():
    """Forty leapfrog steps on a non-quadratic density with the low-rank record and with
    the dense metric of its matrix: the same positions, momenta and energies to
    rounding."""
    metric = random_low_rank(3, 5, 3, unused=1, seed=6)
    metric = metric._replace(values=metric.values.clamp(0.2, 5.0))
    dense = metric_from_inverse(dense_oracle(metric))
    potential = hmc.Potential(lambda q: -0.5 * (q**2).sum() - 0.1 * (q**4).sum())
    q0 = torch.randn(3, 5, dtype=F64, generator=torch.Generator().manual_seed(7))
    p0 = metric.momentum(torch.randn(3, 5, dtype=F64, generator=torch.Generator().manual_seed(8)))
    ends = []
    for chosen in (metric, dense):
        u, grad = potential.value_and_grad(q0)
        state, p = hmc.State(q0, u, grad), p0
        for _ in range(40):
            state, p = hmc.leapfrog(
                state, p, torch.full((3, 1), 0.05, dtype=F64), chosen, potential
            )
        ends.append((state.position, p, state.potential + chosen.kinetic_energy(p)))
    for ours, oracle in zip(*ends, strict=True):
        torch.testing.assert_close(ours, oracle, rtol=1e-11, atol=1e-11)


def test_compiled_transition_picks_the_record_by_its_fields():
    metric = random_low_rank(2, 3, 2, unused=0, seed=5)
    assert isinstance(metric_from_fields(*metric), LowRankMetric)
    dense = metric_from_inverse(dense_oracle(metric))
    assert isinstance(metric_from_fields(*dense), DenseMetric)


# ---------------------------------------------------------------------- the construction
def gaussian_window(cov: np.ndarray, n: int, seed: int, chains: int = 1):
    """``chains`` windows of ``n`` exact Gaussian draws and their gradients ``-P x``."""
    rng = np.random.default_rng(seed)
    x = rng.multivariate_normal(np.zeros(len(cov)), cov, size=(chains, n))
    return torch.from_numpy(x), torch.from_numpy(-x @ np.linalg.inv(cov))


def test_exact_for_a_gaussian_when_every_direction_is_kept():
    """For exact Gaussian gradients the Fisher-divergence solution is the covariance
    itself, whatever the sample (``Cov g = P Cov x P``, and ``Cov x # (P Cov x P)^-1 =
    P^-1``): with a cutoff at 1 and room for every direction, the fitted inverse metric
    equals the covariance up to the ridge."""
    cov = rotated_gaussian(8, 1e3, seed=0)
    x, g = gaussian_window(cov, 200, seed=1, chains=2)
    options = LowRank(max_rank=8, cutoff=1.0 + 1e-12)
    metric = low_rank_metric(x, g, torch.ones(2, 200, dtype=torch.bool), options)
    assert metric.vectors.dtype == F64
    fitted = dense_oracle(metric)
    for c in range(2):
        np.testing.assert_allclose(fitted[c].numpy(), cov, rtol=1e-6, atol=1e-6 * cov.max())


def test_equals_the_full_space_oracle_with_fewer_draws_than_dimensions():
    """30 dimensions, 12 draws: the subspace of the draws and gradients (24 directions)
    holds the whole correction; the result equals the full-space construction's in every
    direction, its eigenvalues are those of the oracle's outside ``[1/c, c]`` (here no
    cap), and the scale is the oracle's. With every direction kept it solves the
    defining equation ``S B S = A``."""
    cov = rotated_gaussian(30, 1e2, seed=3)
    x, g = gaussian_window(cov, 12, seed=4)
    options = LowRank(max_rank=30, cutoff=2.0, gamma=1.0)  # A, B well conditioned
    metric = low_rank_metric(x, g, torch.ones(1, 12, dtype=torch.bool), options)
    scale, whitened, a, b = construction_oracle(x[0].numpy(), g[0].numpy(), options.gamma)
    np.testing.assert_allclose(metric.scale[0].numpy(), scale, rtol=1e-10)
    eigenvalues = np.linalg.eigvalsh(whitened)
    outside = np.sort(eigenvalues[np.abs(np.log(eigenvalues)) > np.log(options.cutoff)])
    kept = metric.values[0][metric.values[0] != 1.0].numpy()
    np.testing.assert_allclose(np.sort(kept), outside, rtol=1e-8)
    # the kept part: the oracle's matrix restricted to those eigenvectors
    values, vectors = np.linalg.eigh(whitened)
    chosen = np.abs(np.log(values)) > np.log(options.cutoff)
    expected = np.eye(30) + (vectors[:, chosen] * (values[chosen] - 1)) @ vectors[:, chosen].T
    ours = dense_oracle(metric)[0].numpy() / np.outer(scale, scale)
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-8 * np.abs(expected).max())
    every = low_rank_metric(x, g, torch.ones(1, 12, dtype=torch.bool), LowRank(30, 1 + 1e-12, 1.0))
    solution = dense_oracle(every)[0].numpy() / np.outer(scale, scale)
    np.testing.assert_allclose(solution @ b @ solution, a, rtol=0, atol=1e-10 * np.abs(a).max())


def test_cutoff_and_cap_keep_the_directions_farthest_from_one():
    """From a dense covariance whose whitened eigenvalues are known (unit diagonal:
    a correlation matrix), the cutoff drops those inside ``[1/c, c]`` and the cap keeps
    the ``k`` largest ``|log value|``."""
    rng = np.random.default_rng(5)
    rotation = np.linalg.qr(rng.standard_normal((6, 6)))[0]
    # a correlation matrix: spectrum chosen, then the diagonal normalised back to 1 leaves
    # it approximately; the test reads the exact whitened spectrum from the matrix
    cov = rotation @ np.diag([9.0, 3.0, 1.5, 0.7, 0.3, 0.05]) @ rotation.T
    scale = np.sqrt(np.diag(cov))
    whitened = cov / np.outer(scale, scale)
    spectrum = np.linalg.eigvalsh(whitened)
    distance = np.abs(np.log(spectrum))
    for cutoff, cap in ((2.0, 6), (2.0, 2), (1.2, 3), (50.0, 4)):
        metric = low_rank_from_dense(torch.from_numpy(cov)[None], LowRank(cap, cutoff))
        assert metric.values.shape == (1, min(cap, 6))
        used = metric.values[0][metric.values[0] != 1.0].numpy()
        outside = spectrum[distance > np.log(cutoff)]
        expected = outside[np.argsort(-np.abs(np.log(outside)))][:cap]
        np.testing.assert_allclose(np.sort(used), np.sort(expected), rtol=1e-10)
        unused = metric.values[0] == 1.0
        assert (metric.vectors[0][:, unused] == 0).all()


def test_float32_draws_give_a_positive_definite_metric():
    """Float32 draws and gradients of an ill-conditioned Gaussian (condition 1e6): the
    construction runs in float64, and the metric cast back to float32 is positive
    definite in every one of 32 windows (BlackJAX issue 956: float32 arithmetic made it
    indefinite in most runs)."""
    cov = rotated_gaussian(20, 1e6, seed=6)
    x, g = gaussian_window(cov, 15, seed=7, chains=32)
    kept = torch.ones(32, 15, dtype=torch.bool)
    metric = low_rank_metric(x.float(), g.float(), kept, LowRank(max_rank=20))
    assert all(f.dtype == F64 for f in metric)
    # the float32 inputs' rounding only: the fit of the same inputs in float64
    exact = low_rank_metric(x.float().double(), g.float().double(), kept, LowRank(max_rank=20))
    fitted, reference = dense_oracle(metric).numpy(), dense_oracle(exact).numpy()
    pairs = zip(fitted, reference, strict=True)
    spectrum = np.stack([whitened_spectrum(f[None], r) for f, r in pairs])
    np.testing.assert_allclose(spectrum, 1.0, atol=1e-9)
    metric = LowRankMetric(*(f.to(torch.float32) for f in metric))
    assert (torch.linalg.eigvalsh(dense_oracle(metric)) > 0).all()
    p = torch.randn(32, 20, generator=torch.Generator().manual_seed(8))
    assert (metric.kinetic_energy(p) > 0).all()


def test_rows_not_kept_are_ignored_and_a_flat_coordinate_is_floored():
    """Rows outside the window change nothing; a coordinate that never moved (zero
    variance) gets a scale floored relative to the others, never 0 or NaN."""
    cov = rotated_gaussian(4, 10.0, seed=9)
    x, g = gaussian_window(cov, 40, seed=10)
    kept = torch.ones(1, 40, dtype=torch.bool)
    reference = low_rank_metric(x[:, :30], g[:, :30], kept[:, :30], LowRank())
    kept[:, 30:] = False
    noisy = x.clone()
    noisy[:, 30:] = 1e6
    masked = low_rank_metric(noisy, g, kept, LowRank())
    for a, b in zip(reference, masked, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    stuck = x.clone()
    stuck[..., 0] = 0.5
    metric = low_rank_metric(stuck, g, torch.ones(1, 40, dtype=torch.bool), LowRank())
    assert all(torch.isfinite(f).all() for f in metric)
    assert (metric.scale > 0).all() and (metric.values > 0).all()


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_window_writes_each_chain_into_its_slot(kind):
    position = torch.arange(6, dtype=F64).reshape(3, 2)
    like = position.numpy() if kind == "numpy" else position
    window = window_init(like, 4)
    mask = np.array([True, False, True])
    slots = np.array([0, 3, 2])
    if kind == "torch":
        mask, slots = torch.from_numpy(mask), torch.from_numpy(slots)
    window_add(window, like, -like, mask, slots)
    assert window.kept.tolist() == [
        [True, False, False, False],
        [False] * 4,
        [False, False, True, False],
    ]
    assert window.position[2, 2].tolist() == [4.0, 5.0]
    assert window.gradient[0, 0].tolist() == [-0.0, -1.0]
    assert (window.position[1] == 0).all()


# ---------------------------------------------------------------------- settings
def test_settings_are_checked_before_work():
    with pytest.raises(ValueError, match="max_rank must be an integer >= 1"):
        LowRank(max_rank=0)
    with pytest.raises(ValueError, match="cutoff must be a finite number > 1"):
        LowRank(cutoff=1.0)
    with pytest.raises(ValueError, match="gamma must be a finite number > 0"):
        LowRank(gamma=0.0)
    with pytest.raises(ValueError, match=r"metric must be one of .* or an hmc\.LowRank"):
        hmc.sample(lambda q: -(q**2).sum(), dim=2, metric="lowrank", progress=False)
    with pytest.raises(ValueError, match="metric='low-rank' keeps each window's draws"):
        hmc.sample(
            lambda q: -(q**2).sum(-1), dim=20000, chains=2000, draws=1, metric="low-rank",
            batched=True, progress=False, store=None,
        )  # fmt: skip


# ---------------------------------------------------------------------- runs
COV10 = rotated_gaussian(10, 1e3, seed=0)  # D = 10, condition number 1e3, rotated
MEAN10 = np.linspace(-1.0, 1.0, 10)


def draws_of(dt) -> np.ndarray:
    return dt["posterior"]["x"].values


def adapted_matrices(dt) -> np.ndarray:
    """``(chain, D, D)`` the adapted inverse metrics, from the adaptation group's fields."""
    group = dt["adaptation"]
    fields = (group[name].values for name in LOW_RANK_VARIABLES)
    return dense_oracle(LowRankMetric(*map(torch.from_numpy, fields))).numpy()


def whitened_spectrum(inverse: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """Eigenvalues of each inverse metric ``(C, D, D)`` in the covariance's coordinates:
    all 1 for a perfect metric."""
    whiten = np.linalg.inv(np.linalg.cholesky(cov))
    return np.stack([np.linalg.eigvalsh(whiten @ m @ whiten.T) for m in inverse])


def sample_gaussian(**kw):
    settings = dict(dim=10, chains=4, warmup=1000, draws=1000, batched=True, progress=False)
    return hmc.sample(gaussian_log_prob(MEAN10, COV10), **{**settings, **kw})


def test_nuts_with_stan_warmup_draws_a_rotated_ill_conditioned_gaussian():
    """Means, variances and every correlation within MCSE bounds; each chain's adapted
    metric, fitted from its own last window, is within a factor of 3 of the covariance
    in every direction (the diagonal metric's spectrum in those coordinates spans the
    condition number's worth, about 1e2 here) and no transition diverges."""
    dt = sample_gaussian(metric="low-rank", seed=1, warmup=600, draws=600)
    assert_moments(draws_of(dt), MEAN10, COV10)
    spectrum = whitened_spectrum(adapted_matrices(dt), COV10)
    assert ((spectrum > 1 / 3) & (spectrum < 3)).all(), spectrum
    inverse = dt["adaptation"]["inverse_metric"].values
    np.testing.assert_allclose(inverse, adapted_matrices(dt).diagonal(axis1=1, axis2=2))
    assert not dt["sample_stats"]["diverging"].values.any()
    assert dt.attrs["metric"] == "low-rank"


def min_ess_per_gradient(dt, mean) -> float:
    """The smallest bulk ESS over the coordinates and their squared deviations, per
    gradient evaluation."""
    import arviz_stats
    import xarray

    x = draws_of(dt)
    dims = ("chain", "draw", "d")
    data = xarray.Dataset({"x": (dims, x), "square": (dims, (x - mean) ** 2)})
    ess = arviz_stats.ess(data, method="bulk")
    return float(min(ess["x"].min(), ess["square"].min())) / dt.attrs["n_gradient_evaluations"]


@pytest.mark.slow  # two runs of 4 x 2000 iterations, 15 s
def test_ess_per_gradient_beats_the_diagonal_metric():
    """On the rotated Gaussian the low-rank metric gives 4.8-5.4 times the diagonal
    metric's smallest ESS per gradient (seeds 1-3); asserted with a wide margin: 2."""
    low_rank = sample_gaussian(metric="low-rank", seed=2)
    diagonal = sample_gaussian(metric="diag", seed=2)
    ratio = min_ess_per_gradient(low_rank, MEAN10) / min_ess_per_gradient(diagonal, MEAN10)
    assert ratio > 2.0, ratio


@pytest.mark.parametrize(
    ("kernel", "adapt"),
    [("nuts", "ensemble"), ("hmc", "ensemble"), ("chees", "ensemble"), ("hmc", "stan")],
)
def test_every_kernel_and_warmup_draws_the_gaussian(kernel, adapt):
    """NUTS, static HMC and ChEES with the pooled warmup (one metric from every chain's
    window), static HMC with Stan's: moments within MCSE bounds, one metric shared by
    the pooled chains."""
    chains = 16 if adapt == "ensemble" else 4
    dt = sample_gaussian(
        metric="low-rank", kernel=kernel, adapt=adapt, chains=chains, warmup=500, draws=250,
        seed=3,
    )  # fmt: skip
    assert_moments(draws_of(dt), MEAN10, COV10)
    spectrum = whitened_spectrum(adapted_matrices(dt), COV10)
    assert ((spectrum > 1 / 3) & (spectrum < 3)).all(), spectrum
    if adapt == "ensemble":
        scale = dt["adaptation"]["metric_scale"].values
        np.testing.assert_array_equal(scale, np.broadcast_to(scale[0], scale.shape))


def test_a_float32_run_stays_finite_and_positive_definite():
    """Float32 chains on the condition-1e3 Gaussian: the metric is fitted in float64 and
    stored in float32, its matrix positive definite, the draws finite and right."""
    dt = sample_gaussian(
        metric="low-rank", dtype=torch.float32, seed=4, chains=2, warmup=500, draws=500
    )
    x = draws_of(dt)
    assert x.dtype == np.float32 and np.isfinite(x).all()
    assert dt["adaptation"]["metric_eigenvectors"].dtype == np.float32
    assert (np.linalg.eigvalsh(adapted_matrices(dt)) > 0).all()
    assert_moments(x, MEAN10, COV10)


@pytest.mark.slow  # four posteriors, 3-10 s each
@pytest.mark.parametrize("name", sorted(FAST))
def test_the_fast_posteriordb_subset_matches_the_reference(name):
    """The posteriordb CI subset (``test_models_posteriordb.FAST``, its settings and
    bound) with the low-rank metric: means and sds within the bound, ESS and R-hat
    sound, no divergence."""
    import hmc.models
    from hmc.models.validation import compare, z_bound

    warmup, draws = FAST[name]
    dt = hmc.sample(
        hmc.models.load(name), chains=4, warmup=warmup, draws=draws, seed=20, progress=False,
        metric="low-rank",
    )  # fmt: skip
    bound = z_bound(FAST_CHECKS, alpha=1e-3)
    for check in compare(name, dt):
        assert check.ess_bulk > 100 and check.ess_tail > 100 and check.rhat < 1.05, check
        assert abs(check.mean_z) < bound and abs(check.sd_z) < bound, check
    assert int(dt["sample_stats"]["diverging"].sum()) == 0


@pytest.mark.slow  # 4 x 1000 iterations of a regression, 7-12 s
def test_a_posteriordb_posterior_matches_its_reference():
    """sblrc-blr (D = 6, correlated regression coefficients) with NUTS and the low-rank
    metric: means and sds against posteriordb's reference within a Bonferroni bound."""
    import hmc.models
    from hmc.models.validation import compare, z_bound

    name = "sblrc-blr"
    dt = hmc.sample(
        hmc.models.load(name), chains=4, warmup=500, draws=500, seed=20, progress=False,
        metric="low-rank",
    )  # fmt: skip
    checks = compare(name, dt)
    bound = z_bound(2 * len(checks), alpha=1e-3)
    for check in checks:
        assert abs(check.mean_z) < bound and abs(check.sd_z) < bound, check
        assert check.ess_bulk > 400, check


# ---------------------------------------------------------------------- storage
def correlated(q: torch.Tensor) -> torch.Tensor:
    """A 4-D Gaussian with correlations 0.95 between neighbours' pairs (batched)."""
    a, b = q[..., 0], q[..., 1]
    return -0.5 * ((a - b) ** 2 / 0.1 + (a + b) ** 2 / 4 + q[..., 2] ** 2 + q[..., 3] ** 2 / 9)


def same_run(a, b) -> None:
    """Bit for bit: the draws, the statistics and the adapted metric's fields."""
    np.testing.assert_array_equal(draws_of(a), draws_of(b))
    for name in a["sample_stats"].data_vars:
        np.testing.assert_array_equal(
            a["sample_stats"][name].values, b["sample_stats"][name].values
        )
    for name in ("step_size", "inverse_metric", *LOW_RANK_VARIABLES):
        np.testing.assert_array_equal(a["adaptation"][name].values, b["adaptation"][name].values)


@pytest.mark.parametrize(
    ("adapt", "engine", "stops"),
    [
        ("stan", "numpy", (120, 210)),
        pytest.param("stan", "torch", (120,), marks=pytest.mark.slow),
        pytest.param("ensemble", "numpy", (60, 130), marks=pytest.mark.slow),
    ],
)
def test_a_run_interrupted_mid_window_resumes_to_the_uninterrupted_result(
    adapt, engine, stops, tmp_path
):
    """Interrupted inside a slow window (its buffered draws and gradients in the
    checkpoint) and while sampling, the run goes on to the uninterrupted one bit for bit;
    the checkpoint holds the metric's fields."""
    chains = 16 if adapt == "ensemble" else 3
    settings = dict(
        dim=4, chains=chains, warmup=200, draws=30, seed=5, batched=True, progress=False,
        metric=LowRank(max_rank=3), adapt=adapt, engine=engine, checkpoint_every=10,
    )  # fmt: skip
    whole = hmc.sample(correlated, checkpoint=tmp_path / "whole.ckpt", **settings)
    saved = read_checkpoint(tmp_path / "whole.ckpt")
    assert [tuple(x.shape) for x in saved["low_rank_metric"]] == [
        (chains, 4), (chains, 4, 3), (chains, 3),
    ]  # fmt: skip
    assert saved["settings"]["low_rank"] == {"max_rank": 3, "cutoff": 2.0, "gamma": 1e-5}
    for stop_at in stops:
        path = tmp_path / f"{stop_at}.ckpt"

        calls = [0]

        def interrupted(q, path=path, stop_at=stop_at, calls=calls):
            calls[0] += 1  # the file read every 50 evaluations, not at each
            checked = calls[0] % 50 == 0 and path.exists()
            if checked and read_checkpoint(path)["iteration"] >= stop_at:
                raise KeyboardInterrupt
            return correlated(q)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with contextlib.suppress(KeyboardInterrupt):
                hmc.sample(interrupted, checkpoint=path, **settings)
        assert stop_at <= read_checkpoint(path)["iteration"] < 230
        same_run(hmc.resume(path, correlated), whole)


@pytest.fixture(scope="module")
def previous():
    """A low-rank run on the correlated Gaussian, 3 chains."""
    return hmc.sample(
        correlated, dim=4, chains=3, warmup=300, draws=50, seed=6, batched=True,
        progress=False, metric="low-rank",
    )  # fmt: skip


def warm(previous, **kw):
    settings = dict(dim=4, chains=3, warmup=0, draws=20, seed=7, batched=True, progress=False)
    return hmc.sample(correlated, adapted_from=previous, **{**settings, **kw})


def test_adapted_from_a_low_rank_run(previous, tmp_path):
    """Without warmup a low-rank run reuses each chain's metric; a diagonal run takes its
    matrix's diagonal, a dense run the matrix; another number of chains takes the chain
    with the median step size; a run from a diagonal one starts at that diagonal, from a
    dense one at its nearest low-rank metric (the same matrix, where every direction is
    kept). (The other metrics diverge with the low-rank metric's step size: no matter.)"""
    again = warm(previous, metric="low-rank")
    assert not again["sample_stats"]["diverging"].values.any()
    for name in ("step_size", *LOW_RANK_VARIABLES):
        np.testing.assert_array_equal(
            again["adaptation"][name].values, previous["adaptation"][name].values
        )
    warnings.simplefilter("ignore", RuntimeWarning)  # (the divergences of the others)
    diagonal = warm(previous, metric="diag")
    np.testing.assert_allclose(
        diagonal["adaptation"]["inverse_metric"].values,
        previous["adaptation"]["inverse_metric"].values,
    )
    dense = warm(previous, metric="dense")
    np.testing.assert_allclose(
        dense["adaptation"]["inverse_metric"].values, adapted_matrices(previous), rtol=1e-12
    )
    five = warm(previous, metric="low-rank", chains=5)
    median = int(np.argsort(previous["adaptation"]["step_size"].values)[1])
    for name in LOW_RANK_VARIABLES:
        values = five["adaptation"][name].values
        np.testing.assert_array_equal(
            values, np.broadcast_to(previous["adaptation"][name].values[median], values.shape)
        )
    from_diagonal = warm(diagonal, metric="low-rank")
    np.testing.assert_allclose(
        from_diagonal["adaptation"]["metric_scale"].values ** 2,
        diagonal["adaptation"]["inverse_metric"].values,
    )
    assert (from_diagonal["adaptation"]["metric_eigenvalues"].values == 1).all()
    from_dense = warm(dense, metric=LowRank(cutoff=1 + 1e-9))
    np.testing.assert_allclose(
        adapted_matrices(from_dense), adapted_matrices(previous), rtol=1e-8, atol=1e-10
    )


@pytest.mark.slow  # a compile, 5-13 s
def test_a_compiled_static_hmc_transition_gives_the_eager_draws(previous):
    """The low-rank metric traced into the compiled lockstep transition: the same draws
    as the eager one to rounding, from the same adapted metric."""
    kernel = hmc.HMC(num_steps=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = warm(previous, metric="low-rank", kernel=kernel, compile=True, step_size=0.3)
    eager = warm(previous, metric="low-rank", kernel=kernel, compile=False, step_size=0.3)
    assert compiled.attrs["compiled"] == 1 and eager.attrs["compiled"] == 0
    np.testing.assert_allclose(draws_of(compiled), draws_of(eager), atol=1e-10)
    np.testing.assert_allclose(
        compiled["sample_stats"]["energy"].values, eager["sample_stats"]["energy"].values,
        rtol=1e-10,
    )  # fmt: skip


@pytest.mark.parametrize("adapt", ["stan", "ensemble"])
def test_the_adapted_metric_is_the_fit_of_the_last_windows_draws(adapt):
    """The metric a run ends with is :func:`low_rank_metric` of exactly the draws of its
    last slow window and their gradients (each chain's own in Stan's warmup, every
    chain's pooled), recomputed here from the saved warmup draws (the Gaussian's gradient
    is known): no draw of another window, no empty slot."""
    chains = 16 if adapt == "ensemble" else 2
    dt = sample_gaussian(
        metric="low-rank", adapt=adapt, chains=chains, warmup=200, draws=10, seed=8,
        save_warmup=True,
    )  # fmt: skip
    x = dt["warmup_posterior"]["x"].values  # (chain, ran, D), skipped iterations left out
    if adapt == "stan":
        first, last = 100, 149  # build_schedule(200): windows 75-99, 100-149
    else:  # ensemble_schedule(200): 20-39, 40-79, 80-159, the last skipped by an early stop
        assert len(dt.attrs["restarted_chains"]) == 0
        first, last = (40, 79) if dt.attrs["tuning_steps"] == 120 else (80, 159)
    window = torch.from_numpy(x[:, first : last + 1])
    gradient = (window - torch.from_numpy(MEAN10)) @ torch.from_numpy(np.linalg.inv(COV10))
    kept = torch.ones(window.shape[:2], dtype=torch.bool)
    if adapt == "ensemble":
        window, gradient, kept = (
            t.transpose(0, 1).reshape(1, -1, *t.shape[2:]) for t in (window, gradient, kept)
        )
    expected = dense_oracle(low_rank_metric(window, gradient, kept, LowRank())).numpy()
    np.testing.assert_allclose(
        adapted_matrices(dt), np.broadcast_to(expected, (chains, 10, 10)), rtol=1e-8, atol=1e-10
    )


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_stan_warmup_fits_each_window_from_its_own_draws_only(kind):
    """Stan's adapter with a shorter window after a longer one (10 slots, then 5): the
    second metric is the fit of the second window's 5 draws and gradients alone (no
    slot of the first window counts), and chains that finish at other times fill their
    own slots."""
    from hmc.adapt.schedule import schedule_from_windows
    from hmc.adapt.warmup import StanWarmup

    chains, dim = 2, 3
    schedule = schedule_from_windows(20, [(2, 11), (12, 16)])
    keep = lambda state, step_size, metric, keys, counter: (step_size, counter)  # noqa: E731
    adapter = StanWarmup(schedule, keep, low_rank=LowRank(max_rank=3, cutoff=1 + 1e-9))
    generator = torch.Generator().manual_seed(9)
    positions = torch.randn(20, chains, dim, dtype=F64, generator=generator)
    gradients = torch.randn(20, chains, dim, dtype=F64, generator=generator)
    state = hmc.State(positions[0], torch.zeros(chains, dtype=F64), gradients[0])
    params = hmc.Params(torch.ones(chains, dtype=F64), unit_metric("low-rank", positions[0], 3))
    keys = torch.arange(chains)
    adaptation, params = adapter.init(state, params, keys)
    engine = as_arrays if kind == "numpy" else (lambda x: x)
    adaptation, params = engine(adaptation), params._replace(step_size=engine(params.step_size))
    adapter = dataclasses.replace(adapter, schedule=engine(schedule))  # as the driver does
    for t in range(17):
        state = hmc.State(positions[t], torch.zeros(chains, dtype=F64), gradients[t])
        iteration = torch.full((chains,), t)
        done = torch.ones(chains, dtype=torch.bool)
        accept = torch.full((chains,), 0.8, dtype=F64)
        adaptation, params = adapter.update(
            adaptation, params, engine(done), engine(iteration), engine(accept), engine(state),
            keys,
        )  # fmt: skip
    window = (positions[12:17].transpose(0, 1), gradients[12:17].transpose(0, 1))
    expected = low_rank_metric(*window, torch.ones(chains, 5, dtype=torch.bool), adapter.low_rank)
    np.testing.assert_allclose(
        dense_oracle(params.metric).numpy(), dense_oracle(expected).numpy(), rtol=1e-10
    )
