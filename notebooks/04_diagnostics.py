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
# # Diagnostics: when the sampler tells you something is wrong
#
# The eight schools model is the classic hierarchical model that NUTS struggles with.
# Eight schools ran a coaching programme; each reports an estimated effect $y_j$ with a
# standard error $\sigma_j$. The model pools them:
#
# $$y_j \sim \mathcal N(\theta_j, \sigma_j), \quad \theta_j \sim \mathcal N(\mu, \tau),
# \quad \mu \sim \mathcal N(0, 5), \quad \tau \sim \text{half-Cauchy}(0, 5).$$
#
# Written this way (*centred*), the posterior is a funnel: when the between-school scale
# $\tau$ is small, every $\theta_j$ is squeezed close to $\mu$, and the curvature there is
# far larger than in the wide mouth of the funnel. No single step size suits both. Both
# forms ship with the package as posteriordb models, `hmc.models.load(...)`.

# %%
# %matplotlib inline
import os

import arviz as az
import arviz_stats as azs
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

import hmc
import hmc.models

SMALL = os.environ.get("HMC_SMALL") == "1"
if SMALL:
    torch.set_num_threads(1)
CHAINS, WARMUP, DRAWS = (2, 60, 60) if SMALL else (4, 1000, 1000)
# a short test run: cap the trees (the full run uses NUTS's default depth of 10)
KERNEL = hmc.NUTS(max_tree_depth=5) if SMALL else hmc.NUTS()
az.rcParams["plot.backend"] = "matplotlib"

centred = hmc.models.load("eight_schools-eight_schools_centered")
noncentred = hmc.models.load("eight_schools-eight_schools_noncentered")
print(centred)
print(noncentred)


# %%
def run(model, **kwargs):
    return hmc.sample(
        model,
        chains=CHAINS,
        warmup=WARMUP,
        draws=DRAWS,
        kernel=KERNEL,
        seed=8,
        progress=False,
        **kwargs,
    )


dt_centred = run(centred)
print("divergences:", int(dt_centred["sample_stats"]["diverging"].sum()), "of", CHAINS * DRAWS)

# %% [markdown]
# ## First look: `diagnose`
#
# `arviz_stats.diagnose` runs the checks Stan's `diagnose` runs: divergences, transitions
# that hit the maximum tree depth, E-BFMI, effective sample size and R-hat, and prints
# what it finds.

# %%
has_problems = azs.diagnose(dt_centred)

# %% [markdown]
# ## Divergences
#
# A divergent transition is one where the leapfrog integrator's energy error blew up:
# the trajectory hit a region of high curvature that the step size cannot resolve. The
# draws are then biased *away* from that region. Where the divergences happen tells you
# where the trouble is, so plot them: ArviZ marks the draws whose transition diverged
# (`visuals={"divergence": True}`). We add $\log\tau$ to the posterior, the scale on
# which the funnel is visible.


# %%
def with_log_tau(dt):
    posterior = dt["posterior"].to_dataset()
    posterior["log_tau"] = np.log(posterior["tau"])
    dt["posterior"] = posterior
    return dt


dt_centred = with_log_tau(dt_centred)
pc = az.plot_pair(
    dt_centred,
    var_names=["mu", "log_tau", "theta"],
    coords={"school": ["Choate"]},
    visuals={"divergence": True},
    figure_kwargs={"figsize": (6, 6)},
)

# %% [markdown]
# The divergent draws (marked) crowd into the neck of the funnel, at small $\tau$, where
# $\theta_1$ collapses onto $\mu$. The chains rarely get further down the neck (the
# non-centred run below reaches $\log\tau$ of -8; these stop near -1): the sampler does
# not explore it, so no estimate that depends on small $\tau$ can be trusted, whatever
# the summary says (its mean of $\tau$ below happens to land near the reference).
#
# ## E-BFMI and the energy plot
#
# The energy Bayesian fraction of missing information compares how much the energy
# changes between draws with how much it varies overall. Below 0.3 (per chain), momentum
# resampling cannot carry the chain through the energy levels fast enough, a sign of
# heavy tails or a funnel.

# %%
print("E-BFMI per chain:", azs.bfmi(dt_centred)["energy"].values.round(2))
pc = az.plot_energy(dt_centred, figure_kwargs={"figsize": (8, 2.5)})

# %% [markdown]
# ## R-hat and effective sample size
#
# R-hat compares the chains with each other (values above 1.01 say they disagree); the
# bulk and tail effective sample sizes say how many independent draws the chains are
# worth. For $\tau$ both look bad: the chains get stuck in or out of the funnel neck for
# long stretches.

# %%
az.summary(dt_centred, var_names=["mu", "tau", "theta"], kind="diagnostics")

# %%
print("R-hat tau:   ", float(az.rhat(dt_centred)["tau"]))
print("ESS bulk tau:", float(az.ess(dt_centred, method="bulk")["tau"]))
print("ESS tail tau:", float(az.ess(dt_centred, method="tail")["tau"]))

# %% [markdown]
# ## What to do about it
#
# **Make the steps smaller.** Raising `target_accept` (Stan's `adapt_delta`) from 0.8 to
# 0.95 makes warmup settle on a smaller step size. It often removes some divergences, at
# the price of longer trajectories, but it does not change the geometry: the neck is
# still there.
#
# **Reparametrise.** The non-centred form samples standardised effects
# $\tilde\theta_j \sim \mathcal N(0, 1)$ and sets $\theta_j = \mu + \tau\tilde\theta_j$.
# The posterior is the same, but the sampler now sees a geometry without a funnel (the
# model reports the derived $\theta$ as well).

# %%
dt_careful = with_log_tau(run(centred, target_accept=0.95))
dt_noncentred = with_log_tau(run(noncentred))


# %%
def row(name, dt):
    stats = dt["sample_stats"]
    return {
        "run": name,
        "divergences": int(stats["diverging"].sum()),
        "step size": float(dt["adaptation"]["step_size"].mean()),
        "mean tree depth": float(stats["tree_depth"].mean()),
        "min E-BFMI": float(azs.bfmi(dt)["energy"].min()),
        "R-hat tau": float(az.rhat(dt)["tau"]),
        "ESS bulk tau": float(az.ess(dt)["tau"]),
        "mean tau": float(dt["posterior"]["tau"].mean()),
        "mcse tau": float(az.mcse(dt)["tau"]),
        "gradients": dt.attrs["n_gradient_evaluations"],
        "seconds": dt.attrs["total_time"],
    }


reference = hmc.models.reference("eight_schools-eight_schools_noncentered")["stats"]
print(f"posteriordb reference: mean tau = {reference['tau']['mean']:.2f}")
table = pd.DataFrame(
    [
        row("centred", dt_centred),
        row("centred, target_accept=0.95", dt_careful),
        row("non-centred", dt_noncentred),
    ]
).set_index("run")
table.round(2)

# %%
print(table.round(2).T.to_string())

# %% [markdown]
# The smaller step size of `target_accept=0.95` costs more gradients per draw and
# removes some of the divergences, but E-BFMI and the effective sample size of $\tau$
# stay poor: the funnel is still there. The non-centred model needs the fewest gradients,
# has an E-BFMI far above 0.3, many times the effective sample size for $\tau$, and far
# fewer divergences. Its posterior mean of $\tau$ agrees with posteriordb's reference to
# within a few Monte Carlo standard errors (`mcse tau`).
#
# ## The funnel, seen from both sides
#
# The same posterior, in the coordinates each sampler moves in: the centred funnel
# ($\theta_1$ against $\log\tau$) with the default settings and with
# `target_accept=0.95`, and the non-centred coordinates ($\tilde\theta_1$ against
# $\log\tau$), where the neck has gone. Divergent transitions are in orange.


# %%
def scatter(ax, dt, variable, title):
    x = dt["posterior"][variable].sel(school="Choate").values.ravel()
    y = dt["posterior"]["log_tau"].values.ravel()
    bad = dt["sample_stats"]["diverging"].values.ravel()
    ax.plot(x[~bad], y[~bad], ".", color="C0", markersize=2, alpha=0.4)
    ax.plot(x[bad], y[bad], "o", color="C1", markersize=4, label=f"divergent ({bad.sum()})")
    ax.set(title=title, xlabel=variable + "[Choate]", ylabel="log tau")
    ax.legend(loc="lower right")


fig, axes = plt.subplots(1, 3, figsize=(11, 3.6), sharey=True)
scatter(axes[0], dt_centred, "theta", "centred")
scatter(axes[1], dt_careful, "theta", "centred, target_accept=0.95")
scatter(axes[2], dt_noncentred, "theta_trans", "non-centred")
fig.tight_layout()

# %% [markdown]
# ## In short
#
# | symptom | where it shows | usual remedy |
# |---|---|---|
# | divergences | `sample_stats.diverging`, pair plots | reparametrise; raise `target_accept` |
# | E-BFMI < 0.3 | `arviz_stats.bfmi`, `plot_energy` | reparametrise (funnels, heavy tails) |
# | R-hat > 1.01 | `arviz.rhat`, `arviz.summary` | run longer; find the stuck chain |
# | low ESS | `arviz.ess`, `arviz.summary` | run longer; reparametrise |
# | max tree depth hit | `sample_stats.reached_max_treedepth` | dense metric, rescale parameters |
#
# `arviz_stats.diagnose` checks all of them at once.
