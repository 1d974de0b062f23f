"""Exact tests of the leapfrog integrator and of the metrics it uses.

For a quadratic potential ``U = q^T A q / 2`` and inverse metric ``Minv`` the exact flow is
linear, ``d/dt [q, p] = [[0, Minv], [-A, 0]] [q, p]``, so the exact orbit is a matrix
exponential; for the oscillator (``A = I``, ``Minv = I``) it is
``q(t) = q0 cos t + p0 sin t``, ``p(t) = p0 cos t - q0 sin t``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

import hmc
from hmc.arrays import as_arrays
from hmc.metric import DenseMetric, DiagonalMetric, dot, metric_from_inverse

DTYPE = torch.float64


def quadratic(A: torch.Tensor):
    """log density of ``U = q^T A q / 2`` for ``q`` ``(..., D)``."""

    def log_prob(q: torch.Tensor) -> torch.Tensor:
        return -0.5 * ((q @ A) * q).sum(-1)

    return log_prob


def banana(q: torch.Tensor) -> torch.Tensor:
    """A non-quadratic log density (for reversibility)."""
    x, y = q[..., 0], q[..., 1]
    return -0.5 * x**2 / 4 - 0.5 * (y - 0.5 * x**2) ** 2 - 0.1 * torch.cosh(0.3 * x)


def start(potential: hmc.Potential, q: torch.Tensor) -> hmc.State:
    U, grad = potential.value_and_grad(q)
    return hmc.State(q, U, grad)


def integrate(state, p, eps, metric, potential, n):
    step = torch.as_tensor(eps, dtype=DTYPE).reshape(-1, 1).expand(state.position.shape[0], 1)
    for _ in range(n):
        state, p = hmc.leapfrog(state, p, step, metric, potential)
    return state, p


def identity_metric(chains: int, dim: int):
    return metric_from_inverse(torch.ones(chains, dim, dtype=DTYPE))


METRICS = {
    "identity": lambda: torch.ones(3, 2, dtype=DTYPE),
    "diag": lambda: torch.tensor([[0.5, 2.0], [1.0, 3.0], [0.25, 0.7]], dtype=DTYPE),
    "dense": lambda: torch.tensor([[2.0, 0.6], [0.6, 0.5]], dtype=DTYPE).expand(3, 2, 2).clone(),
}
Q0 = torch.tensor([[1.0, 0.0], [0.3, -0.7], [-1.2, 0.4]], dtype=DTYPE)
P0 = torch.tensor([[0.0, 1.0], [0.8, 0.2], [0.5, -1.5]], dtype=DTYPE)
A_MATRIX = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=DTYPE)


def exact_flow(q0, p0, inverse, A, t):
    """Exact ``(q(t), p(t))`` of ``H = q^T A q / 2 + p^T Minv p / 2`` per chain."""
    chains, dim = q0.shape
    out_q, out_p = [], []
    for c in range(chains):
        Minv = torch.diag(inverse[c]) if inverse.dim() == 2 else inverse[c]
        G = torch.zeros(2 * dim, 2 * dim, dtype=DTYPE)
        G[:dim, dim:] = Minv
        G[dim:, :dim] = -A
        z = torch.linalg.matrix_exp(t * G) @ torch.cat((q0[c], p0[c]))
        out_q.append(z[:dim])
        out_p.append(z[dim:])
    return torch.stack(out_q), torch.stack(out_p)


# ---------------------------------------------------------------------- oscillator
def test_one_step_matches_the_velocity_verlet_formula():
    potential = hmc.Potential(quadratic(A_MATRIX))
    eps = 0.3
    state, p = integrate(start(potential, Q0), P0, eps, identity_metric(3, 2), potential, 1)
    q1 = Q0 + eps * P0 - 0.5 * eps**2 * Q0
    p1 = P0 - 0.5 * eps * (Q0 + q1)
    torch.testing.assert_close(state.position, q1, rtol=0, atol=1e-15)
    torch.testing.assert_close(p, p1, rtol=0, atol=1e-15)


def test_oscillator_orbit_is_second_order():
    """U = q^2/2, identity metric: error against q0 cos t + p0 sin t is O(eps^2)."""
    potential = hmc.Potential(quadratic(A_MATRIX))
    T = 2.0
    errors = []
    for eps in (0.1, 0.05, 0.025):
        n = round(T / eps)
        state, p = integrate(start(potential, Q0), P0, eps, identity_metric(3, 2), potential, n)
        q_exact = Q0 * math.cos(T) + P0 * math.sin(T)
        p_exact = P0 * math.cos(T) - Q0 * math.sin(T)
        error = torch.maximum(
            (state.position - q_exact).abs().max(), (p - p_exact).abs().max()
        ).item()
        assert error < 0.2 * eps**2 * T, (eps, error)  # phase error ~ T eps^2 / 24
        errors.append(error)
    ratios = [errors[0] / errors[1], errors[1] / errors[2]]
    for ratio in ratios:
        assert 3.8 < ratio < 4.2, ratios


@pytest.mark.parametrize("kind", list(METRICS))
def test_quadratic_orbit_with_metric_is_second_order(kind):
    """Exact orbit of a quadratic under identity, diagonal and dense metrics."""
    inverse = METRICS[kind]()
    metric = metric_from_inverse(inverse)
    A = torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=DTYPE)
    potential = hmc.Potential(quadratic(A))
    T = 1.5
    errors = []
    for eps in (0.05, 0.025, 0.0125):
        n = round(T / eps)
        state, p = integrate(start(potential, Q0), P0, eps, metric, potential, n)
        q_exact, p_exact = exact_flow(Q0, P0, inverse, A, T)
        errors.append(
            max((state.position - q_exact).abs().max().item(), (p - p_exact).abs().max().item())
        )
    assert errors[-1] < 1e-3
    for a, b in itertools.pairwise(errors):
        assert 3.7 < a / b < 4.3, errors


@pytest.mark.parametrize("kind", list(METRICS))
def test_energy_error_is_second_order(kind):
    inverse = METRICS[kind]()
    metric = metric_from_inverse(inverse)
    potential = hmc.Potential(banana)
    q0 = torch.tensor([[1.0, 0.2], [0.3, -0.7], [-1.2, 0.4]], dtype=DTYPE)
    T = 2.0
    worst = []
    for eps in (0.04, 0.02, 0.01):
        state, p = start(potential, q0), P0
        h0 = state.potential + metric.kinetic_energy(p)
        largest = torch.zeros(3, dtype=DTYPE)
        for _ in range(round(T / eps)):
            state, p = hmc.leapfrog(
                state, p, torch.full((3, 1), eps, dtype=DTYPE), metric, potential
            )
            h = state.potential + metric.kinetic_energy(p)
            largest = torch.maximum(largest, (h - h0).abs())
        worst.append(largest)
    assert (worst[-1] < 1e-3).all()
    for a, b in itertools.pairwise(worst):
        ratio = a / b
        assert ((ratio > 3.5) & (ratio < 4.5)).all(), ratio


# ---------------------------------------------------------------------- reversibility
@pytest.mark.parametrize("kind", list(METRICS))
@pytest.mark.parametrize("target", ["oscillator", "banana"])
def test_time_reversibility(kind, target):
    """n steps forward, flip the momentum, n steps: back to the start (to 1e-12)."""
    log_prob = quadratic(A_MATRIX) if target == "oscillator" else banana
    potential = hmc.Potential(log_prob)
    metric = metric_from_inverse(METRICS[kind]())
    s0 = start(potential, Q0)
    state, p = integrate(s0, P0, 0.1, metric, potential, 50)
    assert (state.position - Q0).abs().max() > 0.1  # it did move
    back, p_back = integrate(state, -p, 0.1, metric, potential, 50)
    torch.testing.assert_close(back.position, Q0, rtol=0, atol=1e-12)
    torch.testing.assert_close(-p_back, P0, rtol=0, atol=1e-12)
    torch.testing.assert_close(back.grad, s0.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(back.potential, s0.potential, rtol=0, atol=1e-12)


def test_negative_step_size_integrates_backward():
    potential = hmc.Potential(banana)
    metric = metric_from_inverse(METRICS["dense"]())
    state, p = integrate(start(potential, Q0), P0, 0.1, metric, potential, 20)
    back, p_back = integrate(state, p, -0.1, metric, potential, 20)
    torch.testing.assert_close(back.position, Q0, rtol=0, atol=1e-12)
    torch.testing.assert_close(p_back, P0, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------- batching, counts
def test_per_chain_step_sizes_match_single_chain_runs():
    potential = hmc.Potential(banana)
    inverse = METRICS["diag"]()
    metric = metric_from_inverse(inverse)
    eps = torch.tensor([[0.05], [0.2], [-0.1]], dtype=DTYPE)
    state, p = start(potential, Q0), P0
    for _ in range(7):
        state, p = hmc.leapfrog(state, p, eps, metric, potential)
    for c in range(3):
        single_metric = metric_from_inverse(inverse[c : c + 1])
        s, pc = start(potential, Q0[c : c + 1]), P0[c : c + 1]
        for _ in range(7):
            s, pc = hmc.leapfrog(s, pc, eps[c : c + 1], single_metric, potential)
        torch.testing.assert_close(state.position[c : c + 1], s.position, rtol=0, atol=1e-14)
        torch.testing.assert_close(p[c : c + 1], pc, rtol=0, atol=1e-14)


def test_one_gradient_per_step_and_state_carries_it():
    potential = hmc.Potential(banana)
    metric = identity_metric(3, 2)
    state = start(potential, Q0)
    assert potential.evaluations == 3
    state, _p = integrate(state, P0, 0.1, metric, potential, 11)
    assert potential.evaluations == 3 + 3 * 11
    # the state's potential and gradient are those at its position
    q = state.position.detach().requires_grad_(True)
    lp = banana(q)
    (g,) = torch.autograd.grad(lp.sum(), q)
    torch.testing.assert_close(state.potential, -lp.detach(), rtol=0, atol=1e-14)
    torch.testing.assert_close(state.grad, -g, rtol=0, atol=1e-14)
    assert not state.position.requires_grad and not state.grad.requires_grad


def test_leapfrog_uses_the_carried_gradient():
    """The first half kick must use ``state.grad``, not a recomputed gradient."""
    potential = hmc.Potential(quadratic(A_MATRIX))
    state = start(potential, Q0)
    fake = hmc.State(state.position, state.potential, torch.zeros_like(state.grad))
    new, _ = hmc.leapfrog(
        fake, P0, torch.full((3, 1), 0.5, dtype=DTYPE), identity_metric(3, 2), potential
    )
    # with a zero first kick the drift is exactly eps * p
    torch.testing.assert_close(new.position, Q0 + 0.5 * P0, rtol=0, atol=1e-15)


# ---------------------------------------------------------------------- metrics
@pytest.mark.parametrize("kind", list(METRICS))
def test_metric_momentum_kinetic_velocity_are_consistent(kind):
    inverse = METRICS[kind]()
    metric = metric_from_inverse(inverse)
    assert isinstance(metric, DenseMetric if kind == "dense" else DiagonalMetric)
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(3, 2, generator=gen, dtype=DTYPE)
    p = metric.momentum(z)
    # p ~ N(0, M) with M = inverse^-1 exactly when K(p) = |z|^2 / 2 and p = M L z-ish:
    torch.testing.assert_close(metric.kinetic_energy(p), 0.5 * (z**2).sum(-1), rtol=1e-13, atol=0)
    Minv = torch.diag_embed(inverse) if inverse.dim() == 2 else inverse
    torch.testing.assert_close(
        metric.velocity(p), (Minv @ p.unsqueeze(-1)).squeeze(-1), rtol=1e-14, atol=1e-15
    )
    torch.testing.assert_close(
        metric.kinetic_energy(p), 0.5 * (p.unsqueeze(-2) @ Minv @ p.unsqueeze(-1)).flatten()
    )


@pytest.mark.parametrize("kind", ["diag", "dense"])
def test_momentum_covariance_is_the_mass_matrix(kind):
    """The linear map noise -> momentum has covariance M = Minv^-1 exactly."""
    inverse = METRICS[kind]()
    metric = metric_from_inverse(inverse)
    eye = torch.eye(2, dtype=DTYPE)
    for c in range(3):
        single = metric_from_inverse(inverse[c : c + 1].expand(2, *inverse.shape[1:]))
        B = single.momentum(eye).T  # columns: images of the unit vectors
        Minv = torch.diag(inverse[c]) if kind == "diag" else inverse[c]
        torch.testing.assert_close(B @ B.T, torch.linalg.inv(Minv), rtol=1e-12, atol=1e-12)
    assert metric.inverse is inverse


@pytest.mark.parametrize("kind", ["diag", "dense"])
@pytest.mark.parametrize("shared_step", [False, True])
def test_leapfrog_on_numpy_arrays_is_the_leapfrog_on_tensors(kind, shared_step):
    """The one leapfrog on the NumPy engine's arrays (one float step size or one per
    chain) agrees with it on tensors to the last bits over 50 steps."""
    metric = metric_from_inverse(METRICS[kind]())
    potential = hmc.Potential(banana)
    step = (
        torch.full((3, 1), 0.1, dtype=DTYPE)
        if shared_step
        else torch.tensor([[0.1], [0.05], [0.2]], dtype=DTYPE)
    )
    state, p = start(potential, Q0), P0
    host, p_np = as_arrays(state), P0.numpy()
    step_np = 0.1 if shared_step else step.numpy()
    for _ in range(50):
        state, p = hmc.leapfrog(state, p, step, metric, potential)
        host, p_np = hmc.leapfrog(host, p_np, step_np, as_arrays(metric), potential)
    assert isinstance(host.position, np.ndarray) and isinstance(p_np, np.ndarray)
    q, U, g = host
    for a, b in ((q, state.position), (U, state.potential), (g, state.grad), (p_np, p)):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-12, atol=1e-13)
    assert potential.evaluations == 3 + 2 * 3 * 50


@pytest.mark.parametrize("kind", ["identity", "diag", "dense"])
def test_numpy_metric_is_the_tensor_metric(kind):
    metric = metric_from_inverse(METRICS[kind]())
    host = as_arrays(metric)
    noise = torch.randn(3, 2, dtype=DTYPE)
    momentum = metric.momentum(noise)
    assert np.array_equal(host.momentum(noise.numpy()), momentum.numpy())  # the same solve
    for method in ("velocity", "kinetic_energy"):
        expected = getattr(metric, method)(momentum).numpy()
        np.testing.assert_allclose(getattr(host, method)(momentum.numpy()), expected, rtol=1e-14)


@pytest.mark.parametrize("dim", [1, 2, 32, 33, 100])
def test_dot_is_the_summed_product(dim):
    """Both CPU contractions (short and long rows), with broadcasting, in float64 and
    float32, against the plain sum; NumPy arrays take the plain sum."""
    gen = torch.Generator().manual_seed(dim)
    for dtype in (torch.float64, torch.float32):
        a = torch.randn(3, 5, 4, dim, generator=gen, dtype=dtype)
        b = torch.randn(5, 1, dim, generator=gen, dtype=dtype).expand(5, 4, dim)
        expected = (a * b).sum(-1)
        got = dot(a, b)
        assert got.shape == (3, 5, 4) and got.dtype == dtype
        torch.testing.assert_close(got, expected)
        assert np.array_equal(dot(a.numpy(), b.numpy()), (a.numpy() * b.numpy()).sum(-1))
