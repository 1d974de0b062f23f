"""A logistic regression sampled by several processes, in either of hmc's two ways.

    torchrun --nproc-per-node 2 examples/distributed_logistic.py chains
    torchrun --nproc-per-node 2 examples/distributed_logistic.py data

``chains``: each rank runs its share of 16 chains on the whole data set, their warmup
pooled across the ranks (``adapt="ensemble"``); rank 0 prints the summary of all chains.
``data``: each rank holds a shard of the rows and every rank runs every chain; each
gradient is summed over the ranks in one all-reduce. With GPUs, each rank takes the one
``torchrun`` numbers ``LOCAL_RANK``, with the nccl backend; without, the CPU and gloo.
"""

import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.functional import softplus

import hmc
from hmc.distributed import ShardedPotential

ROWS, DIM = 20_000, 5

if torch.cuda.is_available():
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)  # where nccl's collectives of Python objects go
    dist.init_process_group("nccl")
else:
    device = torch.device("cpu")
    dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
rng = np.random.default_rng(0)  # the same data on every rank
features = rng.normal(size=(ROWS, DIM))
outcomes = 1.0 * (rng.uniform(size=ROWS) < 1 / (1 + np.exp(-features.sum(1))))
X, y = torch.from_numpy(features).to(device), torch.from_numpy(outcomes).to(device)


def log_prior(beta):
    return -0.5 * (beta * beta).sum()


def log_lik(X, y):
    def rows(beta):
        eta = X @ beta
        return (y * eta - softplus(eta)).sum()

    return rows


if sys.argv[1] == "chains":
    full = log_lik(X, y)
    tree = hmc.sample(
        lambda beta: log_prior(beta) + full(beta),
        dim=DIM,
        chains=16,
        adapt="ensemble",
        seed=1,
        device=device,
    )
else:
    shard = torch.tensor_split(torch.arange(ROWS, device=device), world)[rank]
    target = ShardedPotential(log_prior, log_lik(X[shard], y[shard]), dim=DIM)
    tree = hmc.sample(target, seed=1, device=device)
if rank == 0:
    import arviz

    print(arviz.summary(tree))
dist.destroy_process_group()
