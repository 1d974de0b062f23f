# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: -all
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Reusing gradients through an expensive inner function
#
# A question that comes up again and again: *given a slow function $f$ and cheap
# functions $g_1, g_2, \dots$, how do I get the gradients of $g_1(f(x))$ and $g_2(f(x))$
# without backpropagating through $f$ twice?* (In sampling it appears as a posterior and
# a tempered or prior-only density sharing one expensive simulator, or several summary
# statistics of one forward model.)
#
# Our slow function builds an $n \times n$ matrix, exponentiates $i$ times it and takes the
# real part of the trace:

# %%
# %matplotlib inline
import os
import time

import matplotlib.pyplot as plt
import torch

import hmc

SMALL = os.environ.get("HMC_SMALL") == "1"
n = 100 if SMALL else 1000
if SMALL:
    torch.set_num_threads(1)


def slow_fun(x):
    A = x * torch.ones((n, n), dtype=x.dtype)
    B = torch.matrix_exp(1j * A)
    return torch.real(torch.trace(B))


outer = {
    "y**2": lambda y: y**2,
    "sin(y)": torch.sin,
    "log(1 + y**2)": lambda y: torch.log1p(y**2),
}
x = torch.tensor(0.3, dtype=torch.float64)  # float64 throughout: results compared to 1e-10

# torch imports a few modules (about a second) the first time a backward pass is given
# explicit cotangents (`grad_outputs`); pay that once here, outside the timings below
x_ = x.clone().requires_grad_(True)
torch.autograd.grad(2 * x_, x_, grad_outputs=torch.ones_like(x_))

started = time.perf_counter()
y = slow_fun(x)
print(f"n = {n}: y = {float(y):.6f}, one forward pass {time.perf_counter() - started:.2f} s")

# %% [markdown]
# (The all-ones matrix has one eigenvalue $n$ and $n - 1$ zeros, so
# $y = n - 1 + \cos(nx)$ and $dy/dx = -n\sin(nx)$: a closed form to check against. The
# computer does not know that, and pays for a matrix exponential and its backward.)
#
# The naive way is to write each composite out and differentiate it, so $f$ runs once
# forward and once backward *per outer function*:

# %%
timings, results = {}, {}


def naive():
    grads = []
    for g in outer.values():
        x_ = x.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(g(slow_fun(x_)), x_)
        grads.append(grad)
    return grads


def timed(name, method):
    started = time.perf_counter()
    results[name] = torch.stack(method())
    timings[name] = time.perf_counter() - started
    print(f"{name:>24}: {timings[name]:6.2f} s   gradients {results[name].tolist()}")


timed("naive (k forward+backward)", naive)

# %% [markdown]
# ## 1. The chain rule by hand
#
# $y = f(x)$ is a scalar, so $\frac{d g_i(f(x))}{dx} = g_i'(y)\,\frac{dy}{dx}$: one
# backward through $f$ for $dy/dx$, and one (cheap) derivative of each $g_i$ at $y$.


# %%
def chain_rule():
    x_ = x.clone().requires_grad_(True)
    y = slow_fun(x_)
    (dy_dx,) = torch.autograd.grad(y, x_)  # the one backward through f
    grads = []
    for g in outer.values():
        y_ = y.detach().requires_grad_(True)
        (dg_dy,) = torch.autograd.grad(g(y_), y_)  # cheap: through g only
        grads.append(dg_dy * dy_dx)
    return grads


timed("chain rule by hand", chain_rule)

# %% [markdown]
# ## 2. `retain_graph=True`
#
# Keep the graph of $f$ alive and differentiate each composite through it. This is the
# usual answer on forums. It works, but each call still runs the backward of $f$ in full:
# it saves the forward passes, not the backward ones (and a kept graph holds on to all of
# $f$'s intermediate tensors until the last call). Fine in a notebook; the `hmc` package
# itself never keeps a graph beyond the call that built it.


# %%
def retain_graph():
    x_ = x.clone().requires_grad_(True)
    y = slow_fun(x_)
    grads = []
    for i, g in enumerate(outer.values()):
        last = i == len(outer) - 1
        (grad,) = torch.autograd.grad(g(y), x_, retain_graph=not last)
        grads.append(grad)
    return grads


timed("retain_graph=True", retain_graph)

# %% [markdown]
# ## 3. `hmc.shared_inner_grads`
#
# `hmc.shared_inner_grads(f, [g1, g2, ...], x)` does the bookkeeping: one forward and one
# backward through $f$, whatever the number of outer functions, and returns the values
# and the gradients, detached.


# %%
def shared():
    _, grads = hmc.shared_inner_grads(slow_fun, list(outer.values()), x)
    return grads


timed("hmc.shared_inner_grads", shared)

# %% [markdown]
# All four agree with each other to ten significant digits, and with the closed form
# $g_i'(y) \cdot (-n \sin(nx))$ to the accuracy of the matrix exponential:

# %%
y_exact = n - 1 + torch.cos(n * x)
dy_dx_exact = -n * torch.sin(n * x)
exact = []
for g in outer.values():
    y_ = y_exact.clone().requires_grad_(True)
    (dg_dy,) = torch.autograd.grad(g(y_), y_)
    exact.append(dg_dy * dy_dx_exact)
exact = torch.stack(exact)

reference = results["hmc.shared_inner_grads"]
for name, grads in results.items():
    between = float(((grads - reference).abs() / reference.abs()).max())
    closed = float(((grads - exact).abs() / exact.abs()).max())
    print(
        f"{name:>26}: max relative difference {between:.1e} to shared_inner_grads, "
        f"{closed:.1e} to the closed form"
    )
    assert torch.allclose(grads, reference, rtol=1e-10, atol=0), name
    assert torch.allclose(grads, exact, rtol=1e-6, atol=0), name

# %% [markdown]
# And the time each took: the two methods with one backward through $f$ cost about one
# forward and one backward pass; `retain_graph` saves the extra forward passes but not
# the backward ones; the naive way pays for everything $k$ times.

# %%
fig, ax = plt.subplots(figsize=(6, 2.5))
names = list(timings)
ax.barh(names, [timings[name] for name in names], color=["C3", "C0", "C1", "C2"])
ax.invert_yaxis()
ax.set(xlabel="seconds", title=f"gradients of {len(outer)} composites, n = {n}")
fig.tight_layout()

# %% [markdown]
# ## A tensor-valued inner function
#
# When $f$ returns a tensor $Y$ rather than a scalar, there is no scalar $dy/dx$ to
# multiply by. Each outer function gives its own cotangent $\partial g_i/\partial Y$, and
# each needs its own vector-Jacobian product through $f$: $k$ of them, whatever one
# does. `shared_inner_grads` still runs $f$ forward once and computes the $k$ products
# in one batched backward pass (`is_grads_batched`), against $k$ separate backward passes
# with `retain_graph=True`.
#
# Here $f$ returns the whole matrix exponential, and the outer functions read different
# parts of it.

# %%
m = 50 if SMALL else 200


def matrix_fun(x):
    return torch.matrix_exp(1j * x * torch.ones((m, m), dtype=x.dtype))


matrix_outer = [
    lambda B: torch.real(torch.trace(B)),
    lambda B: (B.real**2).sum() / m,
    lambda B: torch.imag(B[0, 1]),
]

started = time.perf_counter()
values, shared_grads = hmc.shared_inner_grads(matrix_fun, matrix_outer, x)
shared_seconds = time.perf_counter() - started

started = time.perf_counter()
x_ = x.clone().requires_grad_(True)
Y = matrix_fun(x_)
retained = [
    torch.autograd.grad(g(Y), x_, retain_graph=i < len(matrix_outer) - 1)[0]
    for i, g in enumerate(matrix_outer)
]
retain_seconds = time.perf_counter() - started

print(f"values: {[round(float(v), 6) for v in values]}")
print(f"shared_inner_grads: {shared_seconds:.2f} s, {[float(g) for g in shared_grads]}")
print(f"retain_graph=True:  {retain_seconds:.2f} s, {[float(g) for g in retained]}")
assert torch.allclose(torch.stack(shared_grads), torch.stack(retained), rtol=1e-10, atol=1e-12)

# %% [markdown]
# The gradients agree. With a tensor-valued $f$ the saving is the forward passes and the
# graph bookkeeping: the $k$ vector-Jacobian products are real work either way, so the
# two take comparable time here (batched backward passes pay off most when $f$'s backward
# is made of many small operations).
#
# ## In short
#
# - Scalar inner function: one backward for $dy/dx$, then multiply by each $g_i'(y)$. By
#   hand, or with `hmc.shared_inner_grads`, which also handles tensors, complex
#   intermediates and the bookkeeping.
# - `retain_graph=True` gives the same numbers but repeats the backward through $f$ for
#   every $g_i$.
# - Tensor-valued inner function: $k$ vector-Jacobian products are unavoidable;
#   `shared_inner_grads` runs $f$ once and batches them.
