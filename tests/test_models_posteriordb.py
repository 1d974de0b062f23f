"""The 14 built-in posteriordb models: packaged data, finite densities and gradients, vmap
against a loop, the tricky parts against plain loops written from each model.md, the
mapping to posteriordb's names, and a fast statistical comparison with the reference."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

import hmc
import hmc.models
from hmc.models.mixtures import log_chain_product
from hmc.models.time_series import linear_recurrence
from hmc.models.validation import compare, z_bound
from hmc.potential import Potential
from hmc.to_arviz import to_datatree

NAMES = hmc.models.names()
SHARED = Path(os.environ.get("HMC_POSTERIORDB", Path(__file__).parents[2] / "shared/posteriordb"))
F64 = torch.float64


def random_point(dim: int, seed: int, batch: tuple[int, ...] = ()) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return 0.5 * torch.randn(*batch, dim, generator=generator, dtype=F64)


@pytest.fixture(scope="module")
def models():
    return {name: hmc.models.load(name) for name in NAMES}


# ---------------------------------------------------------------------- the set
def test_fourteen_posteriors_with_packaged_files():
    assert len(NAMES) == 14
    for name in NAMES:
        assert hmc.models.reference(name)["posterior_name"] == name
    if SHARED.is_dir():
        assert sorted(p.name for p in SHARED.iterdir() if p.is_dir()) == NAMES


def test_unknown_name():
    with pytest.raises(KeyError, match="unknown posterior"):
        hmc.models.load("nope")


# ---------------------------------------------------------------------- densities
@pytest.mark.parametrize("name", NAMES)
def test_finite_density_and_gradient_and_vmap(models, name):
    model = models[name]
    assert model.dim == hmc.models.reference(name)["dim_unconstrained"]
    q = random_point(model.dim, 0, batch=(3,))
    U, grad = Potential(model.log_prob).value_and_grad(q)
    assert torch.isfinite(U).all() and torch.isfinite(grad).all()
    loop = torch.stack([model.log_prob(row) for row in q])
    torch.testing.assert_close(torch.func.vmap(model.log_prob)(q), loop, rtol=1e-10, atol=1e-8)
    torch.testing.assert_close(-U, loop, rtol=1e-10, atol=1e-8)
    assert model.log_prob(q[0].float()).dtype == torch.float32


@pytest.mark.parametrize("name", NAMES)
def test_reported_names_match_posteriordb(models, name):
    """The posterior maps to posteriordb's names, and the groups with the model's dims
    make a valid DataTree."""
    model = models[name]
    draws = random_point(model.dim, 1, batch=(2, 3)).numpy()
    mapped = hmc.models.reference_draws(name, model.posterior(draws))
    assert list(mapped) == hmc.models.reference(name)["parameter_names"]
    assert all(v.shape == (2, 3) for v in mapped.values())
    dims, coords = model.dims_and_coords()
    tree = to_datatree(
        model.posterior(draws),
        {"lp": np.zeros((2, 3))},
        extra_groups=model.extra_groups(draws),
        dims=dims,
        coords=coords,
    )
    assert "observed_data" in tree.children
    assert list(hmc.models.reference_draws(name, tree)) == list(mapped)


def test_linear_recurrence_is_the_loop():
    c = random_point(200, 2)
    for a in (-0.9, 0.3, 1.02):
        x = [c[0]]
        for t in range(1, 200):
            x.append(c[t] + a * x[-1])
        torch.testing.assert_close(linear_recurrence(c, torch.tensor(a, dtype=F64)), torch.stack(x))


def _lp_difference(model, plain, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(q1) - log p(q2) from the model and from a plain implementation of model.md
    on the constrained values (plus Jacobians): equal up to the dropped constants."""
    q1, q2 = random_point(model.dim, seed), random_point(model.dim, seed + 1)
    p1, p2 = model.constrain(q1), model.constrain(q2)
    return model.log_prob(q1) - model.log_prob(q2), plain(p1, q1) - plain(p2, q2)


def test_arma11_matches_the_recursion_of_model_md(models):
    y = torch.tensor(hmc.models.data("arma-arma11")["y"], dtype=F64)

    def plain(p, q):
        mu, phi, theta, sigma = p["mu"], p["phi"], p["theta"], p["sigma"]
        err = [y[0] - (mu + phi * mu)]
        for t in range(1, len(y)):
            err.append(y[t] - (mu + phi * y[t - 1] + theta * err[-1]))
        err = torch.stack(err)
        prior = -0.5 * (mu / 10) ** 2 - 0.5 * (phi / 2) ** 2 - 0.5 * (theta / 2) ** 2
        prior = prior - torch.log1p((sigma / 2.5) ** 2)
        return prior - len(y) * sigma.log() - 0.5 * ((err / sigma) ** 2).sum() + q[3]

    model_value, plain_value = _lp_difference(models["arma-arma11"], plain, 3)
    torch.testing.assert_close(model_value, plain_value)


def test_garch11_matches_model_md_with_its_dependent_bound(models):
    raw = hmc.models.data("garch-garch11")
    y = torch.tensor(raw["y"], dtype=F64)
    model = models["garch-garch11"]

    def plain(p, q):
        mu, a0, a1 = p["mu"], p["alpha0"], p["alpha1"]
        l4 = torch.sigmoid(q[3])
        b1 = (1 - a1) * l4
        s = [torch.tensor(raw["sigma1"], dtype=F64)]
        for t in range(1, len(y)):
            s.append(torch.sqrt(a0 + a1 * (y[t - 1] - mu) ** 2 + b1 * s[-1] ** 2))
        s = torch.stack(s)
        lp = -s.log().sum() - 0.5 * (((y - mu) / s) ** 2).sum()
        jacobian = q[1] + a1.log() + torch.log1p(-a1) + torch.log1p(-a1) + l4.log() + (1 - l4).log()
        return lp + jacobian

    model_value, plain_value = _lp_difference(model, plain, 5)
    torch.testing.assert_close(model_value, plain_value)
    beta1 = model.posterior(random_point(4, 6, batch=(1, 50)).numpy())
    assert ((beta1["beta1"] > 0) & (beta1["beta1"] < 1 - beta1["alpha1"])).all()


def test_hmm_forward_algorithm_matches_the_loop(models):
    y = torch.tensor(hmc.models.data("hmm_example-hmm_example")["y"], dtype=F64)

    def plain(p, q):
        mu = p["mu"]
        log_P = torch.log(torch.stack((p["theta1"], p["theta2"])))
        e = -0.5 * (y[:, None] - mu) ** 2
        a = e[0]
        for t in range(1, len(y)):
            a = torch.logsumexp(a[:, None] + log_P, 0) + e[t]
        prior = -0.5 * (mu[0] - 3) ** 2 - 0.5 * (mu[1] - 10) ** 2
        simplex_jacobian = sum(torch.log(p[k]).sum() for k in ("theta1", "theta2"))
        return prior + torch.logsumexp(a, 0) + simplex_jacobian + q[2] + q[3]

    model_value, plain_value = _lp_difference(models["hmm_example-hmm_example"], plain, 7)
    torch.testing.assert_close(model_value, plain_value)
    mats = random_point(4 * 7, 8).reshape(7, 2, 2)
    product = mats[0]
    for m in mats[1:]:
        product = torch.logsumexp(product[:, :, None] + m[None], 1)
    torch.testing.assert_close(log_chain_product(mats), product)


def test_gp_pois_regr_reports_f_as_L_f_tilde(models):
    model = models["gp_pois_regr-gp_pois_regr"]
    x = torch.arange(-10.0, 11.0, 2.0, dtype=F64)
    q = random_point(13, 9)
    p = model.constrain(q)
    cov = p["alpha"] ** 2 * torch.exp(-((x[:, None] - x) ** 2) / (2 * p["rho"] ** 2))
    L = torch.linalg.cholesky(cov + 1e-10 * torch.eye(11, dtype=F64))
    f = model.posterior(q.reshape(1, 1, 13).numpy())["f"][0, 0]
    np.testing.assert_allclose(f, (L @ p["f_tilde"]).numpy(), rtol=1e-10)


def test_gp_regr_adds_sigma_as_a_variance(models):
    raw = hmc.models.data("gp_pois_regr-gp_regr")
    x, y = torch.tensor(raw["x"], dtype=F64), torch.tensor(raw["y"], dtype=F64)

    def plain(p, q):
        cov = p["alpha"] ** 2 * torch.exp(-((x[:, None] - x) ** 2) / (2 * p["rho"] ** 2))
        mvn = torch.distributions.MultivariateNormal(
            torch.zeros(11, dtype=F64), cov + p["sigma"] * torch.eye(11, dtype=F64)
        )
        prior = (
            24 * p["rho"].log() - 4 * p["rho"] - 0.5 * (p["alpha"] / 2) ** 2 - 0.5 * p["sigma"] ** 2
        )
        return prior + mvn.log_prob(y) + q.sum()

    model_value, plain_value = _lp_difference(models["gp_pois_regr-gp_regr"], plain, 11)
    torch.testing.assert_close(model_value, plain_value)


def test_centered_eight_schools_keeps_the_log_tau_terms(models):
    raw = hmc.models.data("eight_schools-eight_schools_centered")
    y, s = torch.tensor(raw["y"], dtype=F64), torch.tensor(raw["sigma"], dtype=F64)

    def plain(p, q):
        mu, tau, theta = p["mu"], p["tau"], p["theta"]
        return (
            -torch.log1p((tau / 5) ** 2)
            - 8 * tau.log()
            - 0.5 * (((theta - mu) / tau) ** 2).sum()
            - 0.5 * (mu / 5) ** 2
            - 0.5 * (((y - theta) / s) ** 2).sum()
            + q[1]
        )

    model = models["eight_schools-eight_schools_centered"]
    model_value, plain_value = _lp_difference(model, plain, 13)
    torch.testing.assert_close(model_value, plain_value)


# ---------------------------------------------------------------------- statistics
FAST = {  # posterior: (warmup, draws) with 4 chains; between them every kind of transform
    "eight_schools-eight_schools_noncentered": (300, 300),  # positive, a derived quantity
    "gp_pois_regr-gp_regr": (300, 300),  # a Cholesky factor inside the density
    "low_dim_gauss_mix-low_dim_gauss_mix": (300, 300),  # ordered, unit interval, a mixture
    "hmm_example-hmm_example": (200, 200),  # simplexes, positive ordered
}
FAST_CHECKS = sum(2 * len(hmc.models.reference(name)["parameter_names"]) for name in FAST)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAST))
def test_fast_posteriordb_subset_matches_the_reference(name):
    """Means and sds against the reference: z-scores with the run's MCSE (from its own
    ESS) and the reference's, all |z| below a Bonferroni bound over every check of this
    test at family-wise level 1e-3; every ESS large enough for its MCSE to mean something.
    With the energy compiled, as the default run of 1,000 + 1,000 does."""
    warmup, draws = FAST[name]
    dt = hmc.sample(
        hmc.models.load(name), chains=4, warmup=warmup, draws=draws, seed=20, progress=False,
        compile=True,
    )  # fmt: skip
    assert dt.attrs["compiled"] == 1
    bound = z_bound(FAST_CHECKS, alpha=1e-3)
    failures = []
    for check in compare(name, dt):
        assert check.ess_bulk > 100 and check.ess_tail > 100, check
        assert check.rhat < 1.05, check
        for kind, z in (("mean", check.mean_z), ("sd", check.sd_z)):
            if not abs(z) < bound:
                failures.append(f"{check.name} {kind}: z = {z:.2f} ({check})")
    assert not failures, f"|z| >= {bound:.2f}:\n" + "\n".join(failures)
    assert int(dt["sample_stats"]["diverging"].sum()) == 0
