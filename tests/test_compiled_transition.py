"""Compiled transitions: static HMC and ChEES (every leapfrog step, the Metropolis test
and the statistics in one graph) and NUTS (every chain's tree in one graph), giving the
eager path's draws to rounding for the same seed, step size and metric; one graph per
run; a density that cannot be captured whole, or a graph whose result differs from eager,
runs eagerly after one warning. Each compile takes a few seconds on a 2-core CPU (NUTS's
trees 10-20 s)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch._dynamo.utils
from conftest import assert_moments, gaussian_log_prob

import hmc
from hmc.kernels.base import Phase
from hmc.metric import metric_from_inverse
from hmc.potential import Potential
from hmc.random import chain_keys
from hmc.state import Params, State

F64 = torch.float64
MEAN = np.array([0.5, -1.0, 2.0])
COV = np.array([[1.0, 0.9, 0.0], [0.9, 1.0, -0.3], [0.0, -0.3, 2.0]])


def wavy(q: torch.Tensor) -> torch.Tensor:
    """A non-quadratic log density of one position ``(D,)``, so that rounding shows."""
    return -0.5 * (q**2).sum() + torch.sin(q[0] * q[1]) - 0.1 * torch.logsumexp(q, 0) ** 2


def graphs() -> int:
    """Graphs torch has lowered in this process (AOTAutograd's count)."""
    return torch._dynamo.utils.counters["aot_autograd"]["total"]


def run(kernel, compile, engine="numpy", **kw):
    """A run with a fixed step size and no warmup: compiled and eager see the same
    parameters, so their draws agree to rounding."""
    options = dict(chains=6, warmup=0, draws=150, step_size=0.35, seed=3, progress=False)
    return hmc.sample(wavy, dim=3, kernel=kernel, compile=compile, engine=engine, **options, **kw)


def assert_same_run(compiled, eager, all_compiled=True):
    for name in ("x",):
        np.testing.assert_allclose(
            compiled["posterior"][name].values, eager["posterior"][name].values, atol=1e-10
        )
    for name in ("n_steps", "diverging", "tree_depth"):
        if name in eager["sample_stats"]:
            np.testing.assert_array_equal(
                compiled["sample_stats"][name].values, eager["sample_stats"][name].values
            )
    for name in ("acceptance_rate", "energy", "energy_error", "lp"):
        np.testing.assert_allclose(
            compiled["sample_stats"][name].values, eager["sample_stats"][name].values,
            rtol=1e-10, atol=1e-10,
        )  # fmt: skip
    assert compiled.attrs["compiled"] == 1 and compiled.attrs["compile_time"] > 0
    assert eager.attrs["compiled"] == 0
    # every chain is evaluated while the longest trajectory (or tree) of its call moves
    steps = eager["sample_stats"]["n_steps"].values  # (chains, draws)
    lockstep = steps.shape[0] * steps.max(axis=0).sum() - steps.sum()
    extra = compiled.attrs["n_gradient_evaluations"] - eager.attrs["n_gradient_evaluations"]
    assert extra == lockstep if all_compiled else 0 < extra < lockstep


@pytest.mark.parametrize(
    ("kernel", "engine"),
    [
        (hmc.ChEES(trajectory_length=2.0), "numpy"),
        (hmc.HMC(), "torch"),  # steps that differ between chains
        (hmc.NUTS(), "numpy"),  # trees that differ between chains
        pytest.param(hmc.HMC(), "numpy", marks=pytest.mark.slow),
        pytest.param(hmc.HMC(num_steps=6), "torch", marks=pytest.mark.slow),
    ],
)
def test_a_compiled_transition_gives_the_eager_draws_with_one_graph(kernel, engine):
    before = graphs()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = run(kernel, True, engine)
    assert graphs() - before == 1  # the one-step check and every transition share it
    eager = run(kernel, False, engine)
    assert graphs() - before == 1
    assert_same_run(compiled, eager)


@pytest.mark.parametrize("engine", ["numpy", pytest.param("torch", marks=pytest.mark.slow)])
def test_nuts_compiling_mid_run_gives_the_eager_draws(engine, monkeypatch):
    """``compile="auto"`` settles a tenth into the run (compiling is made to cost nothing);
    the trees in flight then end eagerly and no chain starts another until every chain
    stands at a draw, after which every tree runs compiled: the eager run's draws to
    rounding, with the first tenth's evaluations those of the eager trees."""
    monkeypatch.setattr(
        hmc.potential, "COMPILE_COST", dict.fromkeys(hmc.potential.COMPILE_COST, 0.0)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = run(hmc.NUTS(), "auto", engine)
    assert compiled.attrs["compile_decision"].startswith("compiled")
    assert_same_run(compiled, run(hmc.NUTS(), False, engine), all_compiled=False)


@pytest.mark.slow  # a compile, 3 s
def test_random_numbers_of_steps_count_every_evaluated_row():
    """HMC's steps differ between chains; the compiled loop evaluates every chain while
    the longest trajectory moves, and counts those rows."""
    compiled = run(hmc.HMC(), True)
    steps = compiled["sample_stats"]["n_steps"].values  # (chains, draws)
    longest = steps.max(axis=0).sum() * steps.shape[0]
    initial = compiled.attrs["n_gradient_evaluations"] - longest
    assert 0 < initial <= 6 * 100  # the initial points' evaluations (and retries)
    assert (steps.max(axis=0) > steps.min(axis=0)).any()


@pytest.mark.parametrize(
    "kernel",
    [hmc.HMC(num_steps=9), pytest.param(hmc.NUTS(max_tree_depth=6), marks=pytest.mark.slow)],
)
def test_the_dense_metric_transition_for_hand_written_loops(kernel):
    """``transition`` with a dense metric through the compiled loop, against the eager
    energy module: the same new states and statistics to rounding."""
    chains, dim = 5, 3
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(chains, dim, generator=generator, dtype=F64)
    a = torch.randn(chains, dim, dim, generator=generator, dtype=F64)
    inverse = a @ a.mT / dim + 0.5 * torch.eye(dim, dtype=F64)
    params = Params(torch.full((chains,), 0.2, dtype=F64), metric_from_inverse(inverse))
    keys = chain_keys(1, torch.arange(chains))
    results = []
    for potential in (
        Potential(wavy, compile=True, compiled_loop=kernel.compiled_loop),
        Potential(wavy, compile=False),
    ):
        state = State(q, *potential.value_and_grad(q))
        for counter in range(3):
            state, info = kernel.transition(
                state, params, potential, keys, torch.full((chains,), counter)
            )
        results.append((state, info, potential))
    (state_c, info_c, compiled), (state_e, info_e, eager) = results
    assert compiled.compiled and not eager.compiled
    if isinstance(kernel, hmc.HMC):
        assert compiled.evaluations == eager.evaluations == chains * (1 + 3 * 9)
    for a_, b_ in zip((*state_c, *info_c), (*state_e, *info_e), strict=True):
        torch.testing.assert_close(a_, b_, rtol=1e-10, atol=1e-10)
    assert info_c.acceptance_rate.min() < 1  # the test accepts and rejects: it is in the graph


def test_chees_reports_the_eager_trajectories_to_its_adaptation():
    """What ChEES's adaptation reads of a compiled transition (start, end, the velocity
    ``M^-1 p`` there, the integration time) under a diagonal metric that is not the
    identity, against the eager kernel's, over three calls."""
    chains, dim = 4, 3
    q = torch.randn(chains, dim, generator=torch.Generator().manual_seed(2), dtype=F64)
    inverse = torch.linspace(0.3, 2.0, chains * dim, dtype=F64).reshape(chains, dim)
    params = Params(
        torch.full((chains,), 0.25, dtype=F64),
        metric_from_inverse(inverse),
        torch.full((chains,), 1.7, dtype=F64),
    )
    keys = chain_keys(4, torch.arange(chains))
    kernel = hmc.ChEES()
    phase = Phase(torch.ones(chains, dtype=torch.bool), torch.full((chains,), 3))
    reports = []
    for potential in (
        Potential(wavy, compile=True, compiled_loop="transition"),
        Potential(wavy, compile=False),
    ):
        kernel_state = kernel.init(State(q, *potential.value_and_grad(q)))
        for _ in range(3):
            kernel_state, step = kernel.step(kernel_state, params, potential, keys, phase)
        reports.append((step.proposal, step.state, potential.compiled))
    (compiled, state_c, was_compiled), (eager, state_e, _) = reports
    assert was_compiled
    for a, b in zip((*compiled, *state_c), (*eager, *state_e), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def python_branch(q: torch.Tensor) -> torch.Tensor:
    """A density whose Python control flow depends on the position's values: no graph
    can hold it whole (a ``while_loop`` body cannot break)."""
    if q[0] > 0:
        return -0.5 * (q**2).sum()
    return -0.5 * (q**2).sum() - 0.1 * q[0] ** 2


@pytest.mark.parametrize("kernel", [hmc.HMC(num_steps=4), hmc.NUTS(max_tree_depth=4)])
def test_a_density_that_cannot_be_captured_runs_eagerly_after_one_warning(kernel):
    options = dict(dim=2, chains=3, warmup=0, draws=20, step_size=0.3, seed=1, progress=False)
    with pytest.warns(RuntimeWarning, match="could not compile the transition") as caught:
        compiled = hmc.sample(python_branch, kernel=kernel, compile=True, **options)
    assert len([w for w in caught if "could not compile" in str(w.message)]) == 1
    eager = hmc.sample(python_branch, kernel=kernel, compile=False, **options)
    np.testing.assert_array_equal(compiled["posterior"]["x"].values, eager["posterior"]["x"].values)
    assert compiled.attrs["compiled"] == 0 and compiled.attrs["compile_note"]


def compiled_differently(q: torch.Tensor) -> torch.Tensor:
    """A density whose compiled value is 1 % off its eager one: what a compiler that is
    silently wrong would do."""
    scale = 1.01 if torch.compiler.is_compiling() else 1.0
    return -0.5 * scale * (q**2).sum()


@pytest.mark.parametrize("kernel", [hmc.HMC(num_steps=4)])  # NUTS's trees: the same check
def test_a_compiled_transition_that_differs_from_eager_is_not_used(kernel):
    options = dict(dim=2, chains=3, warmup=0, draws=20, step_size=0.3, seed=1, progress=False)
    with pytest.warns(RuntimeWarning, match="differs from the eager one"):
        compiled = hmc.sample(compiled_differently, kernel=kernel, compile=True, **options)
    eager = hmc.sample(compiled_differently, kernel=kernel, compile=False, **options)
    np.testing.assert_array_equal(compiled["posterior"]["x"].values, eager["posterior"]["x"].values)
    assert "differs from the eager one" in compiled.attrs["compile_note"]


@pytest.mark.slow  # a pooled warmup and 2,000 compiled transitions: 15 s
def test_compiled_chees_with_its_warmup_draws_the_target():
    """ChEES with the pooled warmup, every transition compiled: means, variances and the
    correlation of a correlated Gaussian within their MCSE, one graph for the run."""
    before = graphs()
    dt = hmc.sample(
        gaussian_log_prob(MEAN, COV), dim=3, chains=16, kernel="chees", warmup=500,
        draws=600, seed=5, batched=True, compile=True, progress=False,
    )  # fmt: skip
    assert graphs() - before == 1
    assert dt.attrs["compiled"] == 1
    assert_moments(dt["posterior"]["x"].values, MEAN, COV)
