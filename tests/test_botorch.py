"""``hmc.botorch.fit_fully_bayesian_model_hmc`` against BoTorch's own NUTS fit.

Skipped without BoTorch (``pip install "hmc[botorch]"``); the comparison of the two fits'
predictions is in the slow tier (BoTorch's fit runs Pyro's NUTS).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from conftest import z_bound

botorch = pytest.importorskip("botorch")
pytest.importorskip("pyro")

import hmc.botorch  # noqa: E402

F64 = torch.float64


def small_problem():
    """10 points in 4-D, the response driven by the first two inputs, standardised."""
    g = torch.Generator().manual_seed(0)
    X = torch.rand(10, 4, generator=g, dtype=F64)
    Y = (
        torch.sin(6 * X[:, :1])
        + 0.5 * X[:, 1:2]
        + 0.05 * torch.randn(10, 1, generator=g, dtype=F64)
    )
    test_X = torch.rand(5, 4, generator=g, dtype=F64)
    return X, (Y - Y.mean()) / Y.std(), test_X


def saas_gp():
    from botorch.models import SaasFullyBayesianSingleTaskGP

    X, Y, _ = small_problem()
    return SaasFullyBayesianSingleTaskGP(X, Y)


def test_the_draws_are_loaded_thinned_as_botorch_loads_them():
    gp = saas_gp()
    dt = hmc.botorch.fit_fully_bayesian_model_hmc(
        gp, warmup_steps=60, num_samples=32, thinning=4, compile=False
    )
    assert not gp.training
    post = dt["posterior"]
    assert set(post.data_vars) >= {"outputscale", "mean", "noise", "kernel_tausq"}
    kept = slice(None, None, 4)
    expected = post["lengthscale"].values[0, kept]  # the model's deterministic site
    lengthscale = gp.covar_module.base_kernel.lengthscale.detach().squeeze(-2).numpy()
    np.testing.assert_allclose(lengthscale, expected, rtol=1e-10)
    np.testing.assert_allclose(
        gp.covar_module.outputscale.detach().numpy(), post["outputscale"].values[0, kept]
    )
    np.testing.assert_allclose(
        gp.mean_module.constant.detach().squeeze(-1).numpy(), post["mean"].values[0, kept]
    )


@pytest.mark.slow
def test_the_multi_task_saas_model_fits_through_the_same_path():
    """The multi-task SAAS GP (its task embedding a latent site too) fits and predicts:
    a batch of 8 GPs, finite predictions. Its draws are not compared with BoTorch's."""
    from botorch.models import SaasFullyBayesianMultiTaskGP

    X, Y, test_X = small_problem()
    task = torch.tensor([0.0, 1.0] * 5, dtype=F64).unsqueeze(-1)
    gp = SaasFullyBayesianMultiTaskGP(torch.cat([X, task], -1), Y, task_feature=-1)
    dt = hmc.botorch.fit_fully_bayesian_model_hmc(
        gp, warmup_steps=60, num_samples=32, thinning=4, compile=False
    )
    assert "latent_features" in dt["posterior"]
    with torch.no_grad():
        mean = gp.posterior(torch.cat([test_X, torch.zeros(5, 1, dtype=F64)], -1)).mean
    assert mean.shape == (8, 5, 1) and torch.isfinite(mean).all()


def test_refusals():
    with pytest.raises(TypeError, match="fully Bayesian BoTorch model"):
        hmc.botorch.fit_fully_bayesian_model_hmc(object())
    with pytest.raises(ValueError, match="thinning must be a positive integer"):
        hmc.botorch.fit_fully_bayesian_model_hmc(saas_gp(), thinning=0)


def test_without_botorch_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "botorch.models.fully_bayesian", None)
    with pytest.raises(ImportError, match=r'pip install "hmc\[botorch\]"'):
        hmc.botorch.fit_fully_bayesian_model_hmc(object())


def test_a_numpyro_botorch_is_refused_naming_the_version(monkeypatch):
    monkeypatch.setattr(hmc.botorch.metadata, "version", lambda name: "0.18.1")
    with pytest.raises(ImportError, match=r"BoTorch 0\.18\.1 writes its fully Bayesian models"):
        hmc.botorch.fit_fully_bayesian_model_hmc(object())


def per_draw_predictions(gp, test_X) -> np.ndarray:
    """``(1, S, 3 n)``: each loaded GP's predictive mean, variance and squared mean at the
    ``n`` test points (their averages give the mixture's mean and variance)."""
    with torch.no_grad():
        posterior = gp.posterior(test_X)
    mean = posterior.mean.squeeze(-1).numpy()
    variance = posterior.variance.squeeze(-1).numpy()
    return np.concatenate([mean, variance, mean**2], -1)[None]


def estimate_and_mcse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import arviz_stats

    ess = np.asarray(arviz_stats.ess(values, method="mean"), dtype=np.float64)
    assert (ess > 30).all(), ess
    sd = values.reshape(-1, values.shape[-1]).std(0, ddof=1)
    return values.mean((0, 1)), sd / np.sqrt(ess)


@pytest.mark.slow
def test_predictions_match_botorchs_own_fit_in_distribution():
    """Both fits with 512 warmup iterations and 512 draws kept every 4th (128 GPs each;
    BoTorch's default keeps 16, too few to compare): the per-GP predictive means,
    variances and squared means at 5 test points agree within their Monte Carlo errors
    (MCSE from each fit's own ESS; Bonferroni bound over the 15 checks at level 1e-3)."""
    import pyro
    from botorch.fit import fit_fully_bayesian_model_nuts

    _, _, test_X = small_problem()
    ours = saas_gp()
    hmc.botorch.fit_fully_bayesian_model_hmc(ours, num_samples=512, thinning=4, seed=0)
    theirs = saas_gp()
    pyro.set_rng_seed(0)
    fit_fully_bayesian_model_nuts(theirs, num_samples=512, thinning=4, disable_progbar=True)
    (ours_mean, ours_mcse), (theirs_mean, theirs_mcse) = (
        estimate_and_mcse(per_draw_predictions(gp, test_X)) for gp in (ours, theirs)
    )
    z = (ours_mean - theirs_mean) / np.hypot(ours_mcse, theirs_mcse)
    assert (np.abs(z) < z_bound(z.size)).all(), z
