"""Runs under a torch.distributed process group: two gloo processes on loopback, started
here (tests/distributed_worker.py), bounded in time and killed on failure."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import hmc
from hmc.distributed import chain_share

sys.path.insert(0, str(Path(__file__).parent))
import distributed_worker as worker

WORKER = Path(__file__).parent / "distributed_worker.py"
pytestmark = pytest.mark.slow


def launch(
    mode: str, out: Path, world: int = 2, limit: float = 120, wait_for: int | None = None
) -> list[int | None]:
    """Run ``world`` ranks of the worker in ``mode``; their exit codes, None for those
    still running when the first ``wait_for`` ranks (all by default) have ended (they are
    killed)."""
    with socket.socket() as probe:  # a free port for the group's rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ranks = [
        subprocess.Popen(
            [sys.executable, str(WORKER), mode, str(rank), str(world), str(port), str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={"OMP_NUM_THREADS": "1", **os.environ},
        )
        for rank in range(world)
    ]
    deadline = time.monotonic() + limit
    try:
        for rank in ranks[:wait_for]:
            rank.wait(timeout=max(deadline - time.monotonic(), 1))
        return [rank.poll() for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()


def test_chains_are_split_in_contiguous_blocks():
    shares = [chain_share(7, rank, 3) for rank in range(3)]
    assert shares == [range(0, 3), range(3, 5), range(5, 7)]
    with pytest.raises(ValueError, match="chains must be at least the number of ranks"):
        chain_share(2, 0, 3)


def test_chain_parallel_run_equals_one_process_chain_for_chain(tmp_path):
    out = tmp_path / "chains.npz"
    assert launch("chains", out) == [0, 0]
    got = np.load(out)
    alone = hmc.sample(worker.elementwise, **worker.CHAINS_RUN)
    assert got["ranks"] == 2
    np.testing.assert_array_equal(got["chain"], np.arange(5))
    np.testing.assert_allclose(got["x"], alone["posterior"]["x"].values, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got["lp"], alone["sample_stats"]["lp"].values, rtol=0, atol=1e-12)
    assert got["evaluations"] == alone.attrs["n_gradient_evaluations"]


def test_pooled_warmup_across_ranks_equals_one_process_chain_for_chain(tmp_path):
    """ChEES and NUTS with the pooled warmup, 8 chains on two ranks, one stranded on rank 0:
    the same step size, metric and restarts as in one process (the stranded chain restarts
    from a chain on rank 1), and the same draws."""
    out = tmp_path / "ensemble.npz"
    with pytest.warns(RuntimeWarning, match="stayed far below"):
        alone = worker.ensemble_runs()
    assert launch("ensemble", out) == [0, 0]
    got = np.load(out)
    for kernel, tree in alone.items():
        assert list(tree.attrs["restarted_chains"]) == [worker.STRANDED]
        np.testing.assert_array_equal(got[f"{kernel}_restarted"], [worker.STRANDED])
        assert got[f"{kernel}_warmup"] == tree.attrs["tuning_steps"]
        for name, value in (
            ("step_size", tree["adaptation"]["step_size"].values),
            ("inverse_metric", tree["adaptation"]["inverse_metric"].values),
            ("x", tree["posterior"]["x"].values),
        ):
            np.testing.assert_allclose(got[f"{kernel}_{name}"], value, rtol=1e-12, atol=1e-12)


def full_data_log_prob():
    X, y = worker.logistic_data()
    full = worker.log_lik(X, y)
    return lambda beta: worker.log_prior(beta) + full(beta)


def test_sharded_gradient_equals_the_full_data_gradient(tmp_path):
    out = tmp_path / "gradient.npz"
    assert launch("gradient", out) == [0, 0]
    got = np.load(out)
    potential = hmc.Potential(full_data_log_prob(), compile=False)
    U, grad = potential.value_and_grad(torch.from_numpy(got["q"]))
    np.testing.assert_allclose(got["U"], U.numpy(), rtol=1e-12)
    np.testing.assert_allclose(got["grad"], grad.numpy(), rtol=1e-12, atol=1e-12)


def test_data_parallel_nuts_equals_the_one_process_run(tmp_path):
    out = tmp_path / "nuts.npz"
    assert launch("nuts", out) == [0, 0]
    got = np.load(out)
    alone = hmc.sample(full_data_log_prob(), dim=worker.DIM, **worker.NUTS_RUN)
    # the same trees, and the same draws up to the rounding of the likelihood's sum taken in
    # two parts, grown through 100 iterations of adaptation (measured: 2.3e-8 at most)
    np.testing.assert_array_equal(got["n_steps"], alone["sample_stats"]["n_steps"].values)
    np.testing.assert_allclose(got["x"], alone["posterior"]["x"].values, rtol=0, atol=1e-6)


def test_an_interrupt_at_one_rank_stops_every_rank_of_a_data_parallel_run_together(tmp_path):
    """Ctrl-C at the last rank alone, mid-sampling: its request rides along the next
    all-reduce, so both ranks stop at the same kernel call and return the same draws, the
    interrupted run's (without the agreement the last rank stops first and rank 0 meets
    RankFailure at its next all-reduce)."""
    out = tmp_path / "interrupt.npz"
    assert launch("interrupt", out) == [0, 0]
    first, last = (np.load(f"{out}.rank{rank}.npz") for rank in (0, 1))
    assert first["interrupted"] and last["interrupted"]
    assert 0 < first["x"].shape[1] < 300  # some draws, not all
    for name in ("x", "lp", "n_steps"):
        np.testing.assert_array_equal(first[name], last[name])


def test_an_interrupt_at_one_rank_stops_a_pooled_warmup_on_every_rank(tmp_path):
    """Chain-parallel runs with the pooled warmup, SIGINT to the last rank alone. In warmup
    its request rides along the next gathering, so every rank stops there and raises
    KeyboardInterrupt (no draws exist yet); without the agreement rank 0 would wait on the
    next gathering and meet RankFailure. In sampling the ranks no longer meet: the last
    rank stops, rank 0 runs on, and the run it returns is the interrupted one's."""
    out = tmp_path / "pooled.npz"
    assert launch("pooled_interrupt", out) == [0, 0]
    first, last = (np.load(f"{out}.rank{rank}.npz") for rank in (0, 1))
    assert str(first["warmup_stop"]) == str(last["warmup_stop"]) == "KeyboardInterrupt"
    assert first["interrupted"] and 0 < int(first["draws"]) < 300
    assert "draws" not in last  # the other ranks return None


def test_checkpoints_under_a_process_group_resume_each_rank(tmp_path):
    """Each rank keeps its own checkpoint (``PATH.rank<r>``). The last rank alone is
    interrupted mid-run with checkpoints on, then ``hmc.resume`` or the same call goes on,
    and the whole run equals the uninterrupted one-process run: chain-parallel static HMC
    and ChEES interrupted in its pooled warmup to rounding, data-parallel NUTS to the
    likelihood sum's order (as without checkpoints). Ranks that meet during a run refuse
    to resume from files at different iterations."""
    out = tmp_path / "ckpt"
    assert launch("checkpoint", out, limit=240) == [0, 0]
    first, last = (np.load(f"{out}.rank{rank}.npz") for rank in (0, 1))
    assert 0 < int(first["chains_first_draws"]) < 50  # rank 0 gathered the interrupted run
    assert int(last["chains_first_draws"]) == -1  # the other ranks return None
    alone = hmc.sample(worker.elementwise, **worker.CHAINS_RUN)
    np.testing.assert_allclose(first["chains_x"], alone["posterior"]["x"].values, atol=1e-9)
    assert int(first["pooled_first_draws"]) == int(last["pooled_first_draws"]) == 0  # warmup
    alone = hmc.sample(worker.elementwise, **worker.POOLED_RUN)
    np.testing.assert_allclose(first["pooled_x"], alone["posterior"]["x"].values, atol=1e-9)
    assert int(first["nuts_first_draws"]) < 100
    np.testing.assert_array_equal(first["nuts_x"], last["nuts_x"])
    full = hmc.sample(full_data_log_prob(), dim=worker.DIM, **worker.NUTS_RUN)
    np.testing.assert_allclose(first["nuts_x"], full["posterior"]["x"].values, atol=1e-6)
    for got in (first, last):
        assert "the ranks' files stand at different iterations" in str(got["refused"])
        assert "(rank 0: 200, rank 1: None;" in str(got["refused"])


def test_a_killed_rank_stops_the_others_with_a_clear_error(tmp_path):
    out = tmp_path / "kill.npz"
    started = time.monotonic()
    codes = launch("kill", out, limit=90)
    assert codes[1] == 9
    assert codes[0] == 3, codes  # rank 0 met RankFailure, and did not hang
    assert time.monotonic() - started < 60
    message = Path(f"{out}.rank0.failure").read_text()
    assert "another rank stopped" in message and "all-reduce" in message


def test_a_stalled_rank_stops_the_others_at_the_groups_timeout(tmp_path):
    """The last rank stops answering but keeps its connections open: rank 0 waits no
    longer than the group's timeout, then raises RankFailure (the stalled rank is killed
    by the test)."""
    out = tmp_path / "stall.npz"
    started = time.monotonic()
    codes = launch("stall", out, limit=worker.STALL_TIMEOUT + 60, wait_for=1)
    elapsed = time.monotonic() - started
    assert codes == [3, None], codes  # rank 0 met RankFailure; the stalled rank still waits
    assert worker.STALL_TIMEOUT < elapsed < worker.STALL_TIMEOUT + 45
    message = Path(f"{out}.rank0.failure").read_text()
    assert "did not answer within the process group's timeout" in message
