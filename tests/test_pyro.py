"""Pyro models through ``hmc.from_pyro``: the log density against Pyro's own HMC potential,
the traced graph against its Pyro oracle, the DataTree's sites, refusals, and posteriors
against exact truth (a quadrature) and posteriordb's reference draws.

Skipped when Pyro is not installed (``pip install "hmc[pyro]"``); the import checks run
without it.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from conftest import assert_moments, z_bound

import hmc

F64 = torch.float64
EIGHT_Y = [28.0, 8, -3, 7, -1, 1, 18, 12]
EIGHT_SIGMA = [15.0, 10, 16, 11, 9, 11, 10, 18]


# ---------------------------------------------------------------------- without Pyro
def test_import_hmc_does_not_import_pyro():
    code = "import sys, hmc; hmc.from_pyro; print('pyro' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_from_pyro_without_pyro_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyro", None)  # what `import pyro` meets when absent
    with pytest.raises(ImportError, match=r'pip install "hmc\[pyro\]"'):
        hmc.from_pyro(lambda: None)


# ---------------------------------------------------------------------- models
pyro = pytest.importorskip("pyro")
dist = pytest.importorskip("pyro.distributions")
from pyro.infer.mcmc.util import initialize_model  # noqa: E402


def eight_schools(y, sigma):
    mu = pyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = pyro.sample("tau", dist.HalfCauchy(5.0))
    with pyro.plate("school", len(y)):
        z = pyro.sample("z", dist.Normal(0.0, 1.0))
        theta = pyro.deterministic("theta", mu + tau * z)
        pyro.sample("y", dist.Normal(theta, sigma), obs=y)


def logistic_regression(x, y):
    alpha = pyro.sample("alpha", dist.Normal(0.0, 2.5))
    beta = pyro.sample("beta", dist.Normal(0.0, 2.5))
    with pyro.plate("obs", len(y)):
        pyro.sample("y", dist.Bernoulli(logits=alpha + beta * x), obs=y)


def constrained(choices):
    """Every kind of support: positive (a scalar and a vector in a plate), unit interval,
    simplex (with categorical data on it), an interval with tensor bounds, a factor."""
    pyro.sample("scale", dist.HalfCauchy(1.0))
    with pyro.plate("group", 3):
        rate = pyro.sample("rate", dist.LogNormal(0.0, 1.0))
    p = pyro.sample("p", dist.Beta(2.0, 5.0))
    w = pyro.sample("w", dist.Dirichlet(torch.tensor([2.0, 3.0, 4.0], dtype=F64)))
    u = pyro.sample("u", dist.Uniform(torch.tensor(-1.0, dtype=F64), 3.0))
    with pyro.plate("choice", len(choices)):
        pyro.sample("choices", dist.Categorical(probs=w), obs=choices)
    pyro.factor("shrink", -0.5 * (rate.log() ** 2).sum() - p * u)


def scaled_and_masked(y):
    """Sites under ``poutine.scale`` and ``poutine.mask`` (half the observations out)."""
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.poutine.scale(scale=3.0):
        sigma = pyro.sample("sigma", dist.LogNormal(0.0, 1.0))
    keep = torch.arange(len(y)) % 2 == 0
    with pyro.plate("obs", len(y)), pyro.poutine.mask(mask=keep):
        pyro.sample("y", dist.Normal(mu, sigma), obs=y)


def eight_schools_data():
    return torch.tensor(EIGHT_Y, dtype=F64), torch.tensor(EIGHT_SIGMA, dtype=F64)


def logistic_data():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, generator=g, dtype=F64)
    y = torch.bernoulli(torch.sigmoid(0.5 - 1.0 * x), generator=g)
    return x, y


COUNTS = [3, 5, 9]  # how often each of the three categories was chosen
CHOICES = torch.repeat_interleave(torch.arange(3), torch.tensor(COUNTS))


@pytest.fixture
def float64_default():
    """Pyro's own potential computed with float64 constants, as the adapter's graph is."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(F64)
    yield
    torch.set_default_dtype(before)


def pyro_flat(model: hmc.Model, q: torch.Tensor) -> dict[str, torch.Tensor]:
    """The unconstrained position ``q`` ``(D,)`` as Pyro's dict of unconstrained sites."""
    out, start = {}, 0
    for name, t in model.transforms.items():
        out[name] = q[start : start + t.size].reshape(t.unconstrained_shape)
        start += t.size
    return out


# ---------------------------------------------------------------------- the density
CASES = {
    "eight_schools": (eight_schools, eight_schools_data),
    "logistic_regression": (logistic_regression, logistic_data),
    "constrained": (constrained, lambda: (CHOICES,)),
    "scaled_and_masked": (scaled_and_masked, lambda: (torch.linspace(-1, 2, 6, dtype=F64),)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_log_prob_is_pyros_potential(case, float64_default):
    """``log_prob`` at random unconstrained points equals minus the potential of Pyro's
    own HMC (its trace's log density plus the log-Jacobians of ``biject_to``) to 1e-10,
    and so does its gradient."""
    fn, data = CASES[case]
    args = data()
    model = hmc.from_pyro(fn, *args)
    _, potential_fn, _, _ = initialize_model(fn, model_args=args)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        q = (2 * torch.rand(model.dim, generator=g, dtype=F64) - 1).requires_grad_(True)
        ours = model.log_prob(q)
        (ours_grad,) = torch.autograd.grad(ours, q)
        theirs = -potential_fn(pyro_flat(model, q))
        (theirs_grad,) = torch.autograd.grad(theirs, q)
        torch.testing.assert_close(ours, theirs, atol=1e-10, rtol=0)
        torch.testing.assert_close(ours_grad, theirs_grad, atol=1e-10, rtol=0)


def test_the_models_number_constants_follow_the_sampling_dtype():
    """``dist.HalfCauchy(5.0)`` makes a float32 scale under torch's default dtype (and casts
    the value to it); the adapter's float64 density is the float64 one to 1e-10: the
    eight schools written out by hand, constants included."""
    assert torch.get_default_dtype() == torch.float32
    y, sigma = eight_schools_data()
    model = hmc.from_pyro(eight_schools, y, sigma)
    half_log_2pi = 0.5 * np.log(2 * np.pi)
    g = torch.Generator().manual_seed(4)
    for _ in range(5):
        q = 2 * torch.rand(10, generator=g, dtype=F64) - 1
        mu, log_tau, z = q[0], q[1], q[2:]
        tau = log_tau.exp()
        theta = mu + tau * z
        by_hand = (
            -0.5 * (mu / 5) ** 2 - np.log(5) - half_log_2pi
            + np.log(2 / (np.pi * 5)) - torch.log1p((tau / 5) ** 2) + log_tau
            - 0.5 * (z**2).sum() - 8 * half_log_2pi
            - 0.5 * (((y - theta) / sigma) ** 2).sum() - sigma.log().sum() - 8 * half_log_2pi
        )  # fmt: skip
        torch.testing.assert_close(model.log_prob(q), by_hand, atol=1e-10, rtol=0)


def test_a_model_mixing_float64_data_and_number_priors_traces_in_the_datas_dtype():
    """``x @ beta`` with float64 ``x`` and ``beta ~ Normal(0.0, 1.0)``: under a float32
    default the trace would meet a float32 ``beta``; it runs in the data's dtype."""
    assert torch.get_default_dtype() == torch.float32
    x = torch.randn(6, 3, dtype=F64)

    def regression(x):
        with pyro.plate("predictor", 3):
            beta = pyro.sample("beta", dist.Normal(0.0, 1.0))
        pyro.sample("y", dist.Normal(x @ beta, 1.0), obs=torch.zeros(6, dtype=F64))

    model = hmc.from_pyro(regression, x)
    q = torch.tensor([0.1, -0.2, 0.3], dtype=F64)
    normal = torch.distributions.Normal(0.0, 1.0)
    expected = normal.log_prob(q).sum() + normal.log_prob(-(x @ q)).sum()
    torch.testing.assert_close(model.log_prob(q), expected, atol=1e-12, rtol=0)


def test_the_docstring_example_runs():
    import doctest

    import hmc.pyro

    results = doctest.testmod(hmc.pyro)
    assert results.attempted > 0 and results.failed == 0


def test_traced_graph_matches_pyros_handlers_in_float32():
    """The graph traced per dtype against the handler it was traced from (the oracle),
    in float32 (a second graph) and float64."""
    model = hmc.from_pyro(constrained, CHOICES)
    log_joint = model._fn
    g = torch.Generator().manual_seed(2)
    for dtype, tol in ((F64, 1e-12), (torch.float32, 1e-5)):
        values = model.constrain(torch.randn(6, model.dim, generator=g, dtype=F64).to(dtype))
        for i in range(6):
            row = {k: v[i] for k, v in values.items()}
            torch.testing.assert_close(log_joint(row), log_joint.eager(row), atol=tol, rtol=tol)
    assert set(log_joint.graphs) == {
        (F64, torch.device("cpu")),
        (torch.float32, torch.device("cpu")),
    }
    assert all(graph is not None for graph in log_joint.graphs.values())


def test_a_model_whose_python_differs_from_its_trace_is_evaluated_through_pyro():
    """A model whose Python does something its tensors do not show (here a call counter)
    cannot be one graph: the check at a second point sees it, warns, and the handler is
    evaluated at every gradient (so the density stays right)."""
    calls = {"n": 0}

    def stateful():
        calls["n"] += 1
        x = pyro.sample("x", dist.Normal(0.0, 1.0))
        pyro.factor("odd", (calls["n"] % 2) * x)

    with pytest.warns(RuntimeWarning, match="the traced graph gives"):
        model = hmc.from_pyro(stateful)  # traced for float64 at once, by its first evaluation
    q = torch.tensor([0.4], dtype=F64)
    assert model._fn.graphs[(F64, torch.device("cpu"))] is None
    first, second = model.log_prob(q), model.log_prob(q)
    normal = float(torch.distributions.Normal(0.0, 1.0).log_prob(torch.tensor(0.4, dtype=F64)))
    assert {round(float(first), 12), round(float(second), 12)} == {
        round(normal, 12),
        round(normal + 0.4, 12),
    }


# ---------------------------------------------------------------------- sites
def test_sites_land_in_the_datatree_with_their_names_shapes_and_plates():
    y, sigma = eight_schools_data()
    model = hmc.from_pyro(eight_schools, y, sigma)
    assert model.names == ["mu", "tau", "z"]
    assert model.shapes == {"mu": (), "tau": (), "z": (8,)}
    dt = hmc.sample(model, chains=2, warmup=100, draws=50, seed=5, progress=False, compile=False)
    post = dt["posterior"]
    assert set(post.data_vars) == {"mu", "tau", "z", "theta"}
    assert post["z"].dims == ("chain", "draw", "school")
    assert post["theta"].dims == ("chain", "draw", "school")
    mu, tau, z, theta = (post[k].values for k in ("mu", "tau", "z", "theta"))
    np.testing.assert_allclose(theta, mu[..., None] + tau[..., None] * z, rtol=1e-12)
    assert (tau > 0).all()
    np.testing.assert_array_equal(dt["observed_data"]["y"].values, EIGHT_Y)
    loglik = dt["log_likelihood"]["y"]
    assert loglik.dims == ("chain", "draw", "school")
    expected = torch.distributions.Normal(torch.as_tensor(theta), sigma).log_prob(y)
    np.testing.assert_allclose(loglik.values, expected.numpy(), rtol=1e-12)


@pytest.mark.slow  # 16 s
def test_constrained_sites_stay_in_their_supports_with_the_right_moments():
    """A model with a positive vector, a unit interval, a simplex (observed through a
    categorical) and an interval site. ``w``'s posterior is Dirichlet(2 + 3, 3 + 5, 4 + 9):
    its mean, variances and correlation are checked against it; all draws inside their
    supports."""
    model = hmc.from_pyro(constrained, CHOICES)
    assert model.shapes == {"scale": (), "rate": (3,), "p": (), "w": (3,), "u": ()}
    dt = hmc.sample(model, chains=4, warmup=200, draws=300, seed=7, progress=False, compile=False)
    post = dt["posterior"]
    assert post["rate"].dims == ("chain", "draw", "group")
    assert (post["scale"].values > 0).all() and (post["rate"].values > 0).all()
    assert ((post["p"].values > 0) & (post["p"].values < 1)).all()
    assert ((post["u"].values > -1) & (post["u"].values < 3)).all()
    w = post["w"].values
    assert (w > 0).all()
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-12)
    a = np.array([5.0, 8.0, 13.0])
    a0 = a.sum()
    mean = a / a0
    cov = (np.diag(mean) - np.outer(mean, mean)) / (a0 + 1)
    assert_moments(w[..., :2], mean[:2], cov[:2, :2])


# ---------------------------------------------------------------------- refusals
def test_a_discrete_latent_site_is_refused_by_name():
    def mixture():
        k = pyro.sample("k", dist.Bernoulli(0.3))
        pyro.sample("x", dist.Normal(3.0 * k, 1.0), obs=torch.tensor(1.0))

    with pytest.raises(ValueError, match=r"latent site 'k' is discrete"):
        hmc.from_pyro(mixture)


def test_refusals_name_what_is_wrong():
    with pytest.raises(TypeError, match="model must be a callable"):
        hmc.from_pyro("eight_schools")

    def observed_only():
        pyro.sample("y", dist.Normal(0.0, 1.0), obs=torch.tensor(0.5))

    with pytest.raises(ValueError, match="no latent sample sites"):
        hmc.from_pyro(observed_only)

    def subsampled(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(y), subsample_size=2) as index:
            pyro.sample("y", dist.Normal(mu, 1.0), obs=y[index])

    with pytest.raises(ValueError, match="plate 'data' subsamples 2 of 5"):
        hmc.from_pyro(subsampled, torch.zeros(5))


def test_tracing_leaves_the_global_random_state_alone():
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    hmc.from_pyro(eight_schools, *eight_schools_data())
    torch.testing.assert_close(torch.rand(3), expected)


# ---------------------------------------------------------------------- posteriors
def logistic_truth(x: torch.Tensor, y: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and covariance of (alpha, beta) by quadrature on a fine grid."""
    grid = np.linspace(-4.0, 4.0, 801)
    a, b = np.meshgrid(grid, grid, indexing="ij")
    eta = a[..., None] + b[..., None] * x.numpy()
    loglik = (y.numpy() * eta - np.logaddexp(0.0, eta)).sum(-1)
    logp = loglik - 0.5 * (a**2 + b**2) / 2.5**2
    w = np.exp(logp - logp.max())
    w /= w.sum()
    points = np.stack([a, b], -1)
    mean = (w[..., None] * points).sum((0, 1))
    centred = points - mean
    cov = np.einsum("ij,ijk,ijl->kl", w, centred, centred)
    return mean, cov


def test_logistic_regression_matches_quadrature():
    x, y = logistic_data()
    mean, cov = logistic_truth(x, y)
    model = hmc.from_pyro(logistic_regression, x, y)
    dt = hmc.sample(model, chains=4, warmup=200, draws=300, seed=3, progress=False, compile=False)
    draws = np.stack([dt["posterior"][k].values for k in ("alpha", "beta")], -1)
    assert_moments(draws, mean, cov)


@pytest.mark.slow
def test_eight_schools_matches_posteriordb_compiled_whole():
    """The non-centred eight schools written in Pyro against posteriordb's reference (means
    and sds, MCSE z-scores), with ``compile=True``: the energy compiles as one graph (no
    fallback warning, ``compiled == 1``)."""
    from hmc.models.validation import compare

    name = "eight_schools-eight_schools_noncentered"
    model = hmc.from_pyro(eight_schools, *eight_schools_data())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dt = hmc.sample(
            model, chains=4, warmup=300, draws=300, seed=20, progress=False, compile=True
        )
    assert dt.attrs["compiled"] == 1
    checks = compare(name, dt)
    bound = z_bound(2 * len(checks))
    for check in checks:
        assert check.ess_bulk > 100 and check.rhat < 1.05, check
        assert abs(check.mean_z) < bound and abs(check.sd_z) < bound, check


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["chees", "hmc"])
def test_the_compiled_lockstep_path_captures_a_pyro_model_whole(kernel):
    """ChEES and static HMC compile their whole transition; with a Pyro model that is one
    graph too (a fallback would warn, and the run would record ``compiled == 0``)."""
    model = hmc.from_pyro(eight_schools, *eight_schools_data())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dt = hmc.sample(
            model, chains=16, warmup=200, draws=100, kernel=kernel, seed=2, progress=False,
            compile=True,
        )  # fmt: skip
    assert dt.attrs["compiled"] == 1
    assert np.isfinite(dt["posterior"]["theta"].values).all()
