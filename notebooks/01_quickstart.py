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
# # Quickstart: a model in ten lines
#
# Write a log density with torch operations, hand it to `hmc.sample`, and get back an
# ArviZ `DataTree` with the draws, the sampler statistics and everything the ArviZ
# diagnostics and plots need.
#
# The model: a straight line through noisy points. We simulate 50 points with intercept
# 1, slope 2 and noise scale 0.5, and ask for the posterior of
# $(\alpha, \beta, \log\sigma)$ under weak normal priors.

# %%
# %matplotlib inline
import os
import time

import arviz as az
import matplotlib.pyplot as plt
import numpy as np
import torch

import hmc

SMALL = os.environ.get("HMC_SMALL") == "1"
if SMALL:
    torch.set_num_threads(1)
CHAINS, WARMUP, DRAWS = (2, 150, 150) if SMALL else (4, 1000, 1000)
az.rcParams["plot.backend"] = "matplotlib"

# %%
generator = torch.Generator().manual_seed(0)
x = torch.linspace(-2, 2, 50, dtype=torch.float64)
y = 1.0 + 2.0 * x + 0.5 * torch.randn(50, generator=generator, dtype=torch.float64)


def log_prob(q):  # q = (alpha, beta, log_sigma), one position of shape (3,)
    alpha, beta, log_sigma = q
    sigma = log_sigma.exp()
    residual = (y - alpha - beta * x) / sigma
    log_lik = -0.5 * (residual**2).sum() - len(y) * log_sigma
    log_prior = -0.5 * (alpha**2 + beta**2) / 10**2 - 0.5 * log_sigma**2
    return log_lik + log_prior


# %% [markdown]
# That is the whole model: one function from a position to a 0-d tensor. `hmc.sample`
# batches it over chains with `torch.func.vmap`, runs Stan's NUTS with Stan's warmup
# (step size and diagonal metric adaptation) and returns a `DataTree`.

# %%
started = time.perf_counter()
dt = hmc.sample(log_prob, dim=3, chains=CHAINS, warmup=WARMUP, draws=DRAWS, seed=1, progress=False)
print(f"{time.perf_counter() - started:.1f} s, {dt.attrs['n_gradient_evaluations']} gradients")
print("groups:", list(dt.children))

# %% [markdown]
# The draws live in `dt["posterior"]["x"]` with dims `(chain, draw, x_dim_0)`. Naming the
# coordinates makes the tables and plots readable (`hmc.Model` does this for you, with
# named and constrained parameters).

# %%
names = ["alpha", "beta", "log_sigma"]
dt["posterior"] = dt["posterior"].to_dataset().assign_coords(x_dim_0=names)
az.summary(dt)

# %% [markdown]
# The posterior means sit near the values the data were simulated with (1, 2 and
# $\log 0.5 \approx -0.69$), within a couple of posterior standard deviations; R-hat
# (`r_hat`) is close to 1, so the chains agree; and the effective sample sizes
# (`ess_bulk`, `ess_tail`) say how many independent draws the correlated ones are worth.
# The sampler statistics, under their ArviZ names, are in `dt["sample_stats"]`:

# %%
stats = dt["sample_stats"]
print("mean acceptance:", float(stats["acceptance_rate"].mean()))
print("divergences:    ", int(stats["diverging"].sum()))
print("tree depths:    ", np.bincount(stats["tree_depth"].values.ravel()))
print("step sizes:     ", dt["adaptation"]["step_size"].values.round(3))

# %% [markdown]
# ## The fit
#
# Each posterior draw is a line; a hundred of them drawn over the data show how sure we
# are about intercept and slope.

# %%
posterior = dt["posterior"]["x"].stack(sample=("chain", "draw")).values  # (3, n)
pick = np.random.default_rng(0).choice(posterior.shape[1], 100, replace=False)
grid = np.linspace(-2.2, 2.2, 2)
fig, ax = plt.subplots(figsize=(6, 3.5))
for alpha, beta in posterior[:2, pick].T:
    ax.plot(grid, alpha + beta * grid, color="C0", alpha=0.08)
ax.plot(x, y, "o", color="k", markersize=3, label="data")
ax.plot(grid, 1 + 2 * grid, "--", color="C3", label="truth")
ax.set(xlabel="x", ylabel="y", title="posterior lines")
ax.legend()
fig.tight_layout()

# %% [markdown]
# ## Trace, rank and energy plots
#
# The ArviZ 1.x plots read the `DataTree` directly. `plot_trace_dist` shows each chain's
# density and trace: the chains should overlap and the traces look like noise.

# %%
pc = az.plot_trace_dist(dt, figure_kwargs={"figsize": (8, 5)})

# %% [markdown]
# `plot_rank` compares the ranks of each chain's draws with the ranks of all draws
# pooled: for chains that sample the same distribution the lines stay inside the band.

# %%
pc = az.plot_rank(dt, figure_kwargs={"figsize": (8, 2.5)})

# %% [markdown]
# `plot_energy` is an HMC-specific check: the distribution of the energy at each draw
# (marginal) and of its change between draws (transition). When the transition density is
# much narrower than the marginal, momentum resampling cannot move the chain through the
# energy levels fast enough (a low E-BFMI, shown per chain beside it; below 0.3 is a
# warning). Here the two overlap well.

# %%
pc = az.plot_energy(dt, figure_kwargs={"figsize": (8, 2.5)})

# %% [markdown]
# ## Where next
#
# - `02_from_backward_loops`: what this replaces, a hand-written loop over `backward()`.
# - `04_diagnostics`: what the diagnostics look like when something is wrong.
# - `05_many_chains`: hundreds of chains at once on one device.
