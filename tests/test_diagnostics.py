"""The sampler's own split R-hat and ESS against ArviZ's, which are the oracle."""

import numpy as np
import pytest
from arviz_stats.base import array_stats

from hmc import diagnostics
from hmc.diagnostics import ess, split_rhat


def autoregressive(rho: float, chains: int, draws: int, seed: int) -> np.ndarray:
    """``(chains, draws)`` of an AR(1) process with coefficient ``rho``."""
    noise = np.random.default_rng(seed).normal(size=(chains, draws))
    x = np.empty_like(noise)
    x[:, 0] = noise[:, 0] / np.sqrt(1 - rho**2)
    for t in range(1, draws):
        x[:, t] = rho * x[:, t - 1] + noise[:, t]
    return x


CASES = {
    "independent": autoregressive(0.0, 4, 200, 1),
    "correlated": autoregressive(0.9, 4, 300, 2),
    "antithetic, odd length": autoregressive(-0.5, 4, 101, 3),
    "nearly stuck": autoregressive(0.99, 8, 50, 4),
    "chains apart": autoregressive(0.5, 4, 100, 5) + np.arange(4)[:, None],
    "ties": np.round(autoregressive(0.3, 3, 80, 6), 1),
    "one chain": autoregressive(0.7, 1, 60, 7),
    "five draws": autoregressive(0.0, 2, 5, 8),
    "three draws": autoregressive(0.0, 4, 3, 9),
    "constant": np.ones((4, 20)),
    "a NaN": np.r_[autoregressive(0.0, 1, 40, 10), np.full((1, 40), np.nan)],
    "an infinite chain": np.r_[autoregressive(0.0, 1, 40, 11), np.full((1, 40), np.inf)],
}


def same(ours: float, arviz: float) -> bool:
    return (np.isnan(ours) and np.isnan(arviz)) or ours == pytest.approx(arviz, rel=1e-10)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("method", ["bulk", "mean"])
def test_ess_equals_arviz(name: str, method: str) -> None:
    draws = CASES[name]
    with np.errstate(all="ignore"):
        expected = float(array_stats.ess(draws, chain_axis=0, draw_axis=1, method=method))
    assert same(ess(draws, method), expected), (ess(draws, method), expected)


@pytest.mark.parametrize("name", CASES)
def test_split_rhat_equals_arviz(name: str) -> None:
    draws = CASES[name]
    with np.errstate(all="ignore"):
        expected = float(array_stats.rhat(draws, chain_axis=0, draw_axis=1, method="split"))
    assert same(float(split_rhat(draws)), expected)


@pytest.mark.parametrize("block", [diagnostics.BLOCK, 800])  # 800: two rows at a time
def test_split_rhat_takes_leading_axes(monkeypatch, block: int) -> None:
    monkeypatch.setattr(diagnostics, "BLOCK", block)
    draws = np.stack([autoregressive(0.8, 4, 100, seed) for seed in range(15)])
    draws = draws.reshape(3, 5, 4, 100)
    draws[1, 2] += 3 * np.arange(4)[:, None]
    expected = array_stats.rhat(draws, chain_axis=-2, draw_axis=-1, method="split")
    np.testing.assert_allclose(split_rhat(draws), expected, rtol=1e-12)
    assert split_rhat(draws)[1, 2] > 1.5


def test_ess_refuses_an_unknown_method() -> None:
    with pytest.raises(ValueError, match="method must be 'bulk' or 'mean'"):
        ess(np.zeros((2, 10)), method="tail")
