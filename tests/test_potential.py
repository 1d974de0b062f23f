"""The energy module: shapes, batching paths, fallbacks, non-finite rows, counting."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import hmc
from hmc._torch_compat import validation_enabled

DTYPE = torch.float64
Q = torch.tensor(
    [[0.5, -1.0, 2.0], [1.5, 0.3, -0.2], [-0.7, 0.0, 1.1], [2.0, 2.0, -3.0]], dtype=DTYPE
)


def smooth(q: torch.Tensor) -> torch.Tensor:
    """A non-quadratic log density of q (..., 3), written for one position or a batch."""
    return (
        -0.5 * (q**2).sum(-1) + torch.sin(q[..., 0] * q[..., 1]) - 0.1 * torch.logsumexp(q, -1) ** 2
    )


def reference(log_prob, q: torch.Tensor):
    """U and dU/dq computed row by row with plain autograd."""
    Us, grads = [], []
    for row in q:
        x = row.detach().clone().requires_grad_(True)
        lp = log_prob(x)
        (g,) = torch.autograd.grad(lp, x)
        Us.append(-lp.detach())
        grads.append(-g)
    return torch.stack(Us), torch.stack(grads)


# ---------------------------------------------------------------------- shapes, paths
def test_shapes_batch_and_single_position():
    potential = hmc.Potential(smooth)
    U, grad = potential.value_and_grad(Q)
    assert U.shape == (4,) and grad.shape == (4, 3)
    assert U.dtype == DTYPE and grad.dtype == DTYPE
    u1, g1 = potential.value_and_grad(Q[1])
    assert u1.shape == () and g1.shape == (3,)
    torch.testing.assert_close(u1, U[1], rtol=1e-15, atol=0)
    torch.testing.assert_close(g1, grad[1], rtol=1e-15, atol=0)
    assert not U.requires_grad and not grad.requires_grad
    with pytest.raises(ValueError, match="shape"):
        potential.value_and_grad(Q.reshape(2, 2, 3))


def test_vmap_path_equals_loop_and_batched_paths():
    U_ref, g_ref = reference(smooth, Q)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the vmap path must not warn
        U_vmap, g_vmap = hmc.Potential(smooth).value_and_grad(Q)
    U_batched, g_batched = hmc.Potential(smooth, batched=True).value_and_grad(Q)
    for U, g in ((U_vmap, g_vmap), (U_batched, g_batched)):
        torch.testing.assert_close(U, U_ref, rtol=1e-14, atol=1e-14)
        torch.testing.assert_close(g, g_ref, rtol=1e-14, atol=1e-14)
    # one chain takes the direct path; same numbers
    U1, g1 = hmc.Potential(smooth).value_and_grad(Q[2:3])
    torch.testing.assert_close(U1, U_ref[2:3], rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(g1, g_ref[2:3], rtol=1e-14, atol=1e-14)


def test_float32_positions_give_float32_results():
    U, grad = hmc.Potential(smooth).value_and_grad(Q.float())
    assert U.dtype == torch.float32 and grad.dtype == torch.float32
    U_ref, g_ref = reference(smooth, Q)
    torch.testing.assert_close(U.double(), U_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad.double(), g_ref, rtol=1e-5, atol=1e-5)


def test_input_is_not_modified_and_no_graph_escapes():
    q = Q.clone().requires_grad_(True)
    U, grad = hmc.Potential(smooth).value_and_grad(q)
    assert q.grad is None
    assert torch.equal(q.detach(), Q)
    assert U.grad_fn is None and grad.grad_fn is None


def data_dependent_branch(q: torch.Tensor) -> torch.Tensor:
    if q[0] > 0:
        return -0.5 * (q**2).sum()
    return -(q**2).sum() + q[1]


def calls_item(q: torch.Tensor) -> torch.Tensor:
    scale = 1.0 + abs(q[0].item())  # a constant as far as autograd is concerned
    return -0.5 * (q**2).sum() / scale


@pytest.mark.parametrize("log_prob", [data_dependent_branch, calls_item])
def test_vmap_fallback_warns_once_with_correct_values(log_prob):
    potential = hmc.Potential(log_prob)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [potential.value_and_grad(Q) for _ in range(3)]
    messages = [str(w.message) for w in caught]
    assert len(caught) == 1, messages
    assert issubclass(caught[0].category, RuntimeWarning)
    assert "vmap" in messages[0] and "batched=True" in messages[0]
    U_ref, g_ref = reference(log_prob, Q)
    for U, g in results:
        torch.testing.assert_close(U, U_ref, rtol=1e-15, atol=0)
        torch.testing.assert_close(g, g_ref, rtol=1e-15, atol=0)
    assert potential.evaluations == 3 * Q.shape[0]


# ---------------------------------------------------------------------- non-finite rows
def partly_undefined(q: torch.Tensor) -> torch.Tensor:
    # log(q0): NaN for q0 < 0, -inf at q0 = 0; sqrt(|q1|): infinite gradient at q1 = 0
    return torch.log(q[..., 0]) - torch.sqrt(torch.abs(q[..., 1])) - 0.5 * q[..., 2] ** 2


@pytest.mark.parametrize("batched", [False, True])
def test_non_finite_rows_get_infinite_energy_and_zero_gradient(batched):
    q = torch.tensor(
        [
            [1.0, 1.0, 0.5],  # finite
            [-1.0, 1.0, 0.5],  # log of a negative: NaN value
            [0.0, 1.0, 0.5],  # -inf value
            [2.0, 0.0, 0.5],  # finite value, infinite gradient
            [3.0, -2.0, -1.0],  # finite
        ],
        dtype=DTYPE,
    )
    potential = hmc.Potential(partly_undefined, batched=batched)
    U, grad = potential.value_and_grad(q)
    assert not torch.isnan(U).any() and not torch.isnan(grad).any()
    assert torch.equal(torch.isinf(U), torch.tensor([False, True, True, True, False]))
    assert (U[1:4] == torch.inf).all()
    assert torch.equal(grad[1:4], torch.zeros(3, 3, dtype=DTYPE))
    good = [0, 4]
    U_ref, g_ref = reference(partly_undefined, q[good])
    torch.testing.assert_close(U[good], U_ref, rtol=1e-15, atol=0)
    torch.testing.assert_close(grad[good], g_ref, rtol=1e-15, atol=0)


def test_positive_infinite_log_density_is_not_accepted_as_finite():
    def blows_up(q):
        return -torch.log(torch.abs(q).sum(-1))  # +inf at the origin

    U, grad = hmc.Potential(blows_up, batched=True).value_and_grad(
        torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DTYPE)
    )
    assert U[0] == torch.inf and torch.equal(grad[0], torch.zeros(2, dtype=DTYPE))
    assert torch.isfinite(U[1])


def raises_for_large_q0(q: torch.Tensor) -> torch.Tensor:
    # a correlation matrix that is not positive definite when |q0| >= 1
    C = torch.eye(2, dtype=q.dtype) + q[0] * (1 - torch.eye(2, dtype=q.dtype))
    L = torch.linalg.cholesky(C)
    return -0.5 * (q[1:] ** 2).sum() - torch.log(torch.diagonal(L)).sum()


def test_row_that_raises_gets_infinite_energy_with_a_warning():
    q = torch.tensor([[0.5, 1.0, 0.0], [1.5, 0.3, -0.2], [-0.2, 0.0, 1.1]], dtype=DTYPE)
    potential = hmc.Potential(raises_for_large_q0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        U, grad = potential.value_and_grad(q)
    assert any("raised" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert U[1] == torch.inf and torch.equal(grad[1], torch.zeros(3, dtype=DTYPE))
    U_ref, g_ref = reference(raises_for_large_q0, q[[0, 2]])
    torch.testing.assert_close(U[[0, 2]], U_ref, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(grad[[0, 2]], g_ref, rtol=1e-14, atol=1e-14)
    # a single raising position, and a Python exception under the vmap fallback
    U1, g1 = potential.value_and_grad(q[1])
    assert torch.inf == U1 and torch.equal(g1, torch.zeros(3, dtype=DTYPE))

    def python_raise(x):
        if x[0] > 1:
            raise ValueError("outside the support")
        return -0.5 * (x**2).sum()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        U, grad = hmc.Potential(python_raise).value_and_grad(q)
    assert any("raised" in str(w.message) for w in caught)
    assert U[1] == torch.inf and torch.isfinite(U[[0, 2]]).all()
    torch.testing.assert_close(grad[[0, 2]], q[[0, 2]], rtol=0, atol=0)


def test_distributions_with_validation_do_not_raise_inside():
    """A scale that underflows to 0 would fail argument validation; here it is U = +inf."""
    torch.distributions.Distribution.set_default_validate_args(True)

    def log_prob(q):
        return torch.distributions.Normal(0.0, torch.exp(q[..., 1])).log_prob(q[..., 0])

    with pytest.raises(ValueError):  # what happens outside the energy module
        log_prob(torch.tensor([0.5, -800.0], dtype=DTYPE))
    q = torch.tensor([[0.5, 0.1], [0.5, -800.0], [-1.0, 0.3]], dtype=DTYPE)
    for potential in (hmc.Potential(log_prob), hmc.Potential(log_prob, batched=True)):
        U, grad = potential.value_and_grad(q)
        assert U[1] == torch.inf and torch.equal(grad[1], torch.zeros(2, dtype=DTYPE))
        assert torch.isfinite(U[[0, 2]]).all()
        U1, _ = potential.value_and_grad(q[1])
        assert torch.inf == U1
    U_ref, g_ref = reference(log_prob, q[[0, 2]])
    torch.testing.assert_close(U[[0, 2]], U_ref, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(grad[[0, 2]], g_ref, rtol=1e-14, atol=1e-14)
    # the user's setting is restored afterwards, whichever it was
    assert validation_enabled() is True
    for setting in (True, False):
        torch.distributions.Distribution.set_default_validate_args(setting)
        hmc.Potential(log_prob).value_and_grad(q[1:2].numpy().copy())
        hmc.sample(log_prob, q[0], chains=1, warmup=0, step_size=0.1, draws=2, progress=False)
        assert validation_enabled() is setting


# ---------------------------------------------------------------------- NumPy entry point
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_numpy_entry_point_gives_the_tensor_results(batched, dtype):
    """value_and_grad on NumPy arrays gives its results on tensors: the same bits on one row
    (its own shortcut) and on a batch, in the input's dtype, counted the same."""
    potential = hmc.Potential(smooth, batched=batched)
    q = Q.to(dtype)
    for rows in (q[:1], q):
        U, grad = potential.value_and_grad(rows)
        before = potential.evaluations
        U_np, grad_np = potential.value_and_grad(rows.numpy().copy())
        assert isinstance(U_np, np.ndarray) and isinstance(grad_np, np.ndarray)
        assert U_np.shape == U.shape and grad_np.shape == grad.shape
        assert U_np.dtype == grad_np.dtype == rows.numpy().dtype
        assert np.array_equal(U_np, U.numpy()) and np.array_equal(grad_np, grad.numpy())
        assert potential.evaluations == before + rows.shape[0]


def test_numpy_entry_point_keeps_the_non_finite_contract():
    """Non-finite values or gradients, and a raising density, give U = +inf and a zero
    gradient on the one-row shortcut too (with one warning for the raise)."""

    def log_prob(q):
        if q[0] > 10:
            raise ValueError("outside the support")
        return torch.where(q[0] > 1, torch.nan, -0.5 * (q**2).sum()) - torch.sqrt(q[1] + 1)

    potential = hmc.Potential(log_prob)
    for row in ([2.0, 0.0], [0.0, -1.0], [11.0, 0.0]):  # NaN value, infinite gradient, raise
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            U, grad = potential.value_and_grad(np.array([row]))
        assert U.tolist() == [math.inf] and grad.tolist() == [[0.0, 0.0]], row
        assert (row[0] > 10) == any("raised" in str(w.message) for w in caught)
    U, grad = potential.value_and_grad(np.array([[0.5, 0.0]]))
    assert U.tolist() == [0.125 + 1.0] and grad.tolist() == [[0.5, 0.5]]
    assert potential.evaluations == 4
    # a linear density, whose gradient autograd makes as an expanded view
    U, grad = hmc.Potential(lambda q: q.sum()).value_and_grad(np.array([[1.0, 2.0, 3.0]]))
    assert U.tolist() == [-6.0] and grad.tolist() == [[-1.0, -1.0, -1.0]]

    # a batched density: its non-finite rows, and a batch that raises (then row by row)
    def batched(q):
        if (q[:, 0] > 10).any():
            raise ValueError("outside the support")
        value = torch.where(q[:, 0] > 1, torch.nan, -0.5 * (q**2).sum(-1))
        return value - torch.sqrt(q[:, 1] + 1)

    potential = hmc.Potential(batched, batched=True)
    U, grad = potential.value_and_grad(np.array([[2.0, 0.0], [0.0, -1.0], [0.5, 0.0]]))
    assert U.tolist() == [math.inf, math.inf, 1.125]
    assert grad.tolist() == [[0.0, 0.0], [0.0, 0.0], [0.5, 0.5]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        U, grad = potential.value_and_grad(np.array([[11.0, 0.0], [0.5, 0.0]]))
    assert U.tolist() == [math.inf, 1.125] and grad.tolist() == [[0.0, 0.0], [0.5, 0.5]]
    assert any("raised" in str(w.message) for w in caught)
    assert potential.evaluations == 5
    cached = hmc.Potential(smooth, cache=True)  # a cached density goes through the cache
    cached.value_and_grad(Q.numpy().copy())
    cached.value_and_grad(Q.numpy().copy())
    assert cached.evaluations == 4 and cached.cache.hits == 4


@pytest.mark.parametrize(
    ("log_prob", "batched", "dim"),
    [
        (lambda q: q.sum(), False, 3),  # the gradient is a view: ones, expanded
        (lambda q: q.squeeze(), False, 1),  # ... or a reshaped one
        (lambda q: q.sum(-1), True, 3),
        (lambda q: q.squeeze(-1), True, 1),
    ],
)
def test_gradients_own_their_memory(log_prob, batched, dim):
    """A density whose gradient autograd returns as a view (a linear one) still gives
    gradients that own their memory: the integrators write rows of a
    gradient in place, which must not change the next evaluation (nor the previous)."""
    potential = hmc.Potential(log_prob, batched=batched)
    for rows in (1, 3):
        q = torch.arange(rows * dim, dtype=DTYPE).reshape(rows, dim)
        for _ in range(2):
            _, grad = potential.value_and_grad(q)
            _, grad_np = potential.value_and_grad(q.numpy().copy())
            assert grad.tolist() == grad_np.tolist() == [[-1.0] * dim] * rows
            grad[0] = 7.0  # what a ragged integrator does to the rows that moved
            grad_np[-1] = 7.0
    inf = q.clone()
    inf[1, 0] = torch.inf  # a non-finite row is zeroed in a copy too
    U, grad_np = potential.value_and_grad(inf.numpy())
    assert U[1] == math.inf and grad_np.tolist() == [[-1.0] * dim, [0.0] * dim, [-1.0] * dim]
    _, grad = potential.value_and_grad(q)
    assert grad.tolist() == [[-1.0] * dim] * 3


# ---------------------------------------------------------------------- counting
def test_evaluations_count_rows_and_cache_hits_are_free():
    potential = hmc.Potential(smooth)
    potential.value_and_grad(Q)
    potential.value_and_grad(Q[0])
    assert potential.evaluations == 5
    cache = hmc.MemoCache()
    cached = hmc.Potential(smooth, cache=cache)
    U1, g1 = cached.value_and_grad(Q)
    U2, g2 = cached.value_and_grad(Q)
    assert cached.evaluations == 4 and cache.hits == 4 and cache.misses == 4
    assert torch.equal(U1, U2) and torch.equal(g1, g2)
    # a batch that is half new computes only the new rows
    mixed = torch.cat((Q[:2], Q[:2] + 1.0))
    U3, g3 = cached.value_and_grad(mixed)
    assert cached.evaluations == 6 and cache.hits == 6
    U_ref, g_ref = reference(smooth, mixed)
    torch.testing.assert_close(U3, U_ref, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(g3, g_ref, rtol=1e-14, atol=1e-14)


def test_constructor_rejects_bad_arguments():
    with pytest.raises(TypeError, match="callable"):
        hmc.Potential(3.0)
    with pytest.raises(TypeError, match="cache"):
        hmc.Potential(smooth, cache="yes")
    assert isinstance(hmc.Potential(smooth, cache=True).cache, hmc.MemoCache)
    assert hmc.Potential(smooth, cache=False).cache is None


def clamping(q: torch.Tensor) -> torch.Tensor:
    """A density that writes into its input where autograd cannot see it."""
    with torch.no_grad():
        q.clamp_(-0.5, 0.5)
    return -0.5 * (q**2).sum(-1)


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("kind", ["tensor", "numpy", "one row"])
def test_log_prob_never_writes_into_the_callers_positions(batched, kind):
    """The positions are the chains' state: log_prob gets a copy of them."""
    q = torch.linspace(-2.0, 2.0, 6, dtype=torch.float64).reshape(3, 2)
    if kind == "one row":
        q = q[:1]
    before = q.clone()
    positions = q.numpy() if kind == "numpy" else q
    U, _ = hmc.Potential(clamping, batched=batched, compile=False).value_and_grad(positions)
    torch.testing.assert_close(q, before, rtol=0, atol=0)
    assert np.isfinite(np.asarray(U)).all()
