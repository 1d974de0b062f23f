"""hmc.Model: named constrained parameters, the Target protocol, errors, and sampling a
prior-only model whose moments are known (an end-to-end check of the Jacobians)."""

from __future__ import annotations

import math
import warnings

import arviz_stats
import numpy as np
import pytest
import torch
import torch.distributions as dist
from conftest import assert_moments
from torch.distributions import constraints

import hmc
from hmc.parameters import Model, Param, UndeclaredParameterError, ordered_vector

CPU = torch.device("cpu")
F64 = torch.float64
Y = torch.tensor([28.0, 8, -3, 7, -1, 1, 18, 12], dtype=F64)
S = torch.tensor([15.0, 10, 16, 11, 9, 11, 10, 18], dtype=F64)
SCHOOLS = list("ABCDEFGH")


def schools_log_prob(p):
    theta = p["mu"] + p["tau"] * p["z"]
    return (
        -0.5 * (p["z"] ** 2).sum()
        - 0.5 * (p["mu"] / 5) ** 2
        - torch.log1p((p["tau"] / 5) ** 2)
        - 0.5 * (((Y.to(theta) - theta) / S.to(theta)) ** 2).sum()
    )


def schools(**kwargs) -> Model:
    return Model(
        schools_log_prob,
        {"mu": Param(), "tau": Param(constraint=constraints.positive), "z": Param(shape=8)},
        **kwargs,
    )


def flat_schools(q: torch.Tensor) -> torch.Tensor:
    """The same density written by hand on the flat vector (mu, log tau, z)."""
    mu, log_tau, z = q[0], q[1], q[2:]
    p = {"mu": mu, "tau": log_tau.exp(), "z": z}
    return schools_log_prob(p) + log_tau


# ---------------------------------------------------------------------- layout, density
def test_layout():
    model = schools()
    assert model.dim == 10 and model.batched is False
    assert model.names == ["mu", "tau", "z"]
    assert model.shapes == {"mu": (), "tau": (), "z": (8,)}
    assert "tau" in repr(model)


def test_log_prob_adds_the_jacobian():
    model = schools()
    q = torch.randn(5, 10, dtype=F64, generator=torch.Generator().manual_seed(0))
    for row in q:
        torch.testing.assert_close(model.log_prob(row), flat_schools(row))
    torch.testing.assert_close(torch.func.vmap(model.log_prob)(q), torch.func.vmap(flat_schools)(q))


def test_float32_follows_q():
    lp = schools().log_prob(torch.zeros(10, dtype=torch.float32))
    assert lp.dtype == torch.float32


def test_log_prob_wants_one_position():
    with pytest.raises(ValueError, match=r"one position of shape \(10,\)"):
        schools().log_prob(torch.zeros(2, 10, dtype=F64))


def test_constrain_and_unconstrain_round_trip():
    model = Model(
        lambda p: -(p["w"] ** 2).sum() - (p["L"] ** 2).sum() - (p["o"] ** 2).sum(),
        {
            "w": Param(3, constraints.simplex),
            "L": Param((2, 2), constraints.lower_cholesky),
            "o": Param(3, ordered_vector),
        },
    )
    assert model.dim == 2 + 3 + 3
    q = torch.randn(4, 8, dtype=F64)
    values = model.constrain(q)
    assert {k: tuple(v.shape) for k, v in values.items()} == {
        "w": (4, 3),
        "L": (4, 2, 2),
        "o": (4, 3),
    }
    torch.testing.assert_close(model.unconstrain(values), q)
    loop = torch.stack([model.log_prob(row) for row in q])
    torch.testing.assert_close(torch.func.vmap(model.log_prob)(q), loop)


# ---------------------------------------------------------------------- priors as params
def test_distribution_params_add_their_log_prob():
    prior = dist.HalfCauchy(5.0)
    model = Model(lambda p: -0.5 * p["mu"] ** 2, {"tau": prior, "mu": Param()})
    q = torch.tensor([0.3, -1.2], dtype=F64)
    tau = q[0].exp()
    expected = dist.HalfCauchy(torch.tensor(5.0, dtype=F64)).log_prob(tau) + q[0] - 0.5 * q[1] ** 2
    lp = model.log_prob(q)
    assert lp.dtype == F64
    torch.testing.assert_close(lp, expected)


def test_distribution_param_shapes_and_supports():
    model = Model(
        None,
        {
            "w": dist.Dirichlet(torch.ones(2, 4)),
            "x": dist.MultivariateNormal(torch.zeros(3), torch.eye(3)).expand((2,)),
            "r": dist.Beta(2.0, 3.0),
        },
    )
    assert model.shapes == {"w": (2, 4), "x": (2, 3), "r": ()}
    assert model.dim == 2 * 3 + 6 + 1
    values = model.constrain(torch.randn(model.dim, dtype=F64))
    torch.testing.assert_close(values["w"].sum(-1), torch.ones(2, dtype=F64))
    assert 0 < values["r"] < 1


def test_priors_built_from_an_inverse_transform_are_recast():
    """``t.inv`` keeps the transform it inverts where a transform caches its inverse; the
    float64 copy of the prior must keep it too."""
    prior = dist.TransformedDistribution(dist.Beta(2.0, 3.0), [dist.SigmoidTransform().inv])
    model = Model(None, {"x": prior})
    q = torch.tensor([0.3], dtype=F64)
    lp = model.log_prob(q)
    assert lp.dtype == F64
    beta = dist.Beta(torch.tensor(2.0, dtype=F64), torch.tensor(3.0, dtype=F64))
    expected = dist.TransformedDistribution(beta, [dist.SigmoidTransform().inv]).log_prob(q[0])
    torch.testing.assert_close(lp, expected)


def test_parameter_dependent_supports_follow_the_distribution():
    model = Model(None, {"u": dist.Uniform(torch.tensor([0.0, 2.0]), torch.tensor([1.0, 5.0]))})
    u = model.constrain(10 * torch.randn(100, 2, dtype=F64))["u"]
    assert u.dtype == F64
    assert ((u[:, 0] > 0) & (u[:, 0] < 1) & (u[:, 1] > 2) & (u[:, 1] < 5)).all()


@pytest.mark.slow
def test_prior_only_model_samples_the_prior():
    """Sampling priors on five different supports through their bijections gives the
    priors' known means and variances: the Jacobians are right end to end."""
    alpha = torch.tensor([2.0, 3.0, 4.0])
    model = Model(
        None,
        {
            "g": dist.Gamma(3.0, 2.0),
            "b": dist.Beta(2.0, 5.0),
            "w": dist.Dirichlet(alpha),
            "n": dist.Normal(1.0, 2.0),
            "ln": dist.LogNormal(0.0, 0.5),
        },
    )
    dt = hmc.sample(model, chains=4, warmup=300, draws=500, seed=7, progress=False)
    post = dt["posterior"]
    draws = np.concatenate(
        [post[k].values.reshape(4, 500, -1) for k in ("g", "b", "w", "n", "ln")], axis=-1
    )
    a0 = float(alpha.sum())
    w_mean = (alpha / a0).numpy()
    w_var = (alpha * (a0 - alpha) / (a0**2 * (a0 + 1))).numpy()
    mean = [1.5, 2 / 7, *w_mean, 1.0, math.exp(0.125)]
    var = [0.75, 10 / (49 * 8), *w_var, 4.0, (math.exp(0.25) - 1) * math.exp(0.25)]
    assert_moments(draws, mean, var, correlations=False)


# ---------------------------------------------------------------------- output
def test_posterior_dims_coords_and_groups():
    model = schools(
        derived=lambda p: {"theta": p["mu"] + p["tau"] * p["z"]},
        log_likelihood=lambda p: {
            "y": dist.Normal(p["mu"] + p["tau"] * p["z"], S.to(p["mu"])).log_prob(Y.to(p["mu"]))
        },
        observed_data={"y": Y.numpy()},
        dims={"z": ["school"], "theta": ["school"], "y": ["school"]},
        coords={"school": SCHOOLS},
        unconstrained=True,
    )
    dt = hmc.sample(model, chains=2, warmup=100, draws=50, seed=1, progress=False)
    post = dt["posterior"]
    assert set(post.data_vars) == {"mu", "tau", "z", "theta"}
    assert post["z"].dims == ("chain", "draw", "school")
    assert post["theta"].dims == ("chain", "draw", "school")
    assert list(post["school"].values) == SCHOOLS
    assert (post["tau"].values > 0).all()
    theta = post["mu"].values[..., None] + post["tau"].values[..., None] * post["z"].values
    np.testing.assert_allclose(post["theta"].values, theta)
    assert dt["observed_data"]["y"].dims == ("school",)
    assert dt["log_likelihood"]["y"].shape == (2, 50, 8)
    with warnings.catch_warnings():  # 100 draws: Pareto k warnings expected
        warnings.simplefilter("ignore")
        assert math.isfinite(float(arviz_stats.loo(dt).elpd))
    unconstrained = dt["unconstrained_posterior"]
    np.testing.assert_allclose(unconstrained["tau_unconstrained"].values, np.log(post["tau"]))
    assert unconstrained["z_unconstrained"].dims == ("chain", "draw", "school")


def test_unconstrained_shapes_differ_for_a_simplex():
    model = Model(
        lambda p: torch.log(p["w"]).sum(), {"w": Param(3, constraints.simplex)}, unconstrained=True
    )
    draws = np.random.default_rng(0).normal(size=(2, 5, 2))
    assert model.posterior(draws)["w"].shape == (2, 5, 3)
    assert model.extra_groups(draws)["unconstrained_posterior"]["w_unconstrained"].shape == (
        2,
        5,
        2,
    )


def test_derived_name_must_be_new():
    model = schools(derived=lambda p: {"mu": p["mu"]})
    with pytest.raises(ValueError, match="'mu'"):
        model.posterior(np.zeros((1, 2, 10)))


# ---------------------------------------------------------------------- init
def test_init_dict_maps_to_the_unconstrained_scale():
    q = schools().initial_positions({"tau": 2.0, "z": torch.ones(8)}, 3, F64, CPU)
    assert q.shape == (3, 10)
    torch.testing.assert_close(q[:, 0], torch.zeros(3, dtype=F64))  # mu left out: 0
    torch.testing.assert_close(q[:, 1], torch.full((3,), math.log(2.0), dtype=F64))
    per_chain = schools().initial_positions({"mu": [1.0, 2.0, 3.0]}, 3, F64, CPU)
    torch.testing.assert_close(per_chain[:, 0], torch.tensor([1.0, 2.0, 3.0], dtype=F64))
    assert schools().initial_positions(None, 3, F64, CPU) is None


def test_sample_starts_from_init():
    dt = hmc.sample(
        schools(), init={"mu": 1.0, "tau": 2.0}, chains=2, warmup=0, draws=3, step_size=1e-8,
        kernel=hmc.HMC(num_steps=1), seed=0, progress=False,
    )  # fmt: skip
    np.testing.assert_allclose(dt["posterior"]["tau"].values, 2.0, rtol=1e-6)


@pytest.mark.parametrize(
    ("init", "message"),
    [
        ({"z": torch.zeros(7)}, r"'z' has shape \(7,\)"),
        ({"tau": -1.0}, "'tau' is outside its support"),
        ({"tau": 0.0}, "'tau' is outside its support"),
        ({"mu": float("nan")}, "'mu' is outside its support"),
        ({"sigma": 1.0}, r"unknown parameter\(s\) \['sigma'\]"),
    ],
)
def test_init_errors_name_the_parameter(init, message):
    with pytest.raises(ValueError, match=message):
        schools().initial_positions(init, 2, F64, CPU)


def test_init_on_the_boundary_and_wrong_type():
    model = Model(lambda p: torch.log(p["r"]), {"r": Param(constraint=constraints.unit_interval)})
    with pytest.raises(ValueError, match="'r' is outside its support"):
        model.initial_positions({"r": 1.5}, 1, F64, CPU)
    with pytest.raises(TypeError, match="dict"):
        model.initial_positions(torch.zeros(1), 1, F64, CPU)


# ---------------------------------------------------------------------- naming errors
def test_undeclared_parameter_read_is_a_key_error_at_construction():
    with pytest.raises(KeyError, match="'sigma', which is not declared"):
        Model(lambda p: p["mu"] + p["sigma"], {"mu": Param()})
    assert issubclass(UndeclaredParameterError, KeyError)


def test_unread_parameter_is_an_error_at_construction():
    with pytest.raises(ValueError, match=r"never reads parameter\(s\) \['extra'\]"):
        Model(lambda p: -(p["mu"] ** 2), {"mu": Param(), "extra": Param()})


def test_distribution_params_need_not_be_read():
    Model(lambda p: -(p["mu"] ** 2), {"mu": Param(), "tau": dist.HalfNormal(1.0)})


def test_reading_by_iteration_counts_as_reading():
    Model(lambda p: sum(-(v**2).sum() for v in p.values()), {"a": Param(), "b": Param(2)})


def test_names_are_checked_at_first_evaluation_when_the_dry_run_fails():
    def log_prob(p):
        if torch.is_grad_enabled():  # the dry run runs without gradients
            return p["mu"] + p["oops"]
        raise RuntimeError("needs gradients")

    model = Model(log_prob, {"mu": Param()})
    with pytest.raises(KeyError, match="'oops'"):
        model.log_prob(torch.zeros(1, dtype=F64))
    with pytest.raises(KeyError, match="'oops'"):
        hmc.sample(model, chains=1, warmup=1, draws=1, seed=0, progress=False)


@pytest.mark.parametrize(
    ("params", "error", "message"),
    [
        ({"k": Param(constraint=constraints.nonnegative_integer)}, ValueError, "'k'.*discrete"),
        ({"s": Param((2, 2), constraints.symmetric)}, ValueError, "'s'.*biject_to cannot"),
        ({"w": Param((), constraints.simplex)}, ValueError, "'w'.*at least 1 dimension"),
        ({"x": "real"}, TypeError, "'x' must be an hmc.Param"),
        ({}, ValueError, "non-empty"),
    ],
)
def test_construction_errors(params, error, message):
    with pytest.raises(error, match=message):
        Model(lambda p: sum(v.sum() for v in p.values()), params)


def test_param_shape_is_checked():
    assert Param(shape=3).shape == (3,)
    with pytest.raises(ValueError, match="non-negative"):
        Param(shape=(-1,))
    with pytest.raises(TypeError, match="tuple of integers"):
        Param(shape="a")


def test_log_prob_must_return_a_scalar_tensor():
    model = Model(lambda p: p["x"], {"x": Param(2)})
    with pytest.raises(ValueError, match="0-d"):
        model.log_prob(torch.zeros(2, dtype=F64))


def test_dim_and_batched_that_disagree_with_a_model_are_named():
    model = hmc.Model(lambda p: -(p["x"] ** 2).sum(), params={"x": hmc.Param(shape=2)})
    options = dict(chains=2, warmup=10, draws=10, progress=False)
    with pytest.raises(ValueError, match="dim=5 disagrees with the model's 2"):
        hmc.sample(model, dim=5, **options)
    with pytest.raises(ValueError, match="batched=True is for plain functions"):
        hmc.sample(model, batched=True, **options)
    assert hmc.sample(model, dim=2, **options)["posterior"]["x"].shape == (2, 10, 2)


def test_a_dependent_constraint_is_named():
    from torch.distributions import constraints

    with pytest.raises(ValueError, match=r"parameter 'x'.*has no fixed support"):
        hmc.Model(
            lambda p: -(p["x"] ** 2).sum(),
            params={"x": hmc.Param(constraint=constraints.dependent)},
        )
