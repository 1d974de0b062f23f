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
# # From `backward()` loops to `hmc.sample`
#
# Many people meet Hamiltonian Monte Carlo as a dozen lines of PyTorch that call
# `backward()` inside a loop. This notebook starts from such a loop, shows what is wrong
# with it, rebuilds it correctly from the package's pieces (`hmc.Potential`,
# `hmc.MemoCache`, `hmc.leapfrog`, `hmc.State`), and ends with the one-line
# `hmc.sample`, comparing wall time and gradient counts along the way.
#
# The target throughout is a strongly correlated two-dimensional Gaussian with precision
# matrix
# $P = \begin{pmatrix} 10.25 & -9.74 \\ -9.74 & 10.25 \end{pmatrix}$,
# energy $E(x) = \tfrac12 x^\top P x$ (so $p(x) \propto e^{-E(x)}$); its covariance
# $P^{-1}$ has standard deviations 1.4 along the diagonal and 0.22 across it.

# %%
# %matplotlib inline
import os
import time

import arviz as az
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import scipy.linalg
import torch

import hmc

SMALL = os.environ.get("HMC_SMALL") == "1"
torch.set_num_threads(1)  # tiny tensors: threads only add overhead
T = 200 if SMALL else 10_000  # iterations of the hand-written loops
NUTS_WARMUP, NUTS_DRAWS = (100, 100) if SMALL else (1000, 1000)
az.rcParams["plot.backend"] = "matplotlib"

precision = torch.tensor([[10.25, -9.74], [-9.74, 10.25]])
covariance = torch.linalg.inv(precision.double()).numpy()
across = np.array([1.0, -1.0]) / np.sqrt(2)  # the narrow direction of the target


def variance_across(draws):  # draws (n, 2): variance along the narrow direction
    return float(np.var(draws @ across))


print("covariance:\n", covariance.round(3))
print(f"variance across the diagonal: {across @ covariance @ across:.4f}")

# %% [markdown]
# ## The hand-written loop
#
# Here it is, as it is often found:


# %%
def HMC_basic(pos, energy, T=10000, n_steps=10, stepsize=0.25):
    for t in range(T):
        vel = torch.randn(pos.size())
        for i in range(n_steps):
            pos.data.add_(stepsize * vel.data)
            if pos.grad is not None:
                pos.grad.data.zero_()
            if i is not n_steps - 1:
                energy(pos).backward()
                vel -= stepsize * pos.grad
    return pos


# %% [markdown]
# It runs, and it is a fair first sketch, but several things are wrong with it.
#
# - **It is not a correct HMC sampler.** There is no Metropolis test, so the error of the
#   discrete integrator is never corrected and the chain does not leave the target
#   invariant. And the integrator is not leapfrog: there is no half step of the velocity
#   at either end of the trajectory, so even its energy error is not what leapfrog's is.
# - **It is fragile.** `pos.data` and `vel.data` bypass autograd (any graph through `pos`
#   is silently wrong); the gradient has to be zeroed by hand because `backward()`
#   accumulates into `pos.grad`; and `i is not n_steps - 1` compares *object identity*:
#   it works only because CPython caches small integers (for `n_steps` above 257 it would
#   compute a gradient at every step).
# - **It is slow.** One position at a time, one `backward()` per step, each building and
#   freeing a graph, accumulating into `.grad` and zeroing it again; and only one chain,
#   so nothing tells you whether it has converged.
# - **It returns one point.** Only the final position comes back: no draws, no
#   acceptance rate, no diagnostics.
#
# To look at its draws we add one line that records the position after every trajectory,
# and we count how often the energy is differentiated.

# %%
counts = {"backward": 0}


def energy(pos):
    counts["backward"] += 1
    return 0.5 * pos @ precision @ pos


def HMC_basic_recorded(pos, energy, T=10000, n_steps=10, stepsize=0.25):
    draws = []
    for t in range(T):
        vel = torch.randn(pos.size())
        for i in range(n_steps):
            pos.data.add_(stepsize * vel.data)
            if pos.grad is not None:
                pos.grad.data.zero_()
            if i is not n_steps - 1:
                energy(pos).backward()
                vel -= stepsize * pos.grad
        draws.append(pos.detach().clone())  # the one added line
    return torch.stack(draws)


torch.manual_seed(0)
started = time.perf_counter()
basic_draws = HMC_basic_recorded(torch.zeros(2, requires_grad=True), energy, T=T).numpy()
basic_seconds = time.perf_counter() - started
basic_gradients = counts["backward"]
print(f"{T} trajectories, {basic_gradients} backward() calls, {basic_seconds:.2f} s")
print(f"variance across the diagonal: {variance_across(basic_draws):.4f}")

# %% [markdown]
# Nine `backward()` calls per trajectory (ten position updates, no gradient at the last).
# And the variance across the diagonal is too small. That is not bad luck: without a
# Metropolis test the loop samples some other distribution. On a Gaussian each
# trajectory is a linear map, $x' = A x + B v$ with $v \sim \mathcal N(0, I)$, so the
# loop's stationary distribution is Gaussian too, with the covariance $\Sigma$ that solves
# $\Sigma = A \Sigma A^\top + B B^\top$. We can compute it exactly:


# %%
def loop_trajectory(x, vel, n_steps=10, stepsize=0.25):  # the loop's map, in numpy
    P = precision.double().numpy()
    for i in range(n_steps):
        x = x + stepsize * vel
        if i != n_steps - 1:
            vel = vel - stepsize * P @ x
    return x


A = np.column_stack([loop_trajectory(e, np.zeros(2)) for e in np.eye(2)])
B = np.column_stack([loop_trajectory(np.zeros(2), e) for e in np.eye(2)])
stationary = scipy.linalg.solve_discrete_lyapunov(A, B @ B.T)
print(f"variance across the diagonal, target:            {across @ covariance @ across:.4f}")
print(f"variance across the diagonal, the loop's limit:  {across @ stationary @ across:.4f}")

# %% [markdown]
# A third too small, however long the loop runs.
#
# ## The same sampler, done right, from the package's pieces
#
# `hmc.Potential` turns a log density into `value_and_grad(q) -> (U, dU/dq)` for a batch
# of positions `(C, D)`, with one `torch.autograd.grad` per call, detached results, no
# `.data`, no `retain_graph`. `hmc.leapfrog` takes one velocity-Verlet step of an
# `hmc.State(position, potential, grad)`: half kick with the gradient the state carries,
# drift, one new gradient, half kick. Adding the Metropolis test gives correct HMC.
#
# A loop that keeps only the position (as above) must ask for the energy and gradient
# at the start of every trajectory. Those are never new: after an acceptance the start is
# the last leapfrog point, after a rejection the previous start. A `hmc.MemoCache`,
# keyed on the exact bytes of the position, serves them.


# %%
def log_prob(q):  # one position (2,) -> 0-d
    return -0.5 * q @ precision.double() @ q


cache = hmc.MemoCache()
potential = hmc.Potential(log_prob, cache=cache)
metric = hmc.metric_from_inverse(torch.ones(1, 2, dtype=torch.float64))  # identity mass


def hmc_loop(q, T, n_steps=10, step_size=0.25, seed=0):
    generator = torch.Generator().manual_seed(seed)
    eps = torch.full((1, 1), step_size, dtype=q.dtype)
    q = q.reshape(1, -1)
    draws, accepted = [], 0
    for _ in range(T):
        U, grad = potential.value_and_grad(q)  # served by the cache after the first
        p0 = torch.randn(q.shape, generator=generator, dtype=q.dtype)
        state, p = hmc.State(q, U, grad), p0
        for _ in range(n_steps):
            state, p = hmc.leapfrog(state, p, eps, metric, potential)
        H0 = U + 0.5 * (p0**2).sum(-1)
        H1 = state.potential + 0.5 * (p**2).sum(-1)
        if torch.rand(1, generator=generator, dtype=q.dtype) < torch.exp(H0 - H1):
            q, accepted = state.position, accepted + 1
        draws.append(q[0])
    return torch.stack(draws).numpy(), accepted / T


started = time.perf_counter()
loop_draws, loop_acceptance = hmc_loop(torch.zeros(2, dtype=torch.float64), T)
loop_seconds = time.perf_counter() - started
print(f"{T} trajectories in {loop_seconds:.2f} s, acceptance {loop_acceptance:.2f}")
print(
    f"energy evaluations: {potential.evaluations}, cache hits: {cache.hits}, misses: {cache.misses}"
)
squares = (loop_draws @ across) ** 2  # the target's mean is 0: the variance is their mean
standard_error = squares.std() / np.sqrt(float(az.ess(squares[None], method="mean")))
print(
    f"variance across the diagonal: {squares.mean():.4f} +- {standard_error:.4f} "
    f"(Monte Carlo standard error); target {across @ covariance @ across:.4f}"
)

# %% [markdown]
# Ten gradients per trajectory, plus one at the very first position: the start of every
# later trajectory came from the cache (`cache.hits` is one per trajectory after the first).
# The Metropolis test rejects the few proposals whose energy error is large, and the
# variance across the diagonal now agrees with the target within two Monte Carlo standard
# errors: a single chain of fixed-length trajectories mixes slowly in that direction, so
# its error is larger than the number of draws suggests (the four-chain run below is
# closer).
#
# ## The same sampler in one line
#
# `hmc.sample` runs this loop for many chains at once (one batched energy call per
# leapfrog step for all of them) and keeps the gradient in the state, so it needs no
# cache at all. With `kernel=hmc.HMC(num_steps=10)`, `step_size=0.25`, `warmup=0` and an
# identity metric it is the sampler above, on four chains.

# %%
started = time.perf_counter()
dt_hmc = hmc.sample(
    log_prob,
    dim=2,
    chains=4,
    warmup=0,
    draws=T,
    kernel=hmc.HMC(num_steps=10),
    step_size=0.25,
    metric="identity",
    seed=1,
    progress=False,
)
hmc_seconds = time.perf_counter() - started
print(
    f"{dt_hmc.attrs['n_gradient_evaluations']} chain-gradients in {hmc_seconds:.2f} s, "
    f"acceptance {float(dt_hmc['sample_stats']['acceptance_rate'].mean()):.2f}"
)

# %% [markdown]
# And with the defaults: Stan's NUTS, which picks the trajectory length itself, after
# Stan's warmup, which adapts the step size and a diagonal metric.

# %%
started = time.perf_counter()
dt_nuts = hmc.sample(
    log_prob, dim=2, chains=4, warmup=NUTS_WARMUP, draws=NUTS_DRAWS, seed=1, progress=False
)
nuts_seconds = time.perf_counter() - started
print(f"{dt_nuts.attrs['n_gradient_evaluations']} chain-gradients in {nuts_seconds:.2f} s")

# %% [markdown]
# ## Side by side
#
# Gradients count one position's gradient each (a batched call on four chains counts
# four). The effective sample size (ESS) is the smaller of the two coordinates'; for the
# `backward()` loop it is computed as if its draws came from the target (they do not).
# The last column is the variance across the diagonal, 0.050 for the target.


# %%
def row(sampler, chains, iterations, gradients, seconds, draws):  # draws: (chain, draw, 2)
    ess = min(float(az.ess(draws[..., 0])), float(az.ess(draws[..., 1])))
    return {
        "sampler": sampler,
        "chains": chains,
        "iterations": iterations,
        "gradients": gradients,
        "seconds": seconds,
        "gradients/s": gradients / seconds,
        "min ESS": ess,
        "ESS/s": ess / seconds,
        "variance across": variance_across(draws.reshape(-1, 2)),
    }


nuts_draws = dt_nuts["posterior"]["x"].values
table = pd.DataFrame(
    [
        row("backward() loop", 1, T, basic_gradients, basic_seconds, basic_draws[None]),
        row("Potential + MemoCache", 1, T, potential.evaluations, loop_seconds, loop_draws[None]),
        row(
            "hmc.sample, HMC(num_steps=10)",
            4,
            T,
            dt_hmc.attrs["n_gradient_evaluations"],
            hmc_seconds,
            dt_hmc["posterior"]["x"].values,
        ),
        row(
            "hmc.sample, NUTS",
            4,
            NUTS_WARMUP + NUTS_DRAWS,
            dt_nuts.attrs["n_gradient_evaluations"],
            nuts_seconds,
            nuts_draws,
        ),
    ]
).set_index("sampler")
table.round({"seconds": 2, "gradients/s": 0, "min ESS": 0, "ESS/s": 1, "variance across": 4})

# %%
print(table.round(3).to_string())

# %% [markdown]
# How to read it (the timings depend on the machine; the counts do not):
#
# - Per gradient, the bare `backward()` loop is the cheapest line: a two-dimensional
#   quadratic costs next to nothing, so any bookkeeping shows. But its draws come from
#   the wrong distribution (last column), so its ESS measures nothing useful.
# - The loop built from `hmc`'s pieces pays for the energy module's checks and for the
#   cache's keys. On a log density that takes milliseconds those costs vanish, and each
#   cache hit saves a full forward and backward pass.
# - `hmc.sample` with the same static HMC runs four chains as one batch: four times the
#   draws for much less than four times the time.
# - NUTS adapts its step size and chooses each trajectory's length itself; on this tiny
#   target its per-step bookkeeping shows in gradients per second, but it needs no hand
#   tuning (the 10 steps of 0.25 above were picked for this target). Its default
#   diagonal metric cannot undo the strong correlation here; `metric="dense"` can.
#
# ## What the draws look like
#
# The target's 50 % and 95 % contours over 500 draws of each sampler:


# %%
def contours(ax):
    grid = np.linspace(-4, 4, 200)
    X, Y = np.meshgrid(grid, grid)
    P = precision.double().numpy()
    E = 0.5 * (P[0, 0] * X**2 + 2 * P[0, 1] * X * Y + P[1, 1] * Y**2)
    ax.contour(X, Y, E, levels=[0.69, 3.0], colors="k", linewidths=1)  # chi2_2/2 quantiles


samples = {
    "backward() loop (biased)": basic_draws,
    "Potential + MemoCache loop": loop_draws,
    "hmc.sample, NUTS": dt_nuts["posterior"]["x"].values.reshape(-1, 2),
}
fig, axes = plt.subplots(1, 3, figsize=(10, 3.6), sharex=True, sharey=True)
for ax, (title, draws) in zip(axes, samples.items(), strict=True):
    contours(ax)
    ax.plot(*draws[-500:].T, ".", markersize=3, alpha=0.5)
    ax.set(title=title, xlim=(-4, 4), ylim=(-4, 4), aspect="equal")
fig.tight_layout()

# %% [markdown]
# At this scale the bias hides in the narrow direction. Project every draw onto it,
# $(x_1 - x_2)/\sqrt 2$, and compare the histograms with the target's density and with
# the `backward()` loop's limit computed above:


# %%
def normal_density(z, variance):
    return np.exp(-0.5 * z**2 / variance) / np.sqrt(2 * np.pi * variance)


z = np.linspace(-0.8, 0.8, 200)
fig, axes = plt.subplots(1, 3, figsize=(10, 3), sharex=True, sharey=True)
for ax, (title, draws) in zip(axes, samples.items(), strict=True):
    ax.hist(draws @ across, bins=30, range=(-0.8, 0.8), density=True, color="C0", alpha=0.5)
    ax.plot(z, normal_density(z, across @ covariance @ across), "k", label="target")
    ax.plot(z, normal_density(z, across @ stationary @ across), "C3--", label="loop's limit")
    ax.set(title=title, xlabel="(x1 - x2) / sqrt 2")
axes[0].legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# ## Diagnostics the loop never had
#
# The `DataTree` that `hmc.sample` returns carries what the diagnostics need: several
# chains (so R-hat can compare them), per-draw statistics (divergences, energy, tree
# depth) and the adapted step size.

# %%
az.summary(dt_nuts)

# %%
stats = dt_nuts["sample_stats"]
print("R-hat:", az.rhat(dt_nuts)["x"].values.round(3))
print("ESS bulk:", az.ess(dt_nuts)["x"].values.round())
print("divergences:", int(stats["diverging"].sum()))
print("adapted step size per chain:", dt_nuts["adaptation"]["step_size"].values.round(3))
print("mean tree depth:", float(stats["tree_depth"].mean()))

# %% [markdown]
# The energy plot compares the spread of the energy across draws with its change between
# draws; on this Gaussian they overlap, and E-BFMI (per chain, left) is well above 0.3.

# %%
pc = az.plot_energy(dt_nuts, figure_kwargs={"figsize": (8, 2.5)})

# %% [markdown]
# ## Summary
#
# | hand-written loop | `hmc` |
# |---|---|
# | `.data`, `grad.zero_()`, `backward()` per step | one `autograd.grad` per step |
# | no half steps, no Metropolis test: biased | leapfrog + Metropolis (or NUTS): exact |
# | gradient at trajectory starts recomputed | carried in `State`, or cached |
# | one chain | many chains, one batched call per step |
# | hand-set step size | Stan's warmup adapts step size and metric |
# | nothing to check | R-hat, ESS, divergences, E-BFMI, plots |
