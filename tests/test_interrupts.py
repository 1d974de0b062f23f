"""Interrupted runs: Ctrl-C (SIGINT) and SIGTERM during sampling return the draws so far,
during warmup they raise saying no draws exist. Each case runs ``hmc.sample`` in a
subprocess, signals it once it is sampling, and compares what it returned with an
uninterrupted run of the same seed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import hmc

CHILD = textwrap.dedent(
    """
    import json, sys, warnings
    import numpy as np, torch
    import hmc

    warmup, draws = int(sys.argv[1]), int(sys.argv[2])
    ticks = [0]

    def log_prob(q):
        ticks[0] += 1
        if ticks[0] == 50:  # sampling (or warming up) for a while: the parent may signal
            print("running", flush=True)
        return -0.5 * (q**2).sum(-1) - 0.5 * (q[..., 0] / 3) ** 2

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            dt = hmc.sample(log_prob, dim=3, chains=3, warmup=warmup, draws=draws,
                            step_size=None if warmup else 0.6, seed=5, batched=True,
                            progress=False, compile=False)
        except KeyboardInterrupt as error:
            print(json.dumps({"raised": str(error)}), flush=True)
            sys.exit(0)
    x = dt["posterior"]["x"].values
    print(json.dumps({
        "x": x.tolist(),
        "interrupted": int(dt.attrs["interrupted"]),
        "finite": bool(np.isfinite(x).all()),
        "warnings": [str(w.message) for w in caught if "interrupted" in str(w.message)],
    }), flush=True)
    """
)


def run_interrupted(signum: int, warmup: int, draws: int) -> dict:
    """Start the child, send ``signum`` 1.5 s after it reports it is running, return
    its JSON line."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(warmup), str(draws)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout.readline().strip() == "running", child.stderr.read()
        time.sleep(1.5)
        child.send_signal(signum)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_during_sampling_returns_the_draws_so_far(signum):
    """The interrupted run returns the draws every chain completed, and they are the
    uninterrupted run's first draws, bit for bit (a chain's random numbers depend only on
    the seed, the chain and the transition)."""
    draws = 1_000_000  # never finishes on its own
    result = run_interrupted(signum, 0, draws)
    x = np.array(result["x"])
    kept = x.shape[1]
    assert 0 < kept < draws
    assert result["interrupted"] == 1 and result["finite"]
    assert len(result["warnings"]) == 1 and f"the {kept} of {draws} draws" in result["warnings"][0]
    reference = hmc.sample(
        lambda q: -0.5 * (q**2).sum(-1) - 0.5 * (q[..., 0] / 3) ** 2,
        dim=3,
        chains=3,
        warmup=0,
        draws=kept,
        step_size=0.6,
        seed=5,
        batched=True,
        progress=False,
        compile=False,
    )
    assert reference.attrs["interrupted"] == 0
    np.testing.assert_array_equal(x, reference["posterior"]["x"].values)


def test_interrupt_during_warmup_raises_saying_no_draws_exist():
    result = run_interrupted(signal.SIGINT, 1_000_000, 10)
    assert "during warmup: no draws exist yet" in result["raised"]
    assert "3 of 3 chains" in result["raised"]
