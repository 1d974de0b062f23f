"""Benchmark: NUTS cost per tick (one leapfrog step of every chain), against another revision.

Times ``hmc.sample`` with the default NUTS kernel (Stan warmup, 300 + 300 iterations,
``batched=True``) on the 2-D correlated Gaussian at 1 and 4 chains and on the demo's
non-centred eight schools at 4 chains, and reports CPU microseconds per tick (process CPU
time over gradient evaluations per chain). With ``--against REV`` the NUTS kernel of git
revision ``REV`` (its ``hmc/kernels/nuts.py``, loaded beside the current package) runs in
the same process, interleaved with the current one, so the ratio is measured side by side;
the script also checks that both give bit-identical draws.

Run from the repository root::

    python -m benchmarks.nuts_tick --against HEAD~1 --reps 3
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import hmc
from hmc.demo import eight_schools

try:
    from benchmarks.machine import machine
except ModuleNotFoundError:  # run as a plain file: its folder is on sys.path
    from machine import machine

PRECISION = torch.tensor([[10.25, -9.74], [-9.74, 10.25]], dtype=torch.float64)


def gauss2d(q: torch.Tensor) -> torch.Tensor:
    """Batched log density ``(C, 2) -> (C,)`` of the correlated 2-D Gaussian."""
    return -0.5 * ((q @ PRECISION) * q).sum(-1)


CASES = {
    "gauss2d, 1 chain": (gauss2d, 2, 1),
    "gauss2d, 4 chains": (gauss2d, 2, 4),
    "eight schools, 4 chains": (eight_schools().log_prob, 10, 4),
}


def kernel_at(revision: str) -> type:
    """The ``NUTS`` class of ``hmc/kernels/nuts.py`` at git ``revision``."""
    source = subprocess.run(
        ["git", "show", f"{revision}:hmc/kernels/nuts.py"], capture_output=True, text=True,
        check=True, cwd=Path(__file__).resolve().parents[1],
    ).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "nuts_at_revision.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("nuts_at_revision", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.NUTS


def time_one(kernel, case: str, iterations: int, seed: int) -> tuple[float, np.ndarray]:
    """(CPU µs per tick, draws) of one run."""
    log_prob, dim, chains = CASES[case]
    started = time.process_time()
    dt = hmc.sample(
        log_prob, dim=dim, chains=chains, warmup=iterations, draws=iterations, seed=seed,
        batched=True, progress=False, kernel=kernel,
    )  # fmt: skip
    seconds = time.process_time() - started
    ticks = int(dt.attrs["n_gradient_evaluations"]) / chains
    return seconds / ticks * 1e6, dt["posterior"]["x"].values


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", default=None, help="git revision to compare with")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=300, help="warmup = draws = this")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    kernels = {"current": hmc.NUTS()}
    if args.against:
        kernels[args.against] = kernel_at(args.against)()
    times: dict[tuple[str, str], list[float]] = {}
    identical = True
    for rep in range(args.reps):
        for case in CASES:
            draws = []
            order = list(kernels.items())[:: -1 if rep % 2 else 1]  # alternate who goes first
            for label, kernel in order:
                us, x = time_one(kernel, case, args.iterations, seed=rep)
                times.setdefault((case, label), []).append(us)
                draws.append(x)
            identical &= all(np.array_equal(draws[0], x) for x in draws[1:])
    info = {**machine(), "torch": torch.__version__}
    print(
        f"Machine: {', '.join(f'{k} {v}' for k, v in info.items())}. CPU µs per tick, medians "
        f"of {args.reps} interleaved runs (alternating order), "
        f"{args.iterations} + {args.iterations} iterations.\n"
    )
    labels = list(kernels)
    header = "| case | " + " | ".join(f"{label} (µs / tick)" for label in labels)
    print(header + (" | ratio |" if len(labels) > 1 else " |"))
    print("|---" * (len(labels) + 1 + (len(labels) > 1)) + "|")
    for case in CASES:
        medians = [statistics.median(times[(case, label)]) for label in labels]
        ratio = f" | {medians[1] / medians[0]:.2f}" if len(labels) > 1 else ""
        print(f"| {case} | " + " | ".join(f"{m:.0f}" for m in medians) + ratio + " |")
    if len(labels) > 1:
        print(f"\nDraws bit-identical between the two kernels: {identical}.")


if __name__ == "__main__":
    main()
