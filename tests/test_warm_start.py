"""Warm starts: ``hmc.sample(..., adapted_from=previous)`` takes a previous run's step
sizes and inverse metrics, and with ``warmup=0`` samples correctly from the first draw."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hmc

SCALES = torch.tensor([0.1, 1.0, 10.0], dtype=torch.float64)


def log_prob(q):
    return -0.5 * ((q / SCALES) ** 2).sum(-1)


def run(log_prob=log_prob, **kwargs):
    options = dict(dim=3, chains=4, seed=3, batched=True, progress=False, compile=False)
    return hmc.sample(log_prob, **{**options, **kwargs})


@pytest.fixture(scope="module")
def previous():
    return run(warmup=400, draws=10)


def test_no_warmup_reuses_each_chains_step_size_and_metric(previous):
    dt = run(warmup=0, draws=1000, adapted_from=previous, seed=4)
    adapted = previous["adaptation"]
    step = dt["sample_stats"]["step_size"].values
    np.testing.assert_array_equal(step, np.repeat(adapted["step_size"].values[:, None], 1000, 1))
    np.testing.assert_array_equal(
        dt["adaptation"]["inverse_metric"].values, adapted["inverse_metric"].values
    )
    # correct from the first draw: the variances within 5 standard errors (4000 draws of
    # NUTS on a Gaussian, ESS well above 1000 per coordinate)
    x = dt["posterior"]["x"].values.reshape(-1, 3)
    variance = x.var(0) / SCALES.numpy() ** 2
    assert np.all(np.abs(variance - 1) < 5 * np.sqrt(2 / 1000)), variance
    assert np.all(np.abs(x.mean(0) / SCALES.numpy()) < 5 / np.sqrt(1000))


def test_another_number_of_chains_takes_the_median_step_and_the_mean_metric(previous):
    dt = run(chains=2, warmup=0, draws=5, adapted_from=previous)
    adapted = previous["adaptation"]
    np.testing.assert_allclose(
        dt["sample_stats"]["step_size"].values, np.median(adapted["step_size"].values)
    )
    mean = adapted["inverse_metric"].values.mean(0)
    np.testing.assert_allclose(dt["adaptation"]["inverse_metric"].values, [mean, mean])


def test_a_dense_run_from_a_diagonal_one_starts_at_that_diagonal(previous):
    dt = run(warmup=0, draws=5, metric="dense", adapted_from=previous)
    dense = dt["adaptation"]["inverse_metric"].values
    diagonal = previous["adaptation"]["inverse_metric"].values
    np.testing.assert_allclose(dense, np.stack([np.diag(row) for row in diagonal]))


def test_with_warmup_adaptation_starts_from_the_previous_metric(previous):
    dt = run(warmup=15, draws=5, adapted_from=previous)  # under 20: no metric update
    assert dt["sample_stats"]["step_size"].values.min() > 0
    np.testing.assert_allclose(
        dt["adaptation"]["inverse_metric"].values, previous["adaptation"]["inverse_metric"].values
    )


def test_a_checkpoint_written_after_warmup_gives_the_same_start(tmp_path):
    """The step sizes and metrics a checkpoint holds once warmup has ended are those of
    the run's DataTree; one written during warmup is refused, naming it."""
    path = tmp_path / "run.ckpt"
    finished = run(warmup=100, draws=40, checkpoint=path, checkpoint_every=20)
    from_file = run(warmup=0, draws=5, adapted_from=path, seed=4)
    from_tree = run(warmup=0, draws=5, adapted_from=finished, seed=4)
    for group in ("adaptation", "posterior"):
        for name in from_tree[group].data_vars:
            np.testing.assert_array_equal(
                from_file[group][name].values, from_tree[group][name].values
            )
    early = tmp_path / "early.ckpt"
    with pytest.warns(RuntimeWarning):  # the interrupted run says how to go on

        def stop_after_first_checkpoint(q):
            if early.exists():
                raise KeyboardInterrupt
            return log_prob(q)

        with pytest.raises(KeyboardInterrupt):
            run(warmup=100, draws=40, checkpoint=early, checkpoint_every=20,
                log_prob=stop_after_first_checkpoint)  # fmt: skip
    with pytest.raises(ValueError, match=r"early.ckpt' was written during warmup \(iteration 20"):
        run(warmup=0, draws=5, adapted_from=early)


@pytest.mark.parametrize(
    ("adapted_from", "error", "match"),
    [
        ({"posterior": None}, TypeError, "adapted_from must be the DataTree"),
        (3.0, TypeError, "adapted_from must be the DataTree"),
    ],
)
def test_what_is_not_a_run_is_named(adapted_from, error, match):
    with pytest.raises(error, match=match):
        run(warmup=0, draws=5, adapted_from=adapted_from)


def test_another_dimension_is_named(previous):
    with pytest.raises(ValueError, match="adapted_from was adapted in dimension 3"):
        hmc.sample(lambda q: -0.5 * (q**2).sum(), dim=2, warmup=0, draws=5, adapted_from=previous)


def test_the_adaptation_group_names_its_dimensions(previous):
    inverse = previous["adaptation"]["inverse_metric"]
    assert inverse.dims == ("chain", "unconstrained")
    assert list(inverse["unconstrained"].values) == [0, 1, 2]
