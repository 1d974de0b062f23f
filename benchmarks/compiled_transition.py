"""Benchmark: static HMC, ChEES and NUTS with their whole transition compiled, against eager.

For each posterior and (kernel, chains), one process runs ``hmc.sample`` with a fixed step
size, metric and trajectory length (``adapted_from`` a short adapted run, ``warmup=0``,
each chain starting at that run's last draw), so that eager and compiled runs integrate
the same trajectories: eager (``compile=False``) and compiled (``compile=True``, the
transition as one graph; NUTS: every chain's tree), alternately, ``--rounds`` times.
Reported: sampling seconds per chain-gradient (the ``sampling_time`` attribute over the
leapfrog steps of every chain, one gradient per step; the compiled NUTS computes more, as
every chain steps until the largest tree of the call ends, and those are not counted) of
each, their ratio, the compile seconds of the compiled run, and
how far apart the two runs' draws end up (they share the seed). Medians over the rounds;
one thread. Each compiled run compiles afresh (torch caches no ``while_loop`` graph on
disk); the compile column gives the first round's seconds and the median of the later
ones, which reuse what the process has loaded and built already.

Run from the repository root::

    python -m benchmarks.compiled_transition --rounds 3 --out transition-section.md
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import hmc
import hmc.models

try:
    from benchmarks.machine import machine
except ModuleNotFoundError:  # run as a plain file: its folder is on sys.path
    from machine import machine

#: (kernel name, chains) pairs measured by default
CASES = (("chees", 64), ("hmc", 4), ("nuts", 4))


def _kernel(name: str, adapted) -> hmc.HMC | hmc.NUTS:
    """The kernel with the adapted run's trajectory length (ChEES), Stan's default random
    number of steps (static HMC), or NUTS."""
    if name == "chees":
        length = float(np.median(adapted["adaptation"]["trajectory_length"].values))
        return hmc.ChEES(trajectory_length=length)
    return hmc.NUTS() if name == "nuts" else hmc.HMC()


def _adapted(model, kernel: str, chains: int):
    return hmc.sample(
        model, chains=chains, kernel=kernel, warmup=300, draws=10, seed=2, compile=False,
        progress=False,
    )  # fmt: skip


def _last_draws(model, adapted) -> dict[str, np.ndarray]:
    """Each chain's last draw of the adapted run, as ``init`` for the timed runs."""
    return {name: adapted["posterior"][name].values[:, -1] for name in model.names}


def _run(model, kernel, chains, adapted, draws, compile):
    started = time.process_time()
    dt = hmc.sample(
        model, _last_draws(model, adapted), chains=chains, kernel=kernel, warmup=0, draws=draws,
        seed=1, compile=compile, adapted_from=adapted, progress=False,
    )  # fmt: skip
    cpu = time.process_time() - started
    steps = int(dt["sample_stats"]["n_steps"].values.sum())
    return dt, dt.attrs["sampling_time"] / steps * 1e6, cpu, dt.attrs["compile_time"]


def _acceptance(dt) -> float:
    return float(dt["sample_stats"]["acceptance_rate"].values.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models",
        default="eight_schools-eight_schools_noncentered,kidiq-kidscore_interaction,arK-arK",
    )
    parser.add_argument("--draws", type=int, default=500)
    parser.add_argument(
        "--cases", default=",".join(f"{k}:{c}" for k, c in CASES), help="kernel:chains,..."
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    info = machine()
    lines = [
        f"{args.draws} draws per chain, fixed step size, metric and trajectory length, "
        f"medians of {args.rounds} interleaved rounds; {info['cpu']}, {info['nproc']} cores, "
        f"one thread, Python {info['python']}, torch {torch.__version__}.",
        "",
        "| posterior | kernel | chains | eager µs / chain-gradient | compiled | eager / "
        "compiled | compile s: first, later | largest draw difference | acceptance |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in args.models.split(","):
        model = hmc.models.load(name)
        for case in args.cases.split(","):
            kernel_name, chains = case.split(":")[0], int(case.split(":")[1])
            adapted = _adapted(model, kernel_name, chains)
            kernel = _kernel(kernel_name, adapted)
            times: dict[bool, list[float]] = {False: [], True: []}
            compile_seconds, difference = [], 0.0
            for _ in range(args.rounds):
                runs = {}
                for compile in (False, True):
                    dt, per_gradient, _, seconds = _run(
                        model, kernel, chains, adapted, args.draws, compile
                    )
                    times[compile].append(per_gradient)
                    runs[compile] = dt
                    if compile:
                        compile_seconds.append(seconds)
                for variable in runs[False]["posterior"].data_vars:
                    a = runs[False]["posterior"][variable].values
                    b = runs[True]["posterior"][variable].values
                    difference = max(difference, float(np.abs(a - b).max()))
            eager, compiled = (statistics.median(times[c]) for c in (False, True))
            lines.append(
                f"| {name} | {kernel_name} | {chains} | {eager:.2f} | {compiled:.3f} | "
                f"{eager / compiled:.1f} | {compile_seconds[0]:.1f}, "
                f"{statistics.median(compile_seconds[1:] or compile_seconds):.1f} | "
                f"{difference:.1e} | {_acceptance(runs[True]):.2f} |"
            )
            print(lines[-1], flush=True)
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    main()
