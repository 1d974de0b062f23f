"""The run's intra-op threads: one unless more are measured to make an evaluation
markedly faster, never a count the user set, restored after the run."""

from __future__ import annotations

import time

import pytest
import torch

import hmc
import hmc.threads
from hmc.threads import SPEEDUP_FOR_MORE, run_threads


@pytest.fixture
def unset_threads(monkeypatch):
    """As on a machine where the user set nothing: torch's default of two threads."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setattr(hmc.threads, "DEFAULT_THREADS", 2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def evaluation_taking(seconds_by_threads):
    def evaluate():
        time.sleep(seconds_by_threads[torch.get_num_threads()])

    return evaluate


@pytest.mark.parametrize(
    ("one", "two", "kept"),
    [(0.01, 0.01, 1), (0.01, 0.008, 1), (0.03, 0.01, 2)],
    ids=["no faster", "a little faster", "three times faster"],
)
def test_more_threads_are_kept_only_where_they_make_an_evaluation_much_faster(
    unset_threads, one, two, kept
):
    assert (one / two >= SPEEDUP_FOR_MORE) == (kept == 2)
    with run_threads(evaluation_taking({1: one, 2: two})) as choice:
        assert torch.get_num_threads() == kept
        assert choice.startswith(f"{kept} (an evaluation")
    assert torch.get_num_threads() == 2  # restored


def test_a_count_the_user_set_is_kept(unset_threads, monkeypatch):
    calls = []
    torch.set_num_threads(1)  # the user's, not torch's default of two
    with run_threads(lambda: calls.append(1)) as choice:
        assert torch.get_num_threads() == 1 and choice == "1 (as set)"
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(2)
    with run_threads(lambda: calls.append(1)) as choice:
        assert torch.get_num_threads() == 2 and choice == "2 (as set)"
    assert not calls  # nothing timed


def test_a_run_records_its_threads_and_counts_no_timed_evaluation(unset_threads):
    """A small density: one thread; the timing evaluations are not gradients of the run."""
    options = dict(dim=2, chains=2, warmup=0, draws=10, step_size=0.5, seed=1, progress=False)
    dt = hmc.sample(lambda q: -0.5 * (q**2).sum(), kernel=hmc.HMC(num_steps=3), **options)
    assert dt.attrs["threads"].startswith("1 (an evaluation")
    assert dt.attrs["n_gradient_evaluations"] == 2 * (1 + 10 * 3)
    assert torch.get_num_threads() == 2
