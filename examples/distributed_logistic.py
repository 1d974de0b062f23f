"""A logistic regression sampled by several processes, in either of hmc's two ways.

    torchrun --nproc-per-node 2 examples/distributed_logistic.py chains
    torchrun --nproc-per-node 2 examples/distributed_logistic.py data

``chains``: each rank runs its share of the chains on the whole data set; rank 0 prints
the summary of all chains. ``data``: each rank holds a shard of the rows and every rank
runs every chain; each gradient is summed over the ranks in one all-reduce. On GPUs, use
the nccl backend and put each rank's data and chains on its own device.
"""

import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.functional import softplus

import hmc
from hmc.distributed import ShardedPotential

ROWS, DIM = 20_000, 5

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
rng = np.random.default_rng(0)  # the same data on every rank
X = torch.from_numpy(rng.normal(size=(ROWS, DIM)))
y = torch.from_numpy(1.0 * (rng.uniform(size=ROWS) < 1 / (1 + np.exp(-X.numpy().sum(1)))))


def log_prior(beta):
    return -0.5 * (beta * beta).sum()


def log_lik(X, y):
    def rows(beta):
        eta = X @ beta
        return (y * eta - softplus(eta)).sum()

    return rows


if sys.argv[1] == "chains":
    full = log_lik(X, y)
    tree = hmc.sample(lambda beta: log_prior(beta) + full(beta), dim=DIM, chains=4, seed=1)
else:
    shard = np.array_split(np.arange(ROWS), world)[rank]
    tree = hmc.sample(ShardedPotential(log_prior, log_lik(X[shard], y[shard]), dim=DIM), seed=1)
if rank == 0:
    import arviz

    print(arviz.summary(tree))
dist.destroy_process_group()
