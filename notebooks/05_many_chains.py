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
# # Many chains on one device
#
# `hmc.sample` runs all its chains as one batch: every leapfrog step is one call of the
# log density on a `(chains, D)` tensor and one `torch.autograd.grad`. On a GPU, and on
# a CPU too, a batch of 256 positions costs far less than 256 single ones, so the
# throughput (gradients of single chains per second) grows with the number of chains
# until the device is busy.
#
# NUTS has a catch: each chain's trajectory has its own length (a tree of 1, 3, 7, 15,
# ... leapfrog steps), so chains run in lock step would wait for the slowest one at every
# draw. `hmc`'s NUTS is asynchronous: a chain whose trajectory ends records its draw and
# starts the next one at the very next step, and no chain waits for another.
#
# The target: a Bayesian logistic regression on simulated data, written for a batch of
# positions (`batched=True`).

# %%
# %matplotlib inline
import os

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

import hmc

SMALL = os.environ.get("HMC_SMALL") == "1"
if SMALL:
    torch.set_num_threads(1)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CHAIN_COUNTS = [1, 4, 16] if SMALL else [1, 4, 16, 64, 256]
WARMUP, DRAWS = (30, 30) if SMALL else (300, 300)
N, D = (200, 5) if SMALL else (1000, 20)
print(f"device: {device} ({torch.get_num_threads()} CPU threads), chain counts {CHAIN_COUNTS}")
print(f"{N} observations, {D} coefficients")

generator = torch.Generator().manual_seed(0)
X = torch.randn(N, D, generator=generator, dtype=torch.float64)
true_beta = torch.randn(D, generator=generator, dtype=torch.float64)
labels = torch.bernoulli(torch.sigmoid(X @ true_beta), generator=generator)
X, signs = X.to(device), (2 * labels - 1).to(device)


def log_prob(beta):  # (C, D) -> (C,)
    logits = beta @ X.T  # (C, N)
    return F.logsigmoid(signs * logits).sum(-1) - 0.5 * (beta**2).sum(-1) / 4


# %% [markdown]
# ## Throughput against the number of chains
#
# For each chain count we run NUTS (Stan's) and static HMC (its number of leapfrog
# steps drawn per transition and chain, up to a trajectory length of $2\pi$), and divide
# the gradients of single chains evaluated (`dt.attrs["n_gradient_evaluations"]`) by the
# wall time (`dt.attrs["total_time"]`).

# %%
runs = {}
for kernel in ("nuts", "hmc"):
    for chains in CHAIN_COUNTS:
        dt = hmc.sample(
            log_prob,
            dim=D,
            batched=True,
            chains=chains,
            warmup=WARMUP,
            draws=DRAWS,
            kernel=kernel,
            device=device,
            seed=5,
            progress=False,
        )
        runs[kernel, chains] = dt
        rate = dt.attrs["n_gradient_evaluations"] / dt.attrs["total_time"]
        print(
            f"{kernel:>4} {chains:4d} chains: {dt.attrs['total_time']:6.2f} s, "
            f"{rate:9.0f} chain-gradients/s"
        )


# %% [markdown]
# Before looking at speed, a check that the chains agree: the posterior mean of the
# coefficients from the largest NUTS run against the largest HMC run.


# %%
def posterior_mean(dt):
    return dt["posterior"]["x"].mean(("chain", "draw")).values


largest = CHAIN_COUNTS[-1]
print("NUTS:", posterior_mean(runs["nuts", largest])[:5].round(2))
print("HMC: ", posterior_mean(runs["hmc", largest])[:5].round(2))
print("true:", true_beta[:5].numpy().round(2))


# %% [markdown]
# ## Utilisation: how much of the batch does useful work
#
# Each batched leapfrog step offers one slot per chain that is still sampling.
# `dt.attrs["chain_utilization"]` is the fraction of those slots, over the sampling
# phase, in which a chain did useful leapfrog work (rather than wait). Asynchronous NUTS
# keeps it near 1 however different the chains' tree depths are: a chain that finishes
# its tree starts the next one at the next step.
#
# For comparison we compute from `sample_stats["n_steps"]` the utilisation that chains in
# lock step would have had: at draw $t$ every chain waits for the longest trajectory,
# $\max_c n_{c,t}$ steps. Static HMC with a random number of steps runs this way by
# construction (one transition of every chain per batched call), so its figure is the
# lock-step one.


# %%
def lock_step_utilization(dt):
    n_steps = dt["sample_stats"]["n_steps"].values  # (chain, draw)
    return n_steps.sum() / (n_steps.shape[0] * n_steps.max(axis=0).sum())


rows = []
for (kernel, chains), dt in runs.items():
    rows.append(
        {
            "kernel": kernel,
            "chains": chains,
            "seconds": dt.attrs["total_time"],
            "chain-gradients/s": dt.attrs["n_gradient_evaluations"] / dt.attrs["total_time"],
            "mean n_steps": float(dt["sample_stats"]["n_steps"].mean()),
            "chain_utilization": dt.attrs["chain_utilization"] if kernel == "nuts" else np.nan,
            "lock-step utilisation": lock_step_utilization(dt),
        }
    )
table = pd.DataFrame(rows)
table.round(3)

# %%
print(table.round(3).to_string(index=False))

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
for kernel, colour in (("nuts", "C0"), ("hmc", "C1")):
    part = table[table["kernel"] == kernel]
    left.plot(part["chains"], part["chain-gradients/s"], "o-", color=colour, label=kernel.upper())
    ideal = part["chain-gradients/s"].iloc[0] * part["chains"] / part["chains"].iloc[0]
    left.plot(part["chains"], ideal, ":", color=colour, alpha=0.6)
left.set(
    xscale="log",
    yscale="log",
    xlabel="chains",
    ylabel="chain-gradients per second",
    title=f"throughput on {device.type} (dotted: linear scaling)",
)
left.legend()
nuts = table[table["kernel"] == "nuts"]
hmc_rows = table[table["kernel"] == "hmc"]
right.plot(
    nuts["chains"],
    nuts["chain_utilization"],
    "o-",
    color="C0",
    label="NUTS, asynchronous (chain_utilization)",
)
right.plot(
    nuts["chains"],
    nuts["lock-step utilisation"],
    "o--",
    color="C0",
    alpha=0.6,
    label="NUTS, if run in lock step",
)
right.plot(
    hmc_rows["chains"],
    hmc_rows["lock-step utilisation"],
    "s--",
    color="C1",
    label="static HMC, random steps (lock step)",
)
right.set(
    xscale="log",
    ylim=(0, 1.05),
    xlabel="chains",
    ylabel="useful fraction",
    title="chain utilisation, sampling phase",
)
right.legend(loc="lower left", fontsize=8)
fig.tight_layout()

# %% [markdown]
# What the plots show:
#
# - **Throughput** grows with the number of chains, far faster than the cost per step:
#   a step of many chains costs only a few times a step of one (the cost of a small step
#   is mostly Python and kernel-launch overhead), so more chains come almost for free
#   until the arithmetic itself fills the device, or, for NUTS on the CPU, until its work
#   per chain on the host does (next point).
# - **NUTS against static HMC.** On the CPU, NUTS keeps each chain's tree on the host and
#   checks its U-turns chain by chain: Python work that grows with the number of chains,
#   so at 64 chains and more static HMC's throughput pulls ahead. Static HMC has no such
#   work, but its chains wait for the longest trajectory of each transition (next
#   section), which at a few chains can cost it as much.
# - **Utilisation.** In lock step, the more chains there are, the more likely one of them
#   builds a deep tree at any given draw, and everyone else waits: the dashed NUTS line
#   falls as chains are added. Asynchronous NUTS stays near 1. Static HMC with a random
#   number of steps per chain waits for the longest trajectory at every transition
#   (about half the slots idle); a fixed `hmc.HMC(num_steps=L)` keeps every chain busy,
#   at the price of resonances on some targets.
#
# What to take away: run as many chains as the device absorbs at constant time per step.
# More chains give better R-hat and ESS estimates, make warmup more robust, and, for
# the same number of draws, finish sooner.

# %% [markdown]
# ## Many short chains: the pooled warmup and ChEES
#
# Throughput alone does not shorten a run: with Stan's warmup every chain still runs its
# 1,000 warmup iterations one after another, whatever the number of chains. With many
# chains, warmup can pool what the chains see: `adapt="ensemble"` updates one step size
# from the chains' mean acceptance and one diagonal metric from all their draws and
# gradients, in short windows, and stops once the metric and the log density settle
# (the printout below says after how many iterations; on posteriors where random starts
# lie far out, it takes a few more windows). Each chain then needs only a few draws.
#
# `kernel="chees"` goes further: static HMC whose trajectory length is learnt across
# chains (the ChEES criterion), jittered by a Halton sequence, so every chain takes the
# same number of leapfrog steps.
#
# With draws this short, classic R-hat over-reacts to autocorrelation; nested R-hat
# groups chains into superchains and is the diagnostic to read (values near 1, say below
# 1.01).

# %%
SHORT_CHAINS, SHORT_DRAWS = (32, 10) if SMALL else (256, 20)
short = {}
for kernel in ("nuts", "chees"):
    dt = hmc.sample(
        log_prob,
        dim=D,
        batched=True,
        chains=SHORT_CHAINS,
        adapt="ensemble",
        draws=SHORT_DRAWS,
        kernel=kernel,
        device=device,
        seed=6,
        progress=False,
    )
    short[kernel] = dt
    nested = hmc.nested_rhat(dt, superchains=SHORT_CHAINS // 8)["x"].values
    print(
        f"{kernel:>5}: {dt.attrs['tuning_steps']} warmup iterations, "
        f"{dt.attrs['total_time']:.1f} s, {dt.attrs['n_gradient_evaluations']} gradients, "
        f"nested R-hat max {nested.max():.3f}"
    )
long_run = runs["nuts", CHAIN_COUNTS[1]]
reference = long_run["posterior"]["x"].values.reshape(-1, D)
for kernel, dt in short.items():
    draws = dt["posterior"]["x"].values.reshape(-1, D)
    print(
        f"{kernel:>5}: largest gap of a posterior mean to the long run's, in posterior sds: "
        f"{(np.abs(draws.mean(0) - reference.mean(0)) / reference.std(0)).max():.2f}"
    )

# %% [markdown]
# Both short runs agree with the long run of Stan's warmup to within a fraction of a
# posterior standard deviation (the printed gaps), and take a fraction of its sequential
# iterations. Where this recipe fails: on a multimodal posterior, short chains cannot move
# between modes, the pooled metric averages over them, and the restart of chains stranded
# far below the others (`dt.attrs["restarted_chains"]`) drops modes of much lower density.
# There, run fewer, longer chains with `adapt="stan"`.
