"""Data-parallel logistic regression: time per evaluation (one per leapfrog step) of a
ShardedPotential over N rows, in one process or several, and the all-reduce's share.

    python benchmarks/distributed_logistic.py                      # one process
    torchrun --nproc-per-node 2 benchmarks/distributed_logistic.py # two

Rank 0 prints milliseconds per evaluation (4 chains, D = 20, N = 200,000 rows split
across the ranks), with and without the all-reduce.
"""

import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.functional import softplus

import hmc
from hmc.distributed import ShardedPotential

ROWS, DIM, CHAINS, CALLS = 200_000, 20, 4, 100

if "RANK" in os.environ:
    dist.init_process_group("gloo")
rank = dist.get_rank() if dist.is_initialized() else 0
world = dist.get_world_size() if dist.is_initialized() else 1
rng = np.random.default_rng(0)
rows = np.array_split(np.arange(ROWS), world)[rank]
X = torch.from_numpy(rng.normal(size=(ROWS, DIM))[rows])
y = torch.from_numpy(1.0 * (rng.uniform(size=ROWS) < 0.5)[rows])


def log_prior(beta):
    return -0.5 * (beta * beta).sum(-1)


def shard_log_lik(beta):  # (C, D) -> (C,)
    eta = beta @ X.T
    return (y * eta - softplus(eta)).sum(-1)


target = ShardedPotential(log_prior, shard_log_lik, dim=DIM, batched=True)
q = torch.from_numpy(np.random.default_rng(1).normal(size=(CHAINS, DIM)) * 0.01)
for reduce in (target.reduce, None):
    potential = hmc.Potential(target.log_prob, batched=True, compile=False, reduce=reduce)
    potential.value_and_grad(q)
    if world > 1:
        dist.barrier()
    started = time.perf_counter()
    for _ in range(CALLS):
        potential.value_and_grad(q)
    seconds = (time.perf_counter() - started) / CALLS
    if rank == 0:
        print(
            f"ranks {world} all-reduce {reduce is not None}: {1e3 * seconds:.2f} ms per evaluation"
        )
if world > 1:
    dist.destroy_process_group()
