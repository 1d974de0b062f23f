"""Gradient reuse through an expensive shared inner function.

For ``z_i = g_i(f(x))``, ``i = 1 .. k``, with an expensive inner function ``f`` and cheap
outer functions ``g_i``, :func:`shared_inner_grads` returns every ``z_i`` and ``dz_i/dx``
from ONE forward pass through ``f`` and one backward pass through it:

1. ``y = f(x)`` once, with ``x`` a fresh leaf that requires grad;
2. ``y`` is detached into a leaf ``y_``; each ``z_i = g_i(y_)`` and its cotangent
   ``c_i = dz_i/dy_`` cost one backward through ``g_i`` only;
3. the ``k`` cotangents go back through ``f`` together: ``dz_i/dx = J_f(x)^T c_i``.

How step 3 runs depends on ``m``, the number of elements of ``y``:

- ``m < k`` and ``y`` real (a scalar ``y`` above all): the ``m`` rows of the Jacobian
  ``dy/dx`` are computed (one ordinary backward when ``m = 1``) and contracted with the
  cotangents, ``dz_i/dx = sum_j c_ij dy_j/dx``. Batching ``k`` cotangents through a scalar
  ``y`` with ``is_grads_batched=True`` would run the backward ``k`` times under vmap
  (measured: 4.6 times one backward for ``k = 4`` through ``matrix_exp``).
- otherwise: one batched vector-Jacobian product,
  ``torch.autograd.grad(y, x, grad_outputs=torch.stack(cotangents), is_grads_batched=True)``
  (an ordinary backward when ``k = 1``). A tensor-valued ``f`` needs ``k`` independent
  vector-Jacobian products whatever one does; batching them under vmap runs one pass of
  the autograd graph with ``k``-wide tensors instead of ``k`` forward and backward passes.

Fallback: when an operation in ``f`` has no vmap support, ``is_grads_batched`` raises, and
by then the backward has already freed part of ``f``'s graph. The package never uses
``retain_graph=True`` (no graph outlives the call that built it), so the fallback recomputes
``f`` once per cotangent and runs one ordinary backward on each: correct, slower (``1 + n``
forward and ``n`` backward passes for ``n`` cotangents), announced by a
``RuntimeWarning``. ``f`` must therefore be a deterministic function of ``x``.

No ``.backward()``, ``.data``, ``retain_graph`` or ``create_graph``: every graph is used by
exactly one ``torch.autograd.grad`` call, and all returned tensors are detached.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import torch

__all__ = ["shared_inner_grads", "tempered_value_and_grad"]

TensorFn = Callable[[torch.Tensor], torch.Tensor]


def shared_inner_grads(
    f: TensorFn, outer: Sequence[TensorFn], x: torch.Tensor
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Values and gradients of ``g_i(f(x))`` with one forward and one backward through ``f``.

    Parameters
    ----------
    f : callable
        The expensive inner function, ``x -> y``; ``y`` may have any shape and a real or
        complex dtype. It must be deterministic (see the module notes on the fallback).
    outer : sequence of callables
        ``k >= 1`` outer functions ``g_i``, each ``y -> z_i`` with ``z_i`` a real 0-d tensor.
    x : torch.Tensor
        The point, any shape ``S``, floating point or complex. It is treated as a leaf:
        nothing is connected to a graph it may belong to.

    Returns
    -------
    values : list of torch.Tensor
        ``k`` detached 0-d tensors ``z_i = g_i(f(x))``.
    grads : list of torch.Tensor
        ``k`` detached tensors of shape ``S``, ``dz_i/dx`` (zeros where ``z_i`` does not
        depend on ``x``).

    Raises
    ------
    TypeError
        If ``f`` or an outer function is not callable, ``outer`` is not a sequence, ``x`` is
        not a floating-point or complex tensor, or a function returns something other than
        a tensor.
    ValueError
        If ``outer`` is empty, an outer function does not return a real 0-d tensor, or an
        output has no gradient path to its input.

    Examples
    --------
    >>> import torch
    >>> from hmc.autodiff import shared_inner_grads
    >>> def f(x):  # expensive: (3,) -> (3, 3)
    ...     return torch.linalg.matrix_exp(torch.diag(x))
    >>> outer = [lambda y: torch.trace(y), lambda y: (y**2).sum()]
    >>> values, grads = shared_inner_grads(f, outer, torch.zeros(3, dtype=torch.float64))
    >>> [float(v) for v in values]
    [3.0, 3.0]
    >>> grads[0]
    tensor([1., 1., 1.], dtype=torch.float64)
    """
    if not callable(f):
        raise TypeError(f"f must be callable, got {type(f).__name__}")
    if callable(outer) or not isinstance(outer, Sequence):
        raise TypeError(
            f"outer must be a sequence of callables (e.g. [g1, g2]), got {type(outer).__name__}"
        )
    if len(outer) == 0:
        raise ValueError("outer must contain at least one function")
    for i, g in enumerate(outer):
        if not callable(g):
            raise TypeError(f"outer[{i}] must be callable, got {type(g).__name__}")

    x_, y = _forward(f, x, "f")
    y_ = y.detach().requires_grad_(True)
    values, cotangents = [], []
    with torch.enable_grad():
        for i, g in enumerate(outer):
            z = _check_scalar(g(y_), f"outer[{i}]")
            (c,) = torch.autograd.grad(z, y_, allow_unused=True)
            values.append(z.detach())
            cotangents.append(torch.zeros_like(y_) if c is None else c)
    k, m = len(outer), y.numel()
    if m < k and not y.is_complex():
        # Rows of the Jacobian dy/dx, then dz_i/dx = sum_j c_ij dy_j/dx.
        basis = torch.eye(m, dtype=y.dtype, device=y.device).reshape(m, *y.shape)
        jacobian = _vjps(f, x_, y, basis).reshape(m, -1)
        weights = torch.stack(cotangents).reshape(k, m).to(jacobian.dtype)
        stacked = (weights @ jacobian).reshape(k, *x.shape)
    else:
        stacked = _vjps(f, x_, y, torch.stack(cotangents))
    return values, list(stacked.unbind(0))


def tempered_value_and_grad(
    potential_fn: TensorFn, betas: torch.Tensor | Sequence[float], x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tempered energies ``beta_b * U(x)`` and their gradients at one position.

    ``U`` is evaluated and differentiated once; every ``beta`` reuses its gradient (the
    ladder of a parallel-tempering or annealing scheme evaluated at one point).

    Parameters
    ----------
    potential_fn : callable
        ``U``: ``x`` of shape ``S`` -> a real 0-d tensor.
    betas : ``(B,)`` tensor or sequence of floats
        Inverse temperatures.
    x : torch.Tensor
        The position, shape ``S``.

    Returns
    -------
    values : ``(B,)`` tensor, ``beta_b * U(x)``.
    grads : ``(B, *S)`` tensor, ``beta_b * dU/dx``.

    Examples
    --------
    >>> import torch
    >>> from hmc.autodiff import tempered_value_and_grad
    >>> values, grads = tempered_value_and_grad(
    ...     lambda q: 0.5 * (q**2).sum(), [1.0, 0.5], torch.tensor([2.0, 0.0])
    ... )
    >>> values
    tensor([2., 1.])
    >>> grads
    tensor([[2., 0.],
            [1., 0.]])
    """
    if not callable(potential_fn):
        raise TypeError(f"potential_fn must be callable, got {type(potential_fn).__name__}")
    x_, u = _forward(potential_fn, x, "potential_fn")
    _check_scalar(u, "potential_fn")
    (grad,) = torch.autograd.grad(u, x_, allow_unused=True)
    if grad is None:
        grad = torch.zeros_like(x_)
    betas = torch.as_tensor(betas, dtype=u.dtype, device=u.device)
    if betas.dim() != 1:
        raise ValueError(f"betas must be one-dimensional (B,), got shape {tuple(betas.shape)}")
    values = betas * u.detach()
    grads = betas.view(-1, *(1,) * x.dim()) * grad
    return values, grads


def _forward(f: TensorFn, x: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` as a fresh leaf and ``f`` of it, with the graph recorded."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not (x.dtype.is_floating_point or x.dtype.is_complex):
        raise TypeError(f"x must be a floating-point or complex tensor, got {x.dtype}")
    x_ = x.detach().requires_grad_(True)
    with torch.enable_grad():
        y = f(x_)
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"{name} must return a torch.Tensor, got {type(y).__name__}")
    if not y.requires_grad:
        raise ValueError(
            f"{name}'s output has no gradient path to its input: compute it with "
            "differentiable torch operations (no .item(), .numpy(), .detach() or no_grad)"
        )
    return x_, y


def _check_scalar(z: object, name: str) -> torch.Tensor:
    """``z`` if it is a real 0-d tensor with a graph, else a clear error."""
    if not isinstance(z, torch.Tensor):
        raise TypeError(f"{name} must return a torch.Tensor, got {type(z).__name__}")
    if z.dim() != 0:
        raise ValueError(
            f"{name} returned a tensor of shape {tuple(z.shape)}; it must return a 0-d "
            "(scalar) tensor: reduce it, e.g. with .sum() or .squeeze()"
        )
    if z.is_complex() or not z.dtype.is_floating_point:
        raise ValueError(f"{name} must return a real floating-point scalar, got {z.dtype}")
    if not z.requires_grad:
        raise ValueError(
            f"{name}'s output has no gradient path to its input: compute it with "
            "differentiable torch operations (no .item(), .numpy(), .detach() or no_grad)"
        )
    return z


def _vjps(f: TensorFn, x: torch.Tensor, y: torch.Tensor, cotangents: torch.Tensor) -> torch.Tensor:
    """``(n, *x.shape)`` vector-Jacobian products of ``y = f(x)`` with ``(n, *y.shape)``
    cotangents, from one backward through ``y``'s graph (which it consumes)."""
    n = cotangents.shape[0]
    if n == 1:
        return _vjp(x, y, cotangents[0]).unsqueeze(0)
    try:
        (grads,) = torch.autograd.grad(
            y, x, grad_outputs=cotangents, is_grads_batched=True, allow_unused=True
        )
    except (RuntimeError, NotImplementedError) as error:
        warnings.warn(
            "a batched backward through f failed "
            f"({type(error).__name__}: {str(error).splitlines()[0][:200]}); recomputing f "
            f"for each of the {n} cotangents instead (correct, slower)",
            RuntimeWarning,
            stacklevel=3,
        )
        rows = []
        for cotangent in cotangents.unbind(0):
            with torch.enable_grad():
                y_again = f(x)
            rows.append(_vjp(x, y_again, cotangent))
        return torch.stack(rows)
    if grads is None:
        return x.new_zeros((n, *x.shape))
    return grads


def _vjp(x: torch.Tensor, y: torch.Tensor, cotangent: torch.Tensor) -> torch.Tensor:
    """One vector-Jacobian product through ``y``'s graph, zeros where ``x`` is unused."""
    (grad,) = torch.autograd.grad(y, x, grad_outputs=cotangent, allow_unused=True)
    return torch.zeros_like(x) if grad is None else grad
