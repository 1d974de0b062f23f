"""One rank of a test run under a gloo process group on loopback (tests/test_distributed.py).

``python distributed_worker.py MODE RANK WORLD PORT OUT``: MODE is ``chains`` (a
chain-parallel static HMC run), ``ensemble`` (chain-parallel runs with the pooled warmup,
ChEES and NUTS, one chain stranded), ``gradient`` (a sharded potential's value and gradient),
``nuts`` (a data-parallel NUTS run), ``kill`` (a data-parallel run whose last rank dies
mid-run), ``stall`` (one whose last rank stops answering mid-run, under a group timeout
of :data:`STALL_TIMEOUT` seconds), ``interrupt`` (one whose last rank alone gets a
SIGINT mid-sampling), ``pooled_interrupt`` (chain-parallel ChEES runs with the pooled
warmup whose last rank alone gets a SIGINT, in warmup and then in sampling) or
``checkpoint`` (a chain-parallel and a data-parallel run with checkpoints, interrupted at
the last rank and resumed). Rank 0 writes what it got to ``OUT`` (an ``.npz``; in the
interrupt and checkpoint modes every rank writes ``OUT.rank<r>.npz``); a rank that meets
``RankFailure`` writes its message to ``OUT.rank<r>.failure``.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist

import hmc
from hmc.distributed import RankFailure, ShardedPotential

#: the process group's timeout in seconds: the ``stall`` mode's, and the others'
STALL_TIMEOUT, TIMEOUT = 15, 30
#: the ``interrupt`` mode's evaluation of the last rank's shard that signals (in sampling)
INTERRUPT_AT = 400
#: the logistic regression's data: rows, coordinates, seed
ROWS, DIM, DATA_SEED = 240, 3, 7


def logistic_data() -> tuple[torch.Tensor, torch.Tensor]:
    """Features ``(ROWS, DIM)`` and 0/1 outcomes ``(ROWS,)`` of a logistic regression."""
    rng = np.random.default_rng(DATA_SEED)
    X = rng.normal(size=(ROWS, DIM))
    y = (rng.uniform(size=ROWS) < 1 / (1 + np.exp(-X @ np.array([1.0, -0.5, 0.25])))) * 1.0
    return torch.from_numpy(X), torch.from_numpy(y)


def log_prior(beta: torch.Tensor) -> torch.Tensor:
    """Normal(0, 2) on every coefficient: ``(D,) -> ()``."""
    return -0.125 * (beta * beta).sum()


def log_lik(X: torch.Tensor, y: torch.Tensor):
    """The log-likelihood of the rows ``X``, ``y`` as a function ``(D,) -> ()``."""

    def shard(beta: torch.Tensor) -> torch.Tensor:
        eta = X @ beta
        return (y * eta - torch.nn.functional.softplus(eta)).sum()

    return shard


def elementwise(q: torch.Tensor) -> torch.Tensor:
    """A standard normal density in each coordinate, batched: ``(C, D) -> (C,)``."""
    return -0.5 * (q * q).sum(-1)


def two_modes(q: torch.Tensor) -> torch.Tensor:
    """A standard normal and a minor mode 60 nats below it at ``(20, 0)``, batched:
    ``(C, 2) -> (C,)``. A chain started there stays stranded through a short warmup."""
    major = -0.5 * (q * q).sum(-1)
    minor = -60.0 - 0.5 * ((q[:, 0] - 20.0) ** 2 + q[:, 1] ** 2)
    return torch.maximum(major, minor)


#: the chain-parallel static HMC run (its draws do not depend on the number of ranks)
CHAINS_RUN = dict(
    dim=2, chains=5, warmup=0, draws=50, kernel=hmc.HMC(num_steps=4), step_size=0.3,
    batched=True, seed=11, progress=False, compile=False,
)  # fmt: skip
#: a chain-parallel ChEES run with the pooled warmup
POOLED_RUN = dict(
    dim=2, chains=8, kernel="chees", adapt="ensemble", warmup=100, draws=50, batched=True,
    seed=17, progress=False, compile=False,
)  # fmt: skip
#: the data-parallel NUTS run
NUTS_RUN = dict(chains=2, warmup=100, draws=100, seed=5, progress=False, compile=False)

#: the pooled warmup's runs: 8 chains, the stranded one on rank 0 (chains 0-3 of two ranks)
#: restarts from chain 4, on rank 1
ENSEMBLE_CHAINS, STRANDED = 8, 3


def ensemble_runs() -> dict[str, object]:
    """The chain-parallel runs with the pooled warmup (in one process, or one rank's part)."""
    init = torch.zeros(ENSEMBLE_CHAINS, 2, dtype=torch.float64)
    init[:, 1] = torch.linspace(-1.0, 1.0, ENSEMBLE_CHAINS, dtype=torch.float64)
    init[STRANDED, 0] = 20.0
    common = dict(
        dim=2, chains=ENSEMBLE_CHAINS, warmup=60, draws=30, adapt="ensemble", batched=True,
        init=init, seed=13, progress=False, compile=False,
    )  # fmt: skip
    return {kernel: hmc.sample(two_modes, kernel=kernel, **common) for kernel in ("chees", "nuts")}


def main(mode: str, rank: int, world: int, port: int, out: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=STALL_TIMEOUT if mode == "stall" else TIMEOUT),
    )
    try:
        result = run(mode, rank, world)
    except RankFailure as failure:
        with open(f"{out}.rank{rank}.failure", "w") as file:
            file.write(str(failure))
        os._exit(3)  # the group is broken: no orderly shutdown is possible
    if mode in ("interrupt", "pooled_interrupt", "checkpoint"):
        np.savez(f"{out}.rank{rank}.npz", **result)
    elif rank == 0:
        np.savez(out, **result)
    dist.destroy_process_group()


def run(mode: str, rank: int, world: int) -> dict[str, np.ndarray]:
    if mode == "chains":
        tree = hmc.sample(elementwise, **CHAINS_RUN)
        if rank != 0:
            assert tree is None
            return {}
        return {
            "x": tree["posterior"]["x"].values,
            "chain": tree["posterior"]["chain"].values,
            "lp": tree["sample_stats"]["lp"].values,
            "evaluations": np.array(tree.attrs["n_gradient_evaluations"]),
            "ranks": np.array(tree.attrs["ranks"]),
        }
    if mode == "ensemble":
        runs = ensemble_runs()
        if rank != 0:
            assert all(tree is None for tree in runs.values())
            return {}
        return {
            f"{kernel}_{name}": value
            for kernel, tree in runs.items()
            for name, value in (
                ("x", tree["posterior"]["x"].values),
                ("step_size", tree["adaptation"]["step_size"].values),
                ("inverse_metric", tree["adaptation"]["inverse_metric"].values),
                ("restarted", np.asarray(tree.attrs["restarted_chains"])),
                ("warmup", np.asarray(tree.attrs["tuning_steps"])),
            )
        }
    if mode == "pooled_interrupt":
        return pooled_interrupts(rank == world - 1)
    X, y = logistic_data()
    rows = np.array_split(np.arange(ROWS), world)[rank]
    shard_log_lik = log_lik(X[rows], y[rows])
    if mode == "checkpoint":
        return checkpoints(rank == world - 1, shard_log_lik, out)
    if mode in ("kill", "stall") and rank == world - 1:
        calls = [0]

        def failing(beta: torch.Tensor) -> torch.Tensor:
            calls[0] += 1
            if calls[0] > 300 and mode == "kill":
                os._exit(9)  # as a SIGKILL would: no goodbye to the group
            if calls[0] > 300:
                time.sleep(3600)  # alive, holding its connections, never answering
            return shard_log_lik(beta)

        target = ShardedPotential(log_prior, failing, dim=DIM)
    else:
        signals = mode == "interrupt" and rank == world - 1
        target = ShardedPotential(
            log_prior, signalling(INTERRUPT_AT, signals, shard_log_lik), dim=DIM
        )
    if mode == "gradient":
        potential = hmc.Potential(target.log_prob, reduce=target.reduce, compile=False)
        q = torch.from_numpy(np.random.default_rng(3).normal(size=(6, DIM)))
        U, grad = potential.value_and_grad(q)
        return {"U": U.numpy(), "grad": grad.numpy(), "q": q.numpy()}
    run = NUTS_RUN | ({"warmup": 20, "draws": 300} if mode == "interrupt" else {})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the interrupt's warning
        tree = hmc.sample(target, **run)
    return {
        "x": tree["posterior"]["x"].values,
        "lp": tree["sample_stats"]["lp"].values,
        "n_steps": tree["sample_stats"]["n_steps"].values,
        "interrupted": np.array(tree.attrs.get("interrupted", False)),
    }


def signalling(at: int, signals: bool, log_prob=elementwise):
    """``log_prob`` that sends this process a SIGINT at its ``at``-th call when it
    ``signals``, as Ctrl-C at this rank's terminal alone would."""
    calls = [0]

    def counted(q: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        if signals and calls[0] == at:
            os.kill(os.getpid(), signal.SIGINT)
        return log_prob(q)

    return counted


def checkpoints(signals: bool, shard_log_lik, out: str) -> dict[str, np.ndarray]:
    """With ``checkpoint=``, the last rank signalling: the chain-parallel static HMC run
    (interrupted, then :func:`hmc.resume`), the chain-parallel pooled warmup (interrupted
    in warmup, then the same call again), the data-parallel NUTS run (the same), and the
    data-parallel run again once the last rank's file is gone (refused on every rank)."""
    result = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the interrupt's and the resumable run's warnings
        for name, log_prob, run, at in (
            ("chains", signalling(100, signals), CHAINS_RUN, 0),
            ("pooled", signalling(30, signals), POOLED_RUN, 0),
            ("nuts", None, NUTS_RUN, 600),
        ):
            if log_prob is None:
                log_prob = ShardedPotential(
                    log_prior, signalling(at, signals, shard_log_lik), dim=DIM
                )
            options = run | {"checkpoint": f"{out}.{name}.ckpt", "checkpoint_every": 10}
            try:
                first = hmc.sample(log_prob, **options)
                result[f"{name}_first_draws"] = np.array(
                    -1 if first is None else first["posterior"].sizes["draw"]
                )
            except KeyboardInterrupt:  # in warmup: the checkpoint is written, no draws yet
                result[f"{name}_first_draws"] = np.array(0)
            if name == "chains":  # resume reads the settings from this rank's file
                again = hmc.resume(options["checkpoint"], log_prob, progress=False)
            else:
                again = hmc.sample(log_prob, **options)
            if again is not None:
                result[f"{name}_x"] = again["posterior"]["x"].values
    if signals:
        os.remove(f"{out}.nuts.ckpt.rank{dist.get_rank()}")
    dist.barrier()
    try:
        hmc.sample(log_prob, **options)
    except ValueError as error:
        result["refused"] = np.array(str(error))
    return result


def pooled_interrupts(signals: bool) -> dict[str, np.ndarray]:
    """Two chain-parallel ChEES runs with the pooled warmup, the last rank signalling in the
    first one's warmup and in the second one's sampling: how each ended on this rank."""
    common = dict(
        dim=2, chains=8, kernel="chees", adapt="ensemble", batched=True, seed=17,
        progress=False, compile=False,
    )  # fmt: skip
    try:
        hmc.sample(signalling(30, signals), warmup=100, draws=100, **common)
        warmup_stop = "finished"
    except KeyboardInterrupt:
        warmup_stop = "KeyboardInterrupt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the interrupt's warning
        tree = hmc.sample(signalling(300, signals), warmup=20, draws=300, **common)
    result = {"warmup_stop": np.array(warmup_stop)}
    if tree is not None:
        result["draws"] = np.array(tree["posterior"].sizes["draw"])
        result["interrupted"] = np.array(tree.attrs["interrupted"])
    return result


if __name__ == "__main__":
    mode, rank, world, port, out = sys.argv[1:]
    main(mode, int(rank), int(world), int(port), out)
