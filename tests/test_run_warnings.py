"""The warnings at the end of a run (divergences, maximum tree depth, a metric spanning
many orders of magnitude, coordinates that have not settled), and a quiet healthy run."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import hmc
from hmc.run_warnings import warn_about_run

HEALTHY = {
    "diverging": np.zeros((2, 50), dtype=bool),
    "reached_max_treedepth": np.zeros((2, 50), dtype=bool),
    "tree_depth": np.full((2, 50), 3),
}


def caught(stats, inverse, draws=None) -> list[str]:
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        warn_about_run(stats, inverse, draws=draws)
    assert all(r.category is RuntimeWarning for r in records)
    return [str(r.message) for r in records]


def test_healthy_run_is_quiet():
    assert caught(HEALTHY, np.ones((2, 3))) == []
    assert caught(HEALTHY, np.eye(3)[None].repeat(2, 0) * 1e7) == []


def test_divergences_are_counted():
    stats = dict(HEALTHY, diverging=HEALTHY["diverging"].copy())
    stats["diverging"][1, :5] = True
    (message,) = caught(stats, np.ones((2, 3)))
    assert message.startswith("5 of 100 kept transitions (5.0%) were divergent")


def test_maximum_tree_depth_is_counted_and_named():
    stats = dict(HEALTHY, reached_max_treedepth=HEALTHY["reached_max_treedepth"].copy())
    stats["tree_depth"] = HEALTHY["tree_depth"].copy()
    stats["reached_max_treedepth"][0, :20] = True
    stats["tree_depth"][0, :20] = 7
    (message,) = caught(stats, np.ones((2, 3)))
    assert message.startswith(
        "20 of 100 kept transitions (20.0%) stopped at the maximum tree depth 7"
    )


@pytest.mark.parametrize("dense", [False, True])
def test_a_metric_spanning_many_orders_names_its_chains(dense):
    variances = np.array([[1.0, 1.0, 1.0], [1e-5, 1.0, 1e4]])
    inverse = np.stack([np.diag(v) for v in variances]) if dense else variances
    (message,) = caught(HEALTHY, inverse)
    assert message.startswith("the adapted metric of chains [1] spans 1.0e+09")


def test_coordinates_that_have_not_settled_are_named():
    """Independent draws settle; a random walk (a flat direction's drift) and a chain
    stuck elsewhere do not; under 100 draws per chain nothing is judged."""
    rng = np.random.default_rng(0)
    draws = rng.normal(size=(4, 200, 5))
    assert caught(HEALTHY, np.ones((2, 3)), draws) == []
    draws[:, :, 1] += np.cumsum(rng.normal(size=(4, 200)), axis=1)
    draws[2, :, 3] += 5.0
    (message,) = caught(HEALTHY, np.ones((2, 3)), draws)
    assert message.startswith("2 of 5 coordinates (of the unconstrained position: 1, 3) have")
    assert caught(HEALTHY, np.ones((2, 3)), draws[:, :99]) == []


def test_sample_warns_about_a_direction_the_posterior_does_not_constrain():
    with pytest.warns(
        RuntimeWarning, match=r"1 of 2 coordinates \(of the unconstrained position: 1\)"
    ):
        hmc.sample(
            lambda q: -0.5 * q[..., 0] ** 2, dim=2, chains=4, warmup=150, draws=150,
            batched=True, seed=1, progress=False, kernel=hmc.NUTS(max_tree_depth=5),
        )  # fmt: skip


def test_unsettled_coordinates_are_named_by_the_names_given():
    rng = np.random.default_rng(0)
    draws = rng.normal(size=(4, 200, 3))
    draws[:, :, 1] += np.cumsum(rng.normal(size=(4, 200)), axis=1)
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        warn_about_run(HEALTHY, np.ones((2, 3)), draws=draws, names=["sigma", "W[0]", "W[1]"])
    (message,) = [str(r.message) for r in records]
    assert message.startswith("1 of 3 coordinates (of the unconstrained position: W[0]) have")


def test_a_models_coordinates_are_named_by_parameter_and_index():
    """Scalars by name, tensor entries by name and index, and a simplex (whose
    unconstrained shape is not its own) under its unconstrained name."""
    from torch.distributions import constraints

    model = hmc.Model(
        lambda p: -(p["W"] ** 2).sum() - p["sigma"] - (p["w"] ** 2).sum(),
        {
            "sigma": hmc.Param((), constraints.positive),
            "W": hmc.Param((2, 2)),
            "w": hmc.Param(3, constraints.simplex),
        },
    )
    assert model.coordinate_names() == [
        "sigma", "W[0, 0]", "W[0, 1]", "W[1, 0]", "W[1, 1]", "w_unconstrained[0]",
        "w_unconstrained[1]",
    ]  # fmt: skip
    assert len(model.coordinate_names()) == model.dim


def test_sample_names_the_model_parameter_that_has_not_settled():
    """A Model whose log density leaves W[1] flat: the warning names it, not index 2."""
    model = hmc.Model(
        lambda p: -0.5 * p["mu"] ** 2 - 0.5 * (p["W"][0] ** 2 + p["W"][2] ** 2),
        {"mu": hmc.Param(), "W": hmc.Param(3)},
    )
    with pytest.warns(
        RuntimeWarning, match=r"1 of 4 coordinates \(of the unconstrained position: W\[1\]\)"
    ):
        hmc.sample(
            model, chains=4, warmup=150, draws=150, seed=1, progress=False,
            kernel=hmc.NUTS(max_tree_depth=5),
        )  # fmt: skip


def test_sample_warns_at_the_end_of_a_run_at_maximum_depth():
    with pytest.warns(RuntimeWarning, match="stopped at the maximum tree depth 2"):
        hmc.sample(
            lambda q: -0.5 * (q**2).sum(),
            dim=2,
            chains=2,
            warmup=100,
            draws=100,
            kernel=hmc.NUTS(max_tree_depth=2),
            seed=1,
            progress=False,
        )


def test_progress_bar_is_closed_when_the_run_fails(monkeypatch):
    """An error before sampling (here: no finite starting point) still closes the bar, so
    the traceback is not glued to it."""

    class Bar:
        closed = False

        def __init__(self, *args):
            pass

        def close(self):
            Bar.closed = True

        def __getattr__(self, name):
            return lambda *args, **kwargs: None

    monkeypatch.setattr(hmc.sampler, "Progress", Bar)
    with pytest.raises(ValueError, match="finite"):
        hmc.sample(
            lambda q: q.sum() * float("-inf"), dim=2, chains=2, warmup=10, draws=10, progress=True
        )
    assert Bar.closed
