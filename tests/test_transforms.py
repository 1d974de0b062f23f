"""The bijections of hmc.parameters: round trips, supports, shapes, and log-det-Jacobians
checked against ``torch.autograd.functional.jacobian`` of the flattening map."""

from __future__ import annotations

import pytest
import torch
from torch.distributions import constraints

from hmc.parameters import ordered_vector, param_transform, positive_ordered_vector


def _lower(x: torch.Tensor, offset: int = 0) -> torch.Tensor:
    n = x.shape[-1]
    rows, cols = torch.tril_indices(n, n, offset)
    return x[..., rows, cols].reshape(-1)


# (constraint, shape, the free coordinates of a constrained value as a flat vector)
CASES = [
    (constraints.real, (), lambda x: x.reshape(-1)),
    (constraints.real, (2, 3), lambda x: x.reshape(-1)),
    (constraints.real_vector, (4,), lambda x: x.reshape(-1)),
    (constraints.positive, (), lambda x: x.reshape(-1)),
    (constraints.positive, (3,), lambda x: x.reshape(-1)),
    (constraints.greater_than(-2.0), (3,), lambda x: x.reshape(-1)),
    (constraints.less_than(1.5), (2,), lambda x: x.reshape(-1)),
    (constraints.unit_interval, (3,), lambda x: x.reshape(-1)),
    (constraints.interval(-1.0, 4.0), (2, 2), lambda x: x.reshape(-1)),
    (constraints.simplex, (4,), lambda x: x[..., :-1].reshape(-1)),
    (constraints.simplex, (2, 3), lambda x: x[..., :-1].reshape(-1)),
    (ordered_vector, (4,), lambda x: x.reshape(-1)),
    (ordered_vector, (2, 3), lambda x: x.reshape(-1)),
    (positive_ordered_vector, (3,), lambda x: x.reshape(-1)),
    (constraints.lower_cholesky, (3, 3), _lower),
    (constraints.lower_cholesky, (2, 2, 2), _lower),
    (constraints.corr_cholesky, (3, 3), lambda x: _lower(x, -1)),
    (constraints.corr_cholesky, (4, 4), lambda x: _lower(x, -1)),
    (constraints.positive_definite, (3, 3), _lower),
]
IDS = [f"{c}-{s}" for c, s, _ in CASES]


def _point(transform, seed: int, batch: tuple[int, ...] = ()) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*batch, transform.size, generator=generator, dtype=torch.float64)


@pytest.mark.parametrize(("constraint", "shape", "free"), CASES, ids=IDS)
def test_round_trip_and_support(constraint, shape, free):
    t = param_transform(constraint, shape)
    u = _point(t, 0, batch=(5,))
    x, ladj = t.forward(u)
    assert x.shape == (5, *shape) and ladj.shape == (5,)
    assert x.dtype == torch.float64
    assert bool(constraint.check(x).all())
    torch.testing.assert_close(t.inverse(x), u, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(("constraint", "shape", "free"), CASES, ids=IDS)
def test_log_det_jacobian_matches_autograd(constraint, shape, free):
    t = param_transform(constraint, shape)
    for seed in range(3):
        u = 0.7 * _point(t, seed)
        jac = torch.autograd.functional.jacobian(lambda v: free(t.forward(v)[0]), u)
        assert jac.shape == (t.size, t.size), "the free coordinates must match the size"
        expected = torch.linalg.slogdet(jac).logabsdet
        torch.testing.assert_close(t.forward(u)[1], expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(("constraint", "shape", "free"), CASES, ids=IDS)
def test_batched_forward_equals_rows_and_vmap(constraint, shape, free):
    t = param_transform(constraint, shape)
    u = _point(t, 1, batch=(3,))
    x, ladj = t.forward(u)
    for i in range(3):
        xi, li = t.forward(u[i])
        torch.testing.assert_close(x[i], xi)
        torch.testing.assert_close(ladj[i], li)
    xv, lv = torch.func.vmap(t.forward)(u)
    torch.testing.assert_close(xv, x)
    torch.testing.assert_close(lv, ladj)


@pytest.mark.parametrize(("constraint", "shape", "free"), CASES, ids=IDS)
def test_float32_stays_float32(constraint, shape, free):
    t = param_transform(constraint, shape)
    x, ladj = t.forward(_point(t, 2).float())
    assert x.dtype == torch.float32 and ladj.dtype == torch.float32
    assert torch.isfinite(x).all() and torch.isfinite(ladj)


def test_sizes():
    assert param_transform(constraints.simplex, (4,)).size == 3
    assert param_transform(constraints.lower_cholesky, (3, 3)).size == 6
    assert param_transform(constraints.corr_cholesky, (3, 3)).size == 3
    assert param_transform(constraints.positive_definite, (2, 3, 3)).size == 12
    assert param_transform(constraints.positive, (2, 5)).unconstrained_shape == (2, 5)
    assert param_transform(constraints.real, 7).shape == (7,)


def test_ordered_transforms_match_stan():
    """mu[1] = v1, mu[2] = v1 + exp(v2); positive: mu[1] = exp(v1), mu[2] = mu[1] + exp(v2)."""
    v = torch.tensor([0.3, -0.4], dtype=torch.float64)
    x, ladj = param_transform(ordered_vector, (2,)).forward(v)
    torch.testing.assert_close(x, torch.stack((v[0], v[0] + v[1].exp())))
    torch.testing.assert_close(ladj, v[1])
    x, ladj = param_transform(positive_ordered_vector, (2,)).forward(v)
    torch.testing.assert_close(x, torch.stack((v[0].exp(), v[0].exp() + v[1].exp())))
    torch.testing.assert_close(ladj, v.sum())


@pytest.mark.parametrize(
    ("constraint", "shape", "message"),
    [
        (constraints.nonnegative_integer, (), "discrete"),
        (constraints.simplex, (), "at least 1 dimension"),
        (constraints.lower_cholesky, (2, 3), "square"),
        (constraints.symmetric, (2, 2), "biject_to cannot handle"),
    ],
)
def test_unsupported_constraints(constraint, shape, message):
    with pytest.raises(ValueError, match=message):
        param_transform(constraint, shape)


def test_not_a_constraint():
    with pytest.raises(TypeError, match="constraints object"):
        param_transform("positive", ())
