"""Data-parallel logistic regression: time per gradient evaluation (one per leapfrog step) of
a ShardedPotential over N rows, in one process and in two, and the all-reduce's share.

    python benchmarks/distributed_logistic.py

starts ``torchrun --nproc-per-node P benchmarks/distributed_logistic.py measure`` for
P = 1 and 2, alternately, ``REPEATS`` times (this machine is noisy), one thread per
process, and prints a Markdown table: milliseconds per evaluation of the potential alone
(with the all-reduce, and without it: each rank's shard alone), and per leapfrog step of a
whole static-HMC run (4 chains, 100 iterations of 10 leapfrog steps, its total time over
its steps), with the speed-up of two processes over one, each the median over repeats.
4 chains, D = 20, N = 200,000 rows split across the ranks.
"""

import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.functional import softplus

import hmc
from hmc.distributed import ShardedPotential

ROWS, DIM, CHAINS, CALLS, REPEATS = 200_000, 20, 4, 100, 5


def measure() -> dict[str, float]:
    """This rank's part of one measurement: milliseconds per evaluation, three ways."""
    rank, world = dist.get_rank(), dist.get_world_size()
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
    result = {}
    for name, reduce in (("with all-reduce", target.reduce), ("shard alone", None)):
        potential = hmc.Potential(target.log_prob, batched=True, compile=False, reduce=reduce)
        potential.value_and_grad(q)
        dist.barrier()
        started = time.perf_counter()
        for _ in range(CALLS):
            potential.value_and_grad(q)
        result[name] = 1e3 * (time.perf_counter() - started) / CALLS
    dist.barrier()
    tree = hmc.sample(
        target, chains=CHAINS, warmup=0, draws=100, kernel=hmc.HMC(num_steps=10),
        step_size=0.002, init=q, seed=1, progress=False, compile=False,
    )  # fmt: skip
    steps = tree.attrs["n_gradient_evaluations"] / CHAINS  # (it counts chain-gradients)
    result["whole run, per step"] = 1e3 * tree.attrs["total_time"] / steps
    return result


def main() -> None:
    """Run the measurements side by side and print the table."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    for _ in range(REPEATS):
        for processes in runs:
            command = [sys.executable, "-m", "torch.distributed.run"]  # torchrun
            command += [f"--nproc-per-node={processes}", __file__, "measure"]
            output = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            runs[processes].append(json.loads(output.stdout.strip().splitlines()[-1]))
    columns = list(runs[1][0])
    median = {p: {c: statistics.median(r[c] for r in runs[p]) for c in columns} for p in runs}
    print("| processes | " + " | ".join(f"{c} (ms)" for c in columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for processes, measured in runs.items():
        cells = (
            "<br>".join(f"{r[c]:.2f}" for r in measured) + f"<br>median {median[processes][c]:.2f}"
            for c in columns
        )
        print(f"| {processes} | " + " | ".join(cells) + " |")
    speedups = " | ".join(f"{median[1][c] / median[2][c]:.2f}x" for c in columns)
    print(f"| speed-up | {speedups} |")
    share = 1 - median[2]["shard alone"] / median[2]["with all-reduce"]
    print(f"\nthe all-reduce's share of an evaluation with two processes: {share:.0%}")


if __name__ == "__main__":
    if sys.argv[1:] == ["measure"]:
        dist.init_process_group("gloo")
        measured = measure()
        if dist.get_rank() == 0:
            print(json.dumps(measured))
        dist.destroy_process_group()
    else:
        main()
