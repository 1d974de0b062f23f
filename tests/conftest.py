"""Shared test set-up and helpers.

Every test runs on one CPU thread with fixed seeds, so results are deterministic.

Helpers importable from test modules (``from conftest import assert_moments``):

- :func:`gaussian_log_prob` builds a log density ``(..., D) -> (...)`` for a Gaussian,
  :func:`diagonal_gaussian_log_prob` an elementwise one (bit-identical on any batch).
- :func:`assert_moments` checks draws against known means, variances and correlations
  with Monte Carlo standard error (MCSE) based tolerances.
- :func:`mcse_z_scores` gives the z-scores of expectations of any per-draw quantities.
- :func:`z_bound` picks the z bound for a number of simultaneous checks.
"""

from __future__ import annotations

import statistics

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
import torch

from hmc._torch_compat import validation_enabled
from hmc.arrays import as_arrays

torch.set_num_threads(1)

__all__ = [
    "assert_moments",
    "diagonal_gaussian_log_prob",
    "gaussian_log_prob",
    "mcse_z_scores",
    "z_bound",
]


# ---------------------------------------------------------------------- targets
def gaussian_log_prob(mean, cov):
    """Log density (up to a constant) of ``N(mean, cov)`` for ``q`` shaped ``(..., D)``.

    Works both for one position ``(D,)`` and for a batch ``(C, D)`` (``batched=True``).
    """
    mean = torch.as_tensor(np.asarray(mean, dtype=np.float64))
    precision = torch.linalg.inv(torch.as_tensor(np.asarray(cov, dtype=np.float64)))

    def log_prob(q: torch.Tensor) -> torch.Tensor:
        centred = q - mean.to(q)
        return -0.5 * ((centred @ precision.to(q)) * centred).sum(-1)

    return log_prob


def diagonal_gaussian_log_prob(mean, sd):
    """Elementwise ``N(mean, diag(sd**2))`` log density for ``q`` shaped ``(..., D)``."""
    mean = torch.as_tensor(np.asarray(mean, dtype=np.float64))
    sd = torch.as_tensor(np.asarray(sd, dtype=np.float64))

    def log_prob(q: torch.Tensor) -> torch.Tensor:
        return (-0.5 * ((q - mean.to(q)) / sd.to(q)) ** 2).sum(-1)

    return log_prob


def minor_mode_log_prob(q: torch.Tensor) -> torch.Tensor:
    """A standard 2-D Gaussian at the origin and a minor one at ``(20, 0)`` 60 nats below
    it (mass e^-60: nothing a sampler should report), their maximum, for ``q`` ``(C, 2)``.
    A chain started at the minor mode cannot leave it in a short warmup."""
    main = -0.5 * (q**2).sum(-1)
    minor = -60.0 - 0.5 * ((q[:, 0] - 20.0) ** 2 + q[:, 1] ** 2)
    return torch.maximum(main, minor)


# ---------------------------------------------------------------------- MCSE checks
def z_bound(checks: int, alpha: float = 1e-3) -> float:
    """Two-sided z bound so that ``checks`` independent standard normal z-scores all
    stay inside with probability about ``1 - alpha`` (Bonferroni)."""
    return statistics.NormalDist().inv_cdf(1 - alpha / (2 * max(checks, 1)))


def mcse_z_scores(values: np.ndarray, truth: np.ndarray, min_ess: float = 50.0):
    """z-scores ``(estimate - truth) / MCSE`` of the expectations of ``values``.

    Parameters
    ----------
    values : ``(chain, draw, K)`` per-draw quantities whose expectations are ``truth`` ``(K,)``.
    min_ess : each quantity must have at least this effective sample size (a sampler that
        never moves has an ESS of about the number of chains, or a NaN one).

    Returns
    -------
    z-scores ``(K,)``, estimates ``(K,)``, ESS ``(K,)``.
    """
    import arviz_stats

    values = np.asarray(values, dtype=np.float64)
    truth = np.asarray(truth, dtype=np.float64)
    estimate = values.mean(axis=(0, 1))
    sd = values.reshape(-1, values.shape[-1]).std(axis=0, ddof=1)
    ess = np.atleast_1d(np.asarray(arviz_stats.ess(values, method="mean"), dtype=np.float64))
    bad = ~(np.isfinite(ess) & (ess >= min_ess) & (sd > 0))
    assert not bad.any(), (
        f"effective sample size too small (< {min_ess}) or draws constant for quantities "
        f"{np.flatnonzero(bad).tolist()[:10]}: ess={ess[bad][:10]}, sd={sd[bad][:10]}"
    )
    mcse = sd / np.sqrt(ess)
    return (estimate - truth) / mcse, estimate, ess


def assert_moments(
    draws,
    mean,
    cov,
    *,
    z: float | None = None,
    variances: bool = True,
    correlations: bool | None = None,
    min_ess: float = 50.0,
) -> dict[str, np.ndarray]:
    """Assert that draws ``(chain, draw, D)`` have mean ``mean`` ``(D,)`` and covariance
    ``cov`` ``(D, D)`` (or variances ``(D,)``) within MCSE-based tolerances.

    Checked, each as ``|estimate - truth| / MCSE < z``:

    - means (MCSE from the ESS of each coordinate);
    - variances (unless ``variances=False``), as the means of ``(x_i - mean_i)**2``
      (MCSE from their ESS);
    - correlations (when ``correlations`` is True; by default when D <= 10), as the means
      of the products of standardised draws ``(x_i - m_i)(x_j - m_j) / (s_i s_j)`` (MCSE
      from the ESS of the products).

    ``z`` defaults to :func:`z_bound` of the number of checks. Returns the z-scores.

    The z-scores are close to standard normal only when the MCSE itself is estimated
    well, i.e. when the checked quantity has a few finite moments beyond the second: a
    variance check needs finite 8th moments of the draws to be reliable (a Student-t
    needs nu > 8; with nu = 5 the sample sd of x**2 is usually too small and |z| comes
    out too large), correlation checks likewise. For heavy tails pass
    ``variances=False, correlations=False`` and check quantiles or transformed draws.
    """
    x = np.asarray(draws, dtype=np.float64)
    assert x.ndim == 3, f"draws must be (chain, draw, D), got shape {x.shape}"
    dim = x.shape[-1]
    mean = np.asarray(mean, dtype=np.float64).reshape(dim)
    cov = np.asarray(cov, dtype=np.float64)
    if cov.ndim == 1:
        cov = np.diag(cov)
    assert cov.shape == (dim, dim)
    if correlations is None:
        correlations = dim <= 10
    sd = np.sqrt(np.diag(cov))
    quantities = {"mean": (x, mean)}
    if variances:
        quantities["variance"] = ((x - mean) ** 2, np.diag(cov))
    if correlations and dim > 1:
        i, j = np.triu_indices(dim, k=1)
        standard = (x - mean) / sd
        products = standard[..., i] * standard[..., j]
        quantities["correlation"] = (products, cov[i, j] / (sd[i] * sd[j]))
    checks = sum(truth.size for _, truth in quantities.values())
    if z is None:
        z = z_bound(checks)
    scores: dict[str, np.ndarray] = {}
    failures = []
    for name, (values, truth) in quantities.items():
        score, estimate, ess = mcse_z_scores(values, truth, min_ess=min_ess)
        scores[name] = score
        for k in np.flatnonzero(~(np.abs(score) < z)):
            failures.append(
                f"{name}[{k}]: estimate {estimate[k]:.6g}, truth {truth[k]:.6g}, "
                f"z = {score[k]:.2f} (ess {ess[k]:.0f})"
            )
    assert not failures, f"{len(failures)} of {checks} checks beyond z = {z:.2f}:\n" + "\n".join(
        failures[:20]
    )
    return scores


# ---------------------------------------------------------------------- fixtures
ENGINES = ("numpy", "torch")


@pytest.fixture(params=ENGINES)
def engine(request) -> str:
    """Each array engine the sampler can compute in on the CPU (``hmc.arrays``): tests
    that take this fixture run on every engine."""
    return request.param


def in_engine(record, engine: str):
    """A record of CPU tensors in ``engine``'s arrays (NumPy views for ``"numpy"``)."""
    return as_arrays(record) if engine == "numpy" else record


@pytest.fixture
def standard_normal():
    """``log_prob`` of a standard normal of any dimension (one position or a batch)."""

    def log_prob(q: torch.Tensor) -> torch.Tensor:
        return -0.5 * (q**2).sum(-1)

    return log_prob


@pytest.fixture(autouse=True)
def _seed_the_global_generator():
    """Tests that draw from torch's global generator get the same numbers whichever tests
    ran before them in the process (a selection with ``-k``, or another order)."""
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _restore_distribution_validation():
    """Tests must not leak a changed ``torch.distributions`` validation default."""
    before = validation_enabled()
    yield
    torch.distributions.Distribution.set_default_validate_args(before)


def pytest_report_header(config):
    return f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)"
