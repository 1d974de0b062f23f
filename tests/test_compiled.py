"""The compiled energy: the same values and gradients as eager, one graph per run whatever
the batch, a clear fallback when compiling fails, and the sampler's choice of when to
compile. Each compile costs a few seconds on a 2-core CPU, so each test compiles once; the
check over all 14 built-in posteriors is in the slow tier."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import torch._dynamo.utils
from conftest import assert_moments, gaussian_log_prob

import hmc
import hmc.models
import hmc.potential
from hmc.potential import Potential
from hmc.settings import compile_decision_at

F64 = torch.float64


def wavy(q: torch.Tensor) -> torch.Tensor:
    """A non-quadratic log density of one position ``(D,)``."""
    return -0.5 * (q**2).sum() + torch.sin(q[0] * q[1]) - 0.1 * torch.logsumexp(q, 0) ** 2


def points(rows: int, dim: int, seed: int = 0, dtype: torch.dtype = F64) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, dim, generator=generator, dtype=F64).to(dtype)


def assert_same_energy(compiled: Potential, eager: Potential, q, rtol: float) -> None:
    U_c, g_c = compiled.value_and_grad(q)
    U_e, g_e = eager.value_and_grad(q)
    assert type(U_c) is type(U_e)
    U_c, g_c, U_e, g_e = (torch.as_tensor(a) for a in (U_c, g_c, U_e, g_e))
    torch.testing.assert_close(U_c, U_e, rtol=rtol, atol=rtol * float(U_e.abs().max()))
    torch.testing.assert_close(g_c, g_e, rtol=rtol, atol=rtol * float(g_e.abs().max()))


def graphs() -> int:
    """Graphs torch has compiled in this process (its own counter of the graphs lowered
    by AOTAutograd: dynamo's count of unique graphs also counts a graph's traced
    ``while_loop`` body)."""
    return torch._dynamo.utils.counters["aot_autograd"]["total"]


# ---------------------------------------------------------------------- the energy
def test_one_graph_serves_every_narrower_batch_and_matches_eager():
    """Compiled at width 4 on first use; batches of 4, 3, 1 rows (tensors and NumPy) and a
    single position reuse that graph and agree with eager to rounding."""
    compiled, eager = Potential(wavy, compile=True), Potential(wavy, compile=False)
    q = points(4, 3)
    before = graphs()
    for batch in (q, q[:3], q[:1], q[2], q[1:3].numpy()):
        assert_same_energy(compiled, eager, batch, rtol=1e-12)
    assert graphs() - before == 1
    assert compiled.compiled and compiled.compile_seconds > 0 and compiled.compile_note is None
    assert compiled.evaluations == eager.evaluations == 4 + 3 + 1 + 1 + 2


def test_batched_density_in_float32():
    def batched(q: torch.Tensor) -> torch.Tensor:
        return -0.5 * (q**2).sum(-1) + torch.cos(q[:, 0]) * q[:, 1]

    compiled = Potential(batched, batched=True, compile=True)
    eager = Potential(batched, batched=True, compile=False)
    q = points(5, 4, dtype=torch.float32)
    assert_same_energy(compiled, eager, q, rtol=1e-5)
    assert compiled.value_and_grad(q)[0].dtype == torch.float32


def test_non_finite_and_raising_rows_get_infinite_energy():
    """A NaN row and a row whose Cholesky fails are U = +inf with a zero gradient, as in
    the eager energy; the others are unchanged."""

    def log_prob(q: torch.Tensor) -> torch.Tensor:
        one = q[0].new_ones(())
        matrix = torch.stack((torch.stack((one, q[0])), torch.stack((q[0], 1 + q[1] ** 2))))
        return torch.linalg.cholesky(matrix).diagonal().log().sum() - 0.5 * (q**2).sum()

    compiled = Potential(log_prob, compile=True)
    eager = Potential(log_prob, compile=False)
    q = torch.tensor([[0.3, 0.1], [5.0, 0.0], [-0.2, 1.0]], dtype=F64)  # row 1: not PD
    compiled.value_and_grad(q[[0, 2]])  # compile where the density is finite
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "log_prob raised ..."
        U, grad = compiled.value_and_grad(q)
        U_e, grad_e = eager.value_and_grad(q)
    assert U[1] == torch.inf and (grad[1] == 0).all()
    torch.testing.assert_close(U, U_e, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, grad_e, rtol=1e-12, atol=1e-15)

    nan = Potential(lambda q: -0.5 * (q**2).sum() + torch.sqrt(q[0]), compile=True)
    U, grad = nan.value_and_grad(torch.tensor([[1.0, 2.0], [-1.0, 0.5]], dtype=F64))
    assert U[0].isfinite() and U[1] == torch.inf and (grad[1] == 0).all()


FAILED_COMPILE = """
import warnings, torch
from hmc.potential import Potential
potential = Potential(lambda q: -0.5 * (q**2).sum(), compile=True)
q = torch.ones(3, 2, dtype=torch.float64)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    U, _ = potential.value_and_grad(q)
    potential.value_and_grad(q)
print(repr((U.tolist(), potential.compiled, [str(w.message) for w in caught])))
"""


@pytest.mark.slow  # 8 s: the quick tier keeps within its five minutes
def test_a_failed_compile_warns_once_and_evaluates_eagerly():
    """No C++ compiler (and no cached compiled code): one warning naming the compiler's
    error, then eager values. In a process of its own: torch remembers a bad compiler."""
    env = {**os.environ, "CXX": "no-such-compiler-on-this-machine"}
    env.update(TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0")
    result = subprocess.run(
        [sys.executable, "-c", FAILED_COMPILE], env=env, capture_output=True, text=True,
        timeout=300, check=True,
    )  # fmt: skip
    values, compiled, messages = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    assert values == [1.0, 1.0, 1.0] and compiled is False
    assert len(messages) == 1, messages
    assert messages[0].startswith("could not compile log_prob (") and "compiler" in messages[0]


def test_auto_compiles_at_a_fixed_count_of_evaluations(monkeypatch):
    monkeypatch.setattr(hmc.potential, "AUTO_COMPILE_CALLS", 3)
    potential = Potential(wavy)
    q = points(2, 3)
    for _ in range(2):
        potential.value_and_grad(q)
    assert not potential.compiled
    potential.value_and_grad(q)
    assert potential.compiled


CALLS = {"n": 0}


def counted(q: torch.Tensor) -> torch.Tensor:
    """A log density that counts its calls in Python state (a user's habit)."""
    CALLS["n"] += 1
    return -0.5 * (q**2).sum()


def test_a_density_with_python_state_is_compiled_once_then_runs_eagerly_with_one_warning():
    """A counter inside log_prob makes torch compile the energy again at every call; the
    energy sees the second compile, warns once naming the cause, says so in its note and
    goes on eagerly instead of recompiling up to torch's limit."""
    potential = Potential(counted, compile=True)
    q = torch.randn(3, 2, dtype=torch.float64)
    before = graphs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [potential.value_and_grad(q) for _ in range(4)]
    messages = [str(w.message) for w in caught if "Python state" in str(w.message)]
    assert len(messages) == 1 and messages[0].startswith("torch compiled log_prob again")
    assert graphs() - before == 2  # the first compile and the one that was noticed
    assert not potential.compiled and "Python state" in potential.compile_note
    for U, grad in results:
        torch.testing.assert_close(U, 0.5 * (q**2).sum(1), rtol=1e-12, atol=0)
        torch.testing.assert_close(grad, q, rtol=1e-12, atol=0)


def test_compile_argument_is_checked():
    with pytest.raises(ValueError, match="compile must be True, False or 'auto'"):
        Potential(wavy, compile="yes")
    with pytest.raises(ValueError, match="compile must be True, False or 'auto'"):
        hmc.sample(wavy, dim=3, compile=1, progress=False)


# ---------------------------------------------------------------------- in a run
def test_short_runs_stay_eager_by_default(standard_normal):
    dt = hmc.sample(standard_normal, dim=2, chains=2, warmup=100, draws=100, seed=1, progress=False)
    assert dt.attrs["compiled"] == 0 and dt.attrs["compile_time"] == 0
    assert dt.attrs["compile_decision"].startswith("eager: ")


def test_auto_decides_a_tenth_into_the_run_and_the_pooled_warmup_at_its_end():
    assert compile_decision_at("stan", 1000, 1000) == 200
    assert compile_decision_at("stan", 50, 50) == 20
    assert compile_decision_at("stan", 0, 10) == 10
    assert compile_decision_at("ensemble", 1000, 20) == 1000


def test_the_readme_example_stays_eager_by_the_measured_cost():
    """The README's first example (a 3-D Gaussian, 4 chains, 1000 + 1000): its eager
    evaluations take a few seconds in all, less than compiling would save."""
    log_prob = gaussian_log_prob(np.zeros(3), np.eye(3))
    dt = hmc.sample(log_prob, dim=3, chains=4, seed=1, progress=False)
    assert dt.attrs["compiled"] == 0
    decision = dt.attrs["compile_decision"]  # NUTS chains are not in step: about 7,200
    assert re.match(r"eager: 7[01]\d\d iterations left", decision), decision


@pytest.mark.slow  # compiles NUTS's trees: 20 s
def test_auto_compiles_where_the_expected_saving_exceeds_the_cost(monkeypatch):
    """With compiling expected to cost nothing, the decision a tenth into the run
    compiles (NUTS's trees) and the run says why."""
    monkeypatch.setattr(
        hmc.potential, "COMPILE_COST", dict.fromkeys(hmc.potential.COMPILE_COST, 0.0)
    )
    dt = hmc.sample(wavy, dim=3, chains=2, warmup=100, draws=100, seed=1, progress=False)
    assert dt.attrs["compiled"] == 1 and dt.attrs["compile_time"] > 0
    assert re.match(r"compiled: 3[56]\d iterations left", dt.attrs["compile_decision"])


def test_decide_compile_weighs_the_measured_eager_seconds(monkeypatch):
    """Compile where the eager seconds expected for what is left, less their compiled
    share, exceed the expected cost of compiling; and only once, for "auto"."""
    monkeypatch.setattr(
        hmc.potential, "COMPILE_COST", dict.fromkeys(hmc.potential.COMPILE_COST, 10.0)
    )
    q = points(2, 3)
    for seconds, left, compiles in ((1.0, 100, False), (1.0, 200, True)):
        potential = Potential(wavy)
        potential.value_and_grad(q)
        potential._eager_seconds = seconds  # 1 s over 10 iterations, as if measured
        # expected 10 s or 20 s left, saving two thirds of it: 6.7 s or 13.3 s against 10 s
        assert potential.decide_compile(10, left) is compiles
        assert potential.compile_decision.startswith("compiled" if compiles else "eager")
        assert potential.decide_compile(10, 10**6) is compiles  # settled
    assert Potential(wavy, compile=False).decide_compile(1, 10**9) is False


def test_the_many_short_chains_recipe_stays_eager_when_its_warmup_stops_early(standard_normal):
    """The README's recipe (the pooled warmup's default cap of 1000, a few draws): the
    chains settle at iteration 120, long before compiling would pay."""
    dt = hmc.sample(
        standard_normal, dim=3, chains=64, kernel="chees", draws=20, seed=1, progress=False
    )
    assert dt.attrs["tuning_steps"] < 500
    assert dt.attrs["compiled"] == 0 and dt.attrs["compile_time"] == 0


@pytest.mark.slow  # a compile, 5 s: the quick tier keeps within its five minutes
def test_a_pooled_warmup_that_goes_on_compiles_as_it_goes(monkeypatch, standard_normal):
    """With the energy's own count lowered to 100 evaluations, the same recipe compiles
    mid-warmup, and the run says so."""
    monkeypatch.setattr(hmc.potential, "AUTO_COMPILE_CALLS", 100)
    dt = hmc.sample(
        standard_normal, dim=3, chains=8, kernel="chees", draws=20, seed=1, progress=False
    )
    assert dt.attrs["compiled"] == 1 and dt.attrs["compile_time"] > 0
    assert dt.attrs["n_gradient_evaluations"] > 100 * 8
    assert np.isfinite(dt["posterior"]["x"].values).all()


@pytest.mark.parametrize(
    ("kernel", "engine"),
    [("nuts", "numpy"), ("hmc", "torch"), pytest.param("nuts", "torch", marks=pytest.mark.slow)],
)
def test_a_compiled_run_draws_the_target_with_one_graph(kernel, engine):
    """NUTS and static HMC with the energy compiled: one graph for the whole run (chains
    finish their trajectories at different steps, so most evaluations see fewer rows
    than chains), no recompile warning, and means, variances and the correlation of a
    correlated Gaussian within their MCSE."""
    mean = np.array([0.5, -1.0, 2.0])
    cov = np.array([[1.0, 0.9, 0.0], [0.9, 1.0, -0.3], [0.0, -0.3, 2.0]])
    log_prob = gaussian_log_prob(mean, cov)
    before = graphs()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dt = hmc.sample(
            log_prob, dim=3, chains=4, warmup=300, draws=600, kernel=kernel, seed=7,
            batched=True, engine=engine, compile=True, progress=False,
        )  # fmt: skip
    assert graphs() - before == 1
    assert dt.attrs["compiled"] == 1 and dt.attrs["compile_time"] > 0
    assert_moments(dt["posterior"]["x"].values, mean, cov)


# ---------------------------------------------------------------------- built-in models
@pytest.mark.slow
@pytest.mark.parametrize("name", hmc.models.names())
def test_every_built_in_posterior_compiles_to_the_eager_energy(name):
    """The graph includes the model's transforms, priors and Jacobians: value and gradient
    within 1e-10 relative of eager in float64, and close in float32."""
    model = hmc.models.load(name)
    compiled = Potential(model.log_prob, compile=True)
    eager = Potential(model.log_prob, compile=False)
    q = 0.5 * points(3, model.dim, seed=1)
    assert_same_energy(compiled, eager, q, rtol=1e-10)
    assert compiled.compiled
    compiled32 = Potential(model.log_prob, compile=True)
    eager32 = Potential(model.log_prob, compile=False)
    assert_same_energy(compiled32, eager32, q.float(), rtol=1e-3)


@pytest.mark.slow
def test_many_energies_in_one_process_each_get_their_graph():
    """Each energy has a code object of its own: the ninth density compiled in a process
    is compiled too, not refused by torch's recompile limit (8 per code object)."""
    q = points(2, 3)
    before = graphs()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for scale in range(1, 11):
            potential = Potential(lambda x, s=float(scale): -0.5 * s * (x**2).sum(), compile=True)
            U, _ = potential.value_and_grad(q)
            torch.testing.assert_close(U, 0.5 * scale * (q**2).sum(-1))
    assert graphs() - before == 10
