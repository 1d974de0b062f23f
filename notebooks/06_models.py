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
# # Models with named, constrained parameters: `hmc.Model` and `hmc.Param`
#
# A plain log density takes one flat vector. Most models have named parameters, some of
# them constrained (a scale is positive, a probability lies in (0, 1), a covariance is
# positive definite). `hmc.Model` takes a log density over a dict of named parameters on
# their own scale and samples them on the unconstrained scale, adding each transform's
# log-Jacobian for you. This notebook writes two models from scratch:
#
# 1. a logistic regression, with priors given as distributions;
# 2. a hierarchical model, with derived quantities, pointwise log-likelihoods for LOO,
#    dims and coords, and initial values.

# %%
# %matplotlib inline
import os

import arviz as az
import arviz_stats as azs
import torch
from torch.distributions import Normal, constraints

import hmc

SMALL = os.environ.get("HMC_SMALL") == "1"
if SMALL:
    torch.set_num_threads(1)
CHAINS, WARMUP, DRAWS = (2, 100, 100) if SMALL else (4, 1000, 1000)
az.rcParams["plot.backend"] = "matplotlib"

# %% [markdown]
# ## 1. A logistic regression
#
# Simulated data: 200 observations, an intercept and three covariates.

# %%
generator = torch.Generator().manual_seed(0)
n, k = 200, 3
X = torch.randn(n, k, generator=generator, dtype=torch.float64)
true_alpha, true_beta = -0.5, torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
y = torch.bernoulli(torch.sigmoid(true_alpha + X @ true_beta), generator=generator)

# %% [markdown]
# The parameters are declared in `params`: a **torch distribution** is a parameter with
# that prior (its `log_prob` is added, its `support` is the constraint and its shape the
# parameter's shape); an **`hmc.Param(shape, constraint)`** is a parameter whose prior you
# write yourself in `log_prob`. `log_prob(p)` receives a dict of tensors of the declared
# shapes, on their constrained scale, and returns the log density (up to a constant)
# without Jacobians.


# %%
def logistic_log_prob(p):
    logits = p["alpha"] + X @ p["beta"]
    return torch.distributions.Bernoulli(logits=logits).log_prob(y).sum()


logistic = hmc.Model(
    logistic_log_prob,
    {
        "alpha": Normal(torch.tensor(0.0, dtype=torch.float64), 2.5),
        "beta": Normal(torch.zeros(k, dtype=torch.float64), 2.5),
    },
    dims={"beta": ["covariate"]},
    coords={"covariate": ["x1", "x2", "x3"]},
)
print(logistic, "unconstrained dimension:", logistic.dim)

# %%
dt = hmc.sample(logistic, chains=CHAINS, warmup=WARMUP, draws=DRAWS, seed=1)
az.summary(dt)

# %% [markdown]
# The true values were $\alpha = -0.5$ and $\beta = (1, -2, 0.5)$; the posterior means
# above land within a couple of posterior standard deviations of them. `beta` comes back
# with the dimension name and labels given in `dims` and `coords`.
#
# ## 2. A hierarchical model
#
# Eight schools report estimated coaching effects $y_j$ with standard errors
# $\sigma_j$. The non-centred model samples standardised school effects $z_j$ and builds
# $\theta_j = \mu + \tau z_j$ from them:
#
# $$y_j \sim \mathcal N(\mu + \tau z_j, \sigma_j), \quad z_j \sim \mathcal N(0, 1), \quad
# \mu \sim \mathcal N(0, 5), \quad \tau \sim \text{half-Cauchy}(5).$$
#
# - `tau` is declared with `constraints.positive` and given its prior in `log_prob`: the
#   model samples $\log \tau$ and adds the log-Jacobian.
# - `derived` returns deterministic quantities per draw: they join the posterior group.
# - `log_likelihood` returns the pointwise log-likelihood of each observation: it becomes
#   the `log_likelihood` group, which `arviz_stats.loo` reads.
# - `observed_data` is returned as its group, so the run documents its data.

# %%
schools = ["Choate", "Deerfield", "Phillips Andover", "Phillips Exeter", "Hotchkiss",
           "Lawrenceville", "St. Paul's", "Mt. Hermon"]  # fmt: skip
y8 = torch.tensor([28.0, 8, -3, 7, -1, 1, 18, 12], dtype=torch.float64)
sigma8 = torch.tensor([15.0, 10, 16, 11, 9, 11, 10, 18], dtype=torch.float64)


def theta(p):
    return p["mu"] + p["tau"] * p["z"]


def pointwise(p):
    return {"y": Normal(theta(p), sigma8).log_prob(y8)}


def schools_log_prob(p):
    prior = (
        Normal(0.0, 5.0).log_prob(p["mu"])
        + torch.distributions.HalfCauchy(5.0).log_prob(p["tau"])
        + Normal(0.0, 1.0).log_prob(p["z"]).sum()
    )
    return prior + pointwise(p)["y"].sum()


eight_schools = hmc.Model(
    schools_log_prob,
    {
        "mu": hmc.Param(),
        "tau": hmc.Param(constraint=constraints.positive),
        "z": hmc.Param(shape=8),
    },
    derived=lambda p: {"theta": theta(p)},
    log_likelihood=pointwise,
    observed_data={"y": y8.numpy()},
    dims={"z": ["school"], "theta": ["school"], "y": ["school"]},
    coords={"school": schools},
)

# %% [markdown]
# Initial values are given on the constrained scale, as a dict; parameters left out start
# at random (uniform(-2, 2) on the unconstrained scale, as in Stan).

# %%
dt8 = hmc.sample(
    eight_schools,
    init={"mu": torch.tensor(0.0), "tau": torch.tensor(1.0)},
    chains=CHAINS,
    warmup=WARMUP,
    draws=DRAWS,
    seed=2,
)
az.summary(dt8, var_names=["mu", "tau", "theta"])

# %%
print("groups:", list(dt8.children))
print(azs.loo(dt8))

# %% [markdown]
# The run holds `posterior` (with `theta` per school), `log_likelihood`, `observed_data`,
# `sample_stats` and the `adaptation`. LOO's Pareto-$k$ diagnostics say whether its
# estimate can be trusted for each school.
#
# ## What to remember
#
# - Declare every parameter in `params`: a distribution (its prior included) or an
#   `hmc.Param(shape, constraint)` with any `torch.distributions.constraints` that torch
#   can map to the real line (plus ordered vectors, Cholesky factors and
#   positive-definite matrices).
# - Write `log_prob(p)` on the constrained scale and without Jacobians; it must run under
#   `torch.func.vmap` (no `.item()`, no Python branches on values, no in-place writes).
# - `derived`, `log_likelihood`, `observed_data`, `dims` and `coords` shape the DataTree
#   that comes back; `init` takes constrained values by name.
