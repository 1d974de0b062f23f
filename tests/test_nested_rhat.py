"""Nested R-hat: a hand-computed value, a loop oracle, its behaviour on well-mixed and
stuck superchains, the single-chain and single-draw limits, argument errors and the
``DataTree`` wrapper."""

from __future__ import annotations

import math

import arviz
import numpy as np
import pytest
import xarray as xr

from hmc.nested_rhat import nested_rhat, nested_rhat_array


def oracle(draws: np.ndarray, superchains: int) -> float:
    """Nested R-hat of a ``(chains, draws)`` array, term by term with Python loops."""
    chains, n = draws.shape
    k_count, m_count = superchains, chains // superchains
    f = [[list(draws[k * m_count + m]) for m in range(m_count)] for k in range(k_count)]
    chain_mean = [[sum(f[k][m]) / n for m in range(m_count)] for k in range(k_count)]
    super_mean = [sum(chain_mean[k]) / m_count for k in range(k_count)]
    overall = sum(super_mean) / k_count
    b = sum((super_mean[k] - overall) ** 2 for k in range(k_count)) / (k_count - 1)
    w = 0.0
    for k in range(k_count):
        b_tilde = 0.0
        if m_count > 1:
            b_tilde = sum((chain_mean[k][m] - super_mean[k]) ** 2 for m in range(m_count))
            b_tilde /= m_count - 1
        w_tilde = 0.0
        if n > 1:
            for m in range(m_count):
                w_tilde += sum((x - chain_mean[k][m]) ** 2 for x in f[k][m]) / (n - 1)
            w_tilde /= m_count
        w += (b_tilde + w_tilde) / k_count
    return math.sqrt(1 + b / w)


def test_hand_computed_value():
    # K=2, M=2, N=3. Chain means 1, 2 | 3, 4; superchain means 1.5, 3.5; overall 2.5.
    # B = (1 + 1) / 1 = 2; Btilde = 0.5 each; Wtilde = 1 each; W = 1.5.
    draws = np.array([[0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5]], dtype=float)
    assert nested_rhat_array(draws, 2) == pytest.approx(math.sqrt(1 + 2 / 1.5), abs=1e-15)
    assert oracle(draws, 2) == pytest.approx(math.sqrt(7 / 3), abs=1e-15)


@pytest.mark.parametrize(
    ("superchains", "per_superchain", "length", "event"),
    [(2, 2, 3, ()), (3, 4, 5, (2,)), (4, 1, 6, (3,)), (5, 3, 1, ()), (2, 5, 7, (2, 3))],
)
def test_matches_loop_oracle(superchains, per_superchain, length, event):
    rng = np.random.default_rng(superchains * 100 + per_superchain * 10 + length)
    chains = superchains * per_superchain
    # unequal chain offsets and scales, so every variance term matters
    scales = rng.uniform(0.5, 2, size=(chains, 1, *(1 for _ in event)))
    draws = rng.normal(size=(chains, length, *event)) * scales
    draws += rng.normal(size=(chains, 1, *event))
    got = nested_rhat_array(draws, superchains)
    assert got.shape == event
    for index in np.ndindex(*event):
        expected = oracle(draws[(slice(None), slice(None), *index)], superchains)
        assert got[index] == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_well_mixed_near_one_and_stuck_superchain_flagged():
    rng = np.random.default_rng(0)
    superchains, per_superchain, length = 64, 8, 20
    draws = rng.normal(size=(superchains * per_superchain, length, 2))
    mixed = nested_rhat_array(draws, superchains)
    assert np.all(mixed < 1.01)
    assert np.all(mixed > 1.0)
    stuck = draws.copy()
    stuck[:per_superchain, :, 0] += 5.0  # superchain 0 sits 5 sd away in coordinate 0
    flagged = nested_rhat_array(stuck, superchains)
    assert flagged[0] > 1.05
    assert flagged[1] == mixed[1]


@pytest.mark.parametrize(("per_superchain", "length"), [(16, 1), (4, 2), (2, 8)])
def test_iid_expected_value(per_superchain, length):
    # Independent unit-variance draws: E[B] = 1/(M N), E[Btilde] = 1/N, E[Wtilde] = 1
    # (0 when N = 1), so B / W is about 1/(M (N + 1)), or 1/M when N = 1.
    rng = np.random.default_rng(per_superchain)
    superchains = 4000
    draws = rng.normal(size=(superchains * per_superchain, length))
    excess = float(nested_rhat_array(draws, superchains)) ** 2 - 1
    expected = 1 / per_superchain if length == 1 else 1 / (per_superchain * (length + 1))
    assert excess == pytest.approx(expected, rel=0.1)


def test_one_chain_per_superchain_is_rhat_over_chains():
    rng = np.random.default_rng(1)
    chains, length = 6, 50
    draws = rng.normal(size=(chains, length)) + 0.3 * rng.normal(size=(chains, 1))
    b = draws.mean(axis=1).var(ddof=1)
    w = draws.var(axis=1, ddof=1).mean()
    got = float(nested_rhat_array(draws, chains))
    assert got == pytest.approx(math.sqrt(1 + b / w), rel=1e-12)
    # classical Gelman-Rubin R-hat: var+ / W with var+ = (N-1)/N W + B
    classical = math.sqrt(((length - 1) / length * w + b) / w)
    assert got**2 - classical**2 == pytest.approx(1 / length, rel=1e-10)


def test_single_draw_chains_are_finite():
    rng = np.random.default_rng(2)
    draws = rng.normal(size=(4 * 8, 1, 3))
    got = nested_rhat_array(draws, 4)
    assert got.shape == (3,)
    assert np.all(np.isfinite(got))
    assert got[0] == pytest.approx(oracle(draws[:, :, 0], 4), rel=1e-12)


@pytest.mark.parametrize(
    ("shape", "superchains", "match"),
    [
        ((8, 5), 1, "superchains"),
        ((8, 5), 0, "superchains"),
        ((8, 5), 3, "superchains"),
        ((8, 5), 16, "superchains"),
        ((8, 1), 8, "superchains"),
        ((8,), 2, "draws"),
        ((8, 0), 2, "draws"),
    ],
)
def test_bad_arguments_raise(shape, superchains, match):
    with pytest.raises(ValueError, match=match):
        nested_rhat_array(np.zeros(shape), superchains)


def test_datatree_per_variable_with_dims_kept():
    rng = np.random.default_rng(3)
    mu = rng.normal(size=(6, 10))
    theta = rng.normal(size=(6, 10, 3)) + np.arange(6)[:, None, None] // 2
    tree = arviz.from_dict(
        {"posterior": {"mu": mu, "theta": theta}, "sample_stats": {"lp": mu**2}},
        dims={"theta": ["school"]},
        coords={"school": ["a", "b", "c"]},
    )
    result = nested_rhat(tree, superchains=3)
    assert isinstance(result, xr.Dataset)
    assert set(result.data_vars) == {"mu", "theta"}
    assert result["mu"].dims == ()
    assert result["theta"].dims == ("school",)
    assert list(result["theta"].coords["school"].values) == ["a", "b", "c"]
    np.testing.assert_allclose(result["mu"].values, nested_rhat_array(mu, 3), rtol=1e-14)
    np.testing.assert_allclose(result["theta"].values, nested_rhat_array(theta, 3), rtol=1e-14)
    stats = nested_rhat(tree, superchains=2, group="sample_stats")
    np.testing.assert_allclose(stats["lp"].values, nested_rhat_array(mu**2, 2), rtol=1e-14)


def test_datatree_with_draw_dim_first():
    rng = np.random.default_rng(4)
    theta = rng.normal(size=(4, 7, 2)) + np.arange(4)[:, None, None] // 2
    dataset = xr.Dataset({"theta": (("draw", "school", "chain"), theta.transpose(1, 2, 0))})
    tree = xr.DataTree.from_dict({"posterior": dataset})
    result = nested_rhat(tree, superchains=2)
    assert result["theta"].dims == ("school",)
    np.testing.assert_allclose(result["theta"].values, nested_rhat_array(theta, 2), rtol=1e-14)


def test_datatree_variable_without_chain_dim_raises():
    dataset = xr.Dataset({"x": (("draw",), np.zeros(5))})
    tree = xr.DataTree.from_dict({"posterior": dataset})
    with pytest.raises(ValueError, match="chain"):
        nested_rhat(tree, superchains=2)
