"""Gradient reuse through a shared inner function: exactness against separate backward
passes, one forward and one backward through the inner function, and clear errors."""

from __future__ import annotations

import doctest
import warnings

import pytest
import torch

import hmc.autodiff
from hmc.autodiff import shared_inner_grads, tempered_value_and_grad

DTYPE = torch.float64


class CountBackward(torch.autograd.Function):
    """Identity whose backward counts its calls (a vmapped call counts once)."""

    generate_vmap_rule = True
    calls = 0

    @staticmethod
    def forward(y: torch.Tensor) -> torch.Tensor:
        return y.clone()

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        pass

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        CountBackward.calls += 1
        return grad


class NotVmappable(torch.autograd.Function):
    """Identity whose backward branches on a value, which vmap cannot batch."""

    @staticmethod
    def forward(ctx, y: torch.Tensor) -> torch.Tensor:
        return y.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad if bool(grad.abs().sum() >= 0) else -grad


def _square(x: torch.Tensor) -> torch.Tensor:
    """A square matrix built from every element of x (shape (), (3,) or (2, 3))."""
    v = x.reshape(-1)
    n = max(v.numel(), 2)
    base = torch.arange(n * n, dtype=x.dtype).reshape(n, n) / (n * n)
    return 0.3 * torch.sin(base + v.sum()) + 0.2 * torch.diag(torch.cat([v, v])[:n])


INNER = {
    "scalar": lambda x: torch.real(torch.trace(torch.linalg.matrix_exp(1j * _square(x)))),
    "pair": lambda x: torch.stack([torch.sin(x).sum(), (x**3).sum()]),
    "vector": lambda x: torch.cumsum(torch.sin(x.reshape(-1)) * torch.arange(1, 1 + x.numel()), 0),
    "matrix": lambda x: torch.linalg.matrix_exp(_square(x)),
    "complex": lambda x: torch.linalg.matrix_exp(1j * _square(x)),
}

OUTER = [
    lambda y: torch.sin(torch.real(y).sum()),
    lambda y: (torch.abs(y) ** 2).sum(),
    lambda y: 3.0 * torch.real(y).reshape(-1)[0],
    lambda y: torch.real(y**3).mean(),
    lambda y: torch.cos(2.0 * torch.real(y)).sum() * torch.abs(y).sum(),
]


def separate(f, outer, x):
    """Reference: one forward and one backward per outer function."""
    values, grads = [], []
    for g in outer:
        x_ = x.detach().requires_grad_(True)
        z = g(f(x_))
        (grad,) = torch.autograd.grad(z, x_)
        values.append(z.detach())
        grads.append(grad)
    return values, grads


def assert_equal_rel(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert a.shape == e.shape and a.dtype == e.dtype
        scale = float(e.abs().max()) if e.numel() else 0.0
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10 * max(scale, 1e-300))


@pytest.mark.parametrize("inner", sorted(INNER))
@pytest.mark.parametrize("shape", [(), (3,), (2, 3)])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_matches_separate_backward_passes(inner, shape, k):
    f, outer = INNER[inner], OUTER[:k]
    x = torch.linspace(-0.7, 0.9, max(1, torch.Size(shape).numel()), dtype=DTYPE).reshape(shape)
    values, grads = shared_inner_grads(f, outer, x)
    expected_values, expected_grads = separate(f, outer, x)
    assert_equal_rel(values, expected_values)
    assert_equal_rel(grads, expected_grads)
    assert all(v.dim() == 0 and not v.requires_grad for v in values)
    assert all(g.shape == x.shape and not g.requires_grad for g in grads)


def counted(f):
    """``f`` with its forward calls counted and its output routed through CountBackward."""
    calls = {"forward": 0}

    def wrapped(x):
        calls["forward"] += 1
        return CountBackward.apply(f(x))

    return wrapped, calls


@pytest.mark.parametrize("inner", ["scalar", "vector", "matrix", "complex"])
def test_one_forward_and_one_backward_through_f(inner):
    f, calls = counted(INNER[inner])
    x = torch.tensor([0.2, -0.4, 0.5], dtype=DTYPE)
    CountBackward.calls = 0
    shared_inner_grads(f, OUTER, x)
    assert calls["forward"] == 1
    assert CountBackward.calls == 1
    CountBackward.calls = 0
    separate(f, OUTER, x)
    assert calls["forward"] == 1 + len(OUTER)
    assert CountBackward.calls == len(OUTER)


def test_scalar_inner_function_is_not_batched_under_vmap(monkeypatch):
    """A 0-d f(x) gets one ordinary backward, never k cotangents under vmap."""
    seen = []
    grad = torch.autograd.grad

    def recording_grad(*args, **kwargs):
        seen.append(kwargs.get("is_grads_batched", False))
        return grad(*args, **kwargs)

    monkeypatch.setattr(torch.autograd, "grad", recording_grad)
    x = torch.tensor(0.3, dtype=DTYPE)
    _, grads = shared_inner_grads(INNER["scalar"], OUTER[:4], x)
    assert seen == [False] * 5  # four cheap outer backwards and one through f
    monkeypatch.undo()
    assert_equal_rel(grads, separate(INNER["scalar"], OUTER[:4], x)[1])


def test_fallback_without_vmap_support_warns_and_is_exact():
    def f(x):
        return NotVmappable.apply(torch.outer(x, x).sin())

    x = torch.tensor([0.2, -0.4, 0.5], dtype=DTYPE)
    with pytest.warns(RuntimeWarning, match="recomputing f for each of the 3 cotangents"):
        values, grads = shared_inner_grads(f, OUTER[:3], x)
    expected_values, expected_grads = separate(f, OUTER[:3], x)
    assert_equal_rel(values, expected_values)
    assert_equal_rel(grads, expected_grads)


def test_unused_input_and_unused_inner_output_give_zero_gradients():
    weight = torch.tensor(2.0, dtype=DTYPE, requires_grad=True)
    x = torch.tensor([1.0, 2.0], dtype=DTYPE)
    # f depends on a parameter it closes over, not on x
    _, grads = shared_inner_grads(lambda x: weight * torch.ones(3, dtype=DTYPE), OUTER[:2], x)
    assert all(torch.equal(g, torch.zeros_like(x)) for g in grads)
    # the second outer function ignores y
    values, grads = shared_inner_grads(torch.sin, [lambda y: y.sum(), lambda y: weight * 1.0], x)
    torch.testing.assert_close(grads[0], torch.cos(x))
    assert torch.equal(grads[1], torch.zeros_like(x)) and float(values[1]) == 2.0


def test_runs_under_no_grad_and_leaves_x_alone():
    x = torch.tensor([0.1, 0.2], dtype=DTYPE, requires_grad=True)
    with torch.no_grad():
        _, grads = shared_inner_grads(torch.exp, [lambda y: y.sum()], x)
    torch.testing.assert_close(grads[0], torch.exp(x.detach()))
    assert x.grad is None


@pytest.mark.parametrize(
    ("f", "outer", "error", "match"),
    [
        (None, [torch.sum], TypeError, "f must be callable"),
        (torch.sin, torch.sum, TypeError, "outer must be a sequence"),
        (torch.sin, [torch.sum, 3], TypeError, r"outer\[1\] must be callable"),
        (torch.sin, [], ValueError, "at least one"),
        (torch.sin, [torch.sum, lambda y: y], ValueError, r"outer\[1\] returned .* shape \(3,\)"),
        (torch.sin, [lambda y: 1.0], TypeError, r"outer\[0\] must return a torch.Tensor"),
        (torch.sin, [lambda y: (1j * y).sum()], ValueError, "real floating-point"),
        (torch.sin, [lambda y: y.sum().detach()], ValueError, "no gradient path"),
        (lambda x: x.detach(), [torch.sum], ValueError, "f's output has no gradient path"),
        (lambda x: 1.0, [torch.sum], TypeError, "f must return a torch.Tensor"),
    ],
)
def test_clear_errors(f, outer, error, match):
    with pytest.raises(error, match=match):
        shared_inner_grads(f, outer, torch.ones(3, dtype=DTYPE))


def test_integer_x_is_rejected():
    with pytest.raises(TypeError, match="floating-point or complex"):
        shared_inner_grads(torch.sin, [torch.sum], torch.ones(3, dtype=torch.int64))


@pytest.mark.parametrize("shape", [(), (4,), (2, 2)])
def test_tempered_value_and_grad(shape):
    calls = {"forward": 0}

    def potential(q):
        calls["forward"] += 1
        return 0.5 * (q**2).sum() + torch.sin(q).prod()

    x = torch.linspace(-1.0, 1.5, max(1, torch.Size(shape).numel()), dtype=DTYPE).reshape(shape)
    betas = [1.0, 0.5, 0.25]
    values, grads = tempered_value_and_grad(potential, betas, x)
    assert calls["forward"] == 1
    assert values.shape == (3,) and grads.shape == (3, *shape)
    expected_values, expected_grads = separate(potential, [lambda u, b=b: b * u for b in betas], x)
    assert_equal_rel(list(values), expected_values)
    assert_equal_rel(list(grads), expected_grads)


def test_tempered_errors():
    x = torch.ones(2, dtype=DTYPE)
    with pytest.raises(ValueError, match="one-dimensional"):
        tempered_value_and_grad(lambda q: q.sum(), [[1.0]], x)
    with pytest.raises(ValueError, match="0-d"):
        tempered_value_and_grad(lambda q: q, [1.0], x)
    with pytest.raises(TypeError, match="callable"):
        tempered_value_and_grad("U", [1.0], x)


def test_no_warning_on_the_batched_path():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shared_inner_grads(INNER["matrix"], OUTER, torch.ones(3, dtype=DTYPE))


def test_docstring_examples():
    results = doctest.testmod(hmc.autodiff, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert results.attempted > 0 and results.failed == 0
