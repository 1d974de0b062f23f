"""Stranded chains in Stan's per-chain warmup: at a slow window's end, a chain whose log
density stayed far below the others' restarts from a healthy chain (its state, step size,
metric and dual averaging), with a warning naming it; when no chain is stranded the run's
draws are those of a run without the window-end stops."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from conftest import assert_moments, minor_mode_log_prob
from torch.utils._pytree import tree_leaves

import hmc
from hmc.adapt import StanWarmup, build_schedule
from hmc.adapt.stranded import restart_sources, stranded_chains, stranded_from_moments
from hmc.adapt.welford import welford_init, welford_update
from hmc.metric import metric_from_inverse
from hmc.random import chain_keys
from hmc.state import Params
from hmc.step_size_search import find_reasonable_step_size

DTYPE = torch.float64
SETTINGS = dict(dim=2, batched=True, progress=False, chains=4, warmup=300, draws=500, compile=False)


def stranded_start(chains: int = 4) -> torch.Tensor:
    """Starts ``(chains, 2)`` at the main mode, chain 0 at the minor one."""
    init = torch.zeros(chains, 2, dtype=DTYPE)
    init[0] = torch.tensor([20.0, 0.0])
    return init


def window_moments(log_density: torch.Tensor):
    """Each chain's running moments of ``log_density`` ``(C, N)``, as warmup keeps them."""
    chains = log_density.shape[0]
    moments = welford_init(log_density[:, :1], False)
    for column in log_density.T:
        moments = welford_update(moments, column[:, None], torch.ones(chains, dtype=torch.bool))
    return moments


def test_a_windows_moments_give_the_pooled_criterion():
    """Stan's warmup keeps each window's log-density moments; they give the verdict of the
    pooled warmup's criterion on the window's draws: a chain 30 nats below, and one whose
    density was once -inf, are stranded; each restarts from the healthy chains in turn."""
    lp = np.random.default_rng(0).normal(size=(8, 40))
    lp[3] -= 30.0
    lp[5, 7] = -np.inf
    values = torch.from_numpy(lp)
    moments = window_moments(values)
    spread = (moments.m2[:, 0] / (moments.count - 1)).sqrt()
    by_moments = stranded_from_moments(moments.mean[:, 0], spread)
    assert by_moments.tolist() == stranded_chains(values).tolist()
    assert by_moments.tolist() == [i in (3, 5) for i in range(8)]
    assert restart_sources(by_moments).tolist() == [0, 1, 2, 4, 4, 7, 6, 7]
    assert restart_sources(torch.zeros(8, dtype=torch.bool)) is None
    lp[3] += 25.0  # 5 nats below: within the others' spread
    assert not stranded_chains(torch.from_numpy(lp))[3]


def test_restart_copies_a_healthy_chains_adaptation():
    """Chain 1's window sat 50 nats below the others': it takes the state, step size,
    metric and dual averaging of chain 2 (the healthy chains in turn), keeps its own
    search stream, and is recorded; the window's log-density moments start afresh. A
    window with no stranded chain changes nothing but those moments."""
    chains = 3
    potential = hmc.Potential(lambda q: -0.5 * (q**2).sum(-1), batched=True)
    search = functools.partial(find_reasonable_step_size, potential=potential)
    adapter = StanWarmup(build_schedule(300), search)
    q = torch.tensor([[0.1, 0.2], [9.0, 9.0], [-0.3, 0.1]], dtype=DTYPE)
    state = hmc.State(q, *potential.value_and_grad(q))
    inverse = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=DTYPE)
    params = Params(torch.tensor([0.5, 0.01, 0.7], dtype=DTYPE), metric_from_inverse(inverse))
    warm, _ = adapter.init(state, params, chain_keys(1, torch.arange(chains)))
    warm = warm._replace(search_counter=torch.tensor([3, 4, 5]))
    offsets = torch.tensor([0.0, 50.0, 0.0], dtype=DTYPE)[:, None]
    noise = torch.from_numpy(np.random.default_rng(2).normal(size=(chains, 25)))
    warm = warm._replace(log_density=window_moments(noise - offsets))
    restarted, new_params, new_state = adapter.restart(warm, params, state)
    assert restarted.restarted.tolist() == [False, True, False]
    sources = torch.tensor([0, 2, 2])  # the healthy chains in turn: chain 1 takes 2
    pairs = [
        (new_state, state),
        (new_params.step_size, params.step_size),
        (new_params.metric, params.metric),
        (restarted.dual_averaging, warm.dual_averaging),
        (restarted.welford, warm.welford),
    ]
    for new, old in pairs:
        for x, y in zip(tree_leaves(new), tree_leaves(old), strict=True):
            assert torch.equal(x, y.index_select(0, sources))
    assert restarted.search_counter.tolist() == [3, 4, 5]
    assert restarted.log_density.count.tolist() == [0, 0, 0]
    again, same_params, same_state = adapter.restart(restarted, new_params, new_state)
    assert same_state is new_state and same_params is new_params
    assert again.restarted.tolist() == [False, True, False]


@pytest.mark.parametrize(
    ("engine", "kernel"), [("numpy", "nuts"), ("torch", "hmc"), ("numpy", "mams")]
)
def test_a_stranded_chain_restarts_and_the_run_is_right(engine, kernel):
    """Chain 0 starts at the minor mode, where the step size it adapts to keeps it: at the
    first window's end (iteration 100) it restarts from a healthy chain, parts from it,
    and the run's means, variances and correlation match N(0, I)."""
    with pytest.warns(RuntimeWarning, match=r"chains \[0\] stayed far below"):
        dt = hmc.sample(
            minor_mode_log_prob,
            init=stranded_start(),
            seed=9,
            engine=engine,
            kernel=kernel,
            **SETTINGS,
        )
    assert list(dt.attrs["restarted_chains"]) == [0]
    x = dt["posterior"]["x"].values
    assert (x[0] != x[1:, None]).all(-1).all(-1).all()  # parted from its source
    assert_moments(x, np.zeros(2), np.eye(2))


@pytest.mark.parametrize("kernel", ["nuts", "hmc"])
def test_no_stranded_chain_changes_no_draw(kernel, monkeypatch):
    """On a correlated Gaussian from random starts no chain is stranded: the draws, the
    statistics and the adapted parameters are bit for bit those of a run whose chains
    never wait for each other at the windows' ends. (The log density is elementwise in
    each row, so a row's value does not depend on the rows evaluated with it, which the
    stops change.)"""

    def target(q):
        x, y = q[:, 0] - 1.0, q[:, 1] + 2.0  # precision of [[1, 0.8], [0.8, 2]]
        return -0.5 * (x * x * (2.0 / 1.36) - 2.0 * x * y * (0.8 / 1.36) + y * y / 1.36)

    settings = dict(SETTINGS, kernel=kernel, seed=4, warmup=200, draws=100)
    with_stops = hmc.sample(target, **settings)
    monkeypatch.setattr(StanWarmup, "restart_stops", lambda self: [])
    without = hmc.sample(target, **settings)
    assert list(with_stops.attrs["restarted_chains"]) == []
    for group in ("posterior", "sample_stats", "adaptation"):
        for name in with_stops[group].data_vars:
            np.testing.assert_array_equal(
                with_stops[group][name].values, without[group][name].values, err_msg=name
            )
