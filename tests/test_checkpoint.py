"""Checkpoints: a killed run resumes to the uninterrupted result, a kill during a write
leaves the previous checkpoint whole, and bad files or another run's file are named."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest
import torch
from conftest import minor_mode_log_prob

import hmc
from hmc.checkpoint import FORMAT, raw_payload, read_checkpoint

SETTINGS = dict(dim=3, chains=3, warmup=150, draws=150, seed=5, batched=True, progress=False)


def log_prob(q):
    return -0.5 * (q**2).sum(-1) - 0.5 * (q[..., 0] / 3) ** 2


def same_run(a, b) -> None:
    """Bit for bit: the draws, every statistic and the adapted parameters."""
    np.testing.assert_array_equal(a["posterior"]["x"].values, b["posterior"]["x"].values)
    for name in a["sample_stats"].data_vars:
        np.testing.assert_array_equal(
            a["sample_stats"][name].values, b["sample_stats"][name].values, err_msg=name
        )
    for name in ("step_size", "inverse_metric"):
        np.testing.assert_array_equal(a["adaptation"][name].values, b["adaptation"][name].values)
    assert a.attrs["n_gradient_evaluations"] == b.attrs["n_gradient_evaluations"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """NUTS runs with checkpoints every 20 iterations, never interrupted, per engine."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    return {
        engine: hmc.sample(
            log_prob,
            engine=engine,
            checkpoint=folder / f"{engine}.ckpt",
            checkpoint_every=20,
            **SETTINGS,
        )
        for engine in ("numpy", "torch")
    }


CHILD = textwrap.dedent(
    """
    import sys
    import torch
    import hmc, hmc.checkpoint

    path, engine, die_at_write = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if die_at_write:  # SIGKILL in the middle of that checkpoint write
        writes, save = [0], torch.save

        def dying_save(payload, target):
            writes[0] += isinstance(target, str)  # a file (not the payload's own bytes)
            if writes[0] == die_at_write:
                with open(target, "wb") as file:
                    file.write(b"half a checkpoint")
                import os, signal
                os.kill(os.getpid(), signal.SIGKILL)
            save(payload, target)

        hmc.checkpoint.torch.save = dying_save

    def log_prob(q):
        return -0.5 * (q**2).sum(-1) - 0.5 * (q[..., 0] / 3) ** 2

    hmc.sample(log_prob, dim=3, chains=3, warmup=150, draws=150, seed=5, batched=True,
               progress=False, engine=engine, checkpoint=path, checkpoint_every=20)
    """
)


def start_child(path, engine: str, die_at_write: int = 0) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), engine, str(die_at_write)],
        stderr=subprocess.PIPE,
        env=env,
    )


@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_a_run_killed_mid_sampling_resumes_to_the_uninterrupted_result(
    engine, tmp_path, uninterrupted
):
    path = tmp_path / "run.ckpt"
    child = start_child(path, engine)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and child.poll() is None:
            if path.exists() and read_checkpoint(path)["iteration"] >= 160:  # sampling
                break
            time.sleep(0.05)
        assert child.poll() is None, child.stderr.read().decode()[-2000:]
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    killed_at = read_checkpoint(path)["iteration"]
    assert 160 <= killed_at < 300
    resumed = hmc.resume(path, log_prob)
    same_run(resumed, uninterrupted[engine])
    # the finished run's checkpoint gives its result at once, the same again
    started = time.perf_counter()
    again = hmc.sample(log_prob, engine=engine, checkpoint=path, checkpoint_every=20, **SETTINGS)
    assert time.perf_counter() - started < 5
    same_run(again, resumed)


def interrupt_after(path, stop_at: int, target, settings: dict) -> None:
    """Run ``target`` with checkpoints at ``path`` until one at iteration ``stop_at`` or
    later is written, then interrupt it (Ctrl-C)."""

    def interrupted(q):
        if path.exists() and read_checkpoint(path)["iteration"] >= stop_at:
            raise KeyboardInterrupt
        return target(q)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.suppress(KeyboardInterrupt):
            hmc.sample(interrupted, checkpoint=path, **settings)


@pytest.mark.parametrize(
    "kernel", [pytest.param("nuts", marks=pytest.mark.slow), "chees", "mams"]
)  # (NUTS: 10 s, in the slow tier; ChEES, 4 s, checks the same resume in the quick one;
# MAMS, stopped at 170 in its trajectory-length stage, 160-179)
def test_a_pooled_warmup_resumes_to_the_uninterrupted_result(kernel, tmp_path):
    """Interrupted before the early stop, after it (in the terminal buffer) and while
    sampling, the pooled warmup (and ChEES's trajectory length) goes on from its
    checkpoint to the uninterrupted run, its skipped iterations included (and ChEES's and
    MAMS's trajectory lengths)."""
    settings = dict(
        dim=3, chains=64, warmup=200, draws=40, seed=3, batched=True, progress=False,
        adapt="ensemble", kernel=kernel, checkpoint_every=10,
    )  # fmt: skip
    whole = hmc.sample(log_prob, checkpoint=tmp_path / "whole.ckpt", **settings)
    assert whole.attrs["tuning_steps"] == 120  # the early stop skipped 80-159
    for stop_at in (60, 80, 170, 220):  # before the skip, at it, after it, sampling
        path = tmp_path / f"{stop_at}.ckpt"
        interrupt_after(path, stop_at, log_prob, settings)
        written = read_checkpoint(path)["iteration"]  # the skip's goes on at 160
        assert written == 160 if stop_at == 80 else stop_at <= written < stop_at + 10
        resumed = hmc.resume(path, log_prob)
        same_run(resumed, whole)
        assert resumed.attrs["tuning_steps"] == 120
        if kernel != "nuts":  # the learnt trajectory length
            np.testing.assert_array_equal(
                resumed["adaptation"]["trajectory_length"].values,
                whole["adaptation"]["trajectory_length"].values,
            )


def test_a_restart_of_a_stranded_chain_resumes_to_the_uninterrupted_run(tmp_path):
    """Stan's warmup restarts chain 0, stranded at a minor mode, at its first window's end
    (iteration 100): interrupted in that window (its log-density moments are in the
    checkpoint) or after the restart, the run resumes to the uninterrupted one."""
    init = torch.zeros(4, 2, dtype=torch.float64)
    init[0, 0] = 20.0
    settings = dict(
        dim=2, chains=4, warmup=150, draws=60, seed=9, batched=True, progress=False,
        init=init, compile=False, checkpoint_every=30,
    )  # fmt: skip
    with pytest.warns(RuntimeWarning, match=r"chains \[0\] stayed far below"):
        whole = hmc.sample(minor_mode_log_prob, checkpoint=tmp_path / "whole.ckpt", **settings)
    for stop_at in (90, 120):  # before the restart, after it
        path = tmp_path / f"{stop_at}.ckpt"
        interrupt_after(path, stop_at, minor_mode_log_prob, settings)
        assert stop_at <= read_checkpoint(path)["iteration"] < stop_at + 30
        with pytest.warns(RuntimeWarning, match=r"chains \[0\] stayed far below"):
            resumed = hmc.resume(path, minor_mode_log_prob)
        same_run(resumed, whole)
        assert list(resumed.attrs["restarted_chains"]) == [0]


def test_a_checkpoint_of_the_first_layout_still_reads(tmp_path):
    """Checkpoints written before the pooled warmup could be saved (format 1: Stan's
    warmup state as lists, no adapt setting) still resume."""
    path = tmp_path / "run.ckpt"
    settings = dict(SETTINGS, warmup=40, draws=20)
    whole = hmc.sample(log_prob, checkpoint=path, checkpoint_every=20, **settings)
    payload = raw_payload(path)
    adaptation = payload["adaptation"]["fields"]
    payload["adaptation"] = {
        "dual_averaging": list(adaptation["dual_averaging"].values()),
        "welford": list(adaptation["welford"].values()),
        "search_counter": adaptation["search_counter"],
    }
    payload["format"] = ["hmc-checkpoint", 1]
    for name in ("trajectory_length", "skipped"):
        del payload[name]
    torch.save(payload, path)
    same_run(hmc.resume(path, log_prob), whole)


def test_a_checkpoint_from_before_the_stranded_restarts_still_reads(tmp_path):
    """Stan's warmup state written before it kept each window's log density (and the
    restarted chains) resumes: the window's log density counts from the resume on."""
    path = tmp_path / "run.ckpt"
    settings = dict(SETTINGS, warmup=40, draws=20)
    whole = hmc.sample(log_prob, checkpoint=path, checkpoint_every=20, **settings)
    payload = raw_payload(path)
    for name in ("log_density", "restarted"):
        del payload["adaptation"]["fields"][name]
    torch.save(payload, path)
    same_run(hmc.resume(path, log_prob), whole)


def test_a_kill_during_a_checkpoint_write_leaves_the_previous_one(tmp_path, uninterrupted):
    path = tmp_path / "run.ckpt"
    child = start_child(path, "numpy", die_at_write=4)
    child.wait(timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr.read().decode()[-2000:]
    assert read_checkpoint(path)["iteration"] == 60  # the third checkpoint, whole
    resumed = hmc.resume(path, log_prob)
    same_run(resumed, uninterrupted["numpy"])


def test_interrupted_run_says_how_to_go_on(tmp_path):
    """Ctrl-C after a checkpoint: the warning names hmc.resume and the file."""
    path = tmp_path / "run.ckpt"
    calls = [0]

    def interrupting(q):
        calls[0] += 1
        if calls[0] % 20 == 0 and path.exists() and read_checkpoint(path)["iteration"] >= 160:
            raise KeyboardInterrupt  # well into sampling
        return log_prob(q)

    with pytest.warns(RuntimeWarning, match=r"hmc\.resume") as records:
        dt = hmc.sample(interrupting, checkpoint=path, checkpoint_every=20, **SETTINGS)
    assert any(str(path) in str(r.message) for r in records)
    assert dt.attrs["interrupted"] and 10 <= dt["posterior"].sizes["draw"] < 150


def test_checkpoint_of_another_run_is_refused_naming_the_difference(tmp_path):
    path = tmp_path / "run.ckpt"
    hmc.sample(log_prob, checkpoint=path, **{**SETTINGS, "warmup": 20, "draws": 20})
    with pytest.raises(ValueError, match=r"belongs to another run.*draws: 20 there, 30 here"):
        hmc.sample(log_prob, checkpoint=path, **{**SETTINGS, "warmup": 20, "draws": 30})


def test_bad_files_are_named(tmp_path):
    good = tmp_path / "good.ckpt"
    hmc.sample(log_prob, checkpoint=good, **{**SETTINGS, "warmup": 20, "draws": 20})
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"weights": torch.ones(2)}, foreign)
    pickled = tmp_path / "pickled.ckpt"
    torch.save({"format": ["hmc-checkpoint", 1], "object": warnings.WarningMessage}, pickled)
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    hollow = tmp_path / "hollow.ckpt"  # the marker, none of the contents
    torch.save({"format": list(FORMAT)}, hollow)
    for path, match in (
        (truncated, "cannot be read"),
        (foreign, "is not an hmc checkpoint"),
        (pickled, "cannot be read"),  # weights_only: no arbitrary object is unpickled
        (empty, "cannot be read"),
        (hollow, "incomplete or damaged"),
    ):
        with pytest.raises(ValueError, match=match) as info:
            hmc.resume(path, log_prob)
        assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"checkpoint_every": 10}, "checkpoint_every needs checkpoint"),
        ({"checkpoint": "/no/such/folder/run.ckpt"}, "existing, writable folder"),
        ({"checkpoint": 3}, "checkpoint must be a file path"),
        ({"checkpoint": "x.ckpt", "checkpoint_every": 0}, "checkpoint_every must be"),
    ],
)
def test_checkpoint_arguments_are_checked(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        hmc.sample(log_prob, **SETTINGS, **kwargs)


def test_a_checkpoint_is_refused_for_another_density_or_dimension(tmp_path):
    """The potential at the saved positions and the dimension are checked against the
    call: a checkpoint of another density would mix two posteriors' draws."""
    path = tmp_path / "run.ckpt"
    options = dict(chains=2, warmup=20, draws=20, seed=1, progress=False, compile=False)

    def four(q):
        return -0.5 * (q**2).sum()

    def wider(q):
        return -0.5 * (q**2).sum() / 4.0

    hmc.sample(four, dim=4, checkpoint=path, **options)
    with pytest.raises(ValueError, match="written for dimension 4, this run's density has 3"):
        hmc.sample(four, dim=3, checkpoint=path, **options)
    with pytest.raises(ValueError, match="written for another log_prob"):
        hmc.resume(path, wider)
    assert hmc.resume(path, four)["posterior"].sizes["x_dim_0"] == 4  # its own: accepted


def test_a_checkpoint_with_flipped_bytes_is_refused(tmp_path):
    """torch's zip reader checks no checksum: the checkpoint's own SHA-256 does. Every
    copy with a few bytes flipped is refused, naming the file, none resumes."""
    good = tmp_path / "good.ckpt"
    hmc.sample(log_prob, checkpoint=good, **{**SETTINGS, "warmup": 20, "draws": 20})
    data = bytearray(good.read_bytes())
    generator = np.random.default_rng(0)
    for copy in range(20):
        damaged = bytearray(data)
        for at in generator.integers(0, len(data), size=4):
            damaged[at] ^= 0xFF
        path = tmp_path / f"damaged{copy}.ckpt"
        path.write_bytes(bytes(damaged))
        with pytest.raises(ValueError, match=r"corrupted|cannot be read|incomplete") as info:
            hmc.resume(path, log_prob)
        assert str(path) in str(info.value)
