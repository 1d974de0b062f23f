"""Benchmark: whole ``hmc.sample`` runs of this tree against another git revision.

For each configuration (kernel, target, number of chains) both trees run the same call
(same seed, settings and density, one thread) in fresh subprocesses, alternating which
goes first, ``--reps`` times each; the table gives the median CPU time per leapfrog step of
a chain (the run's CPU seconds over ``n_gradient_evaluations / chains``) and the ratio
this / other. Both trees' packages are imported from their own source folders, so the
comparison covers everything a user's call runs: driver, kernel, adaptation, recording,
the output. Each subprocess first makes a short call that pays the lazy imports (about
0.8 s here, the same for both trees), so that this fixed cost does not swamp the per-step
figures of short runs.

    python benchmarks/against.py --against 66a3668 --reps 5 --out against.md
    python benchmarks/against.py --against 66a3668 --reps 1 --only hmc   # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.machine import machine  # noqa: E402

#: (kernel, target, chains, warmup, draws, engine): the engine is passed to a tree whose
#: ``hmc.sample`` takes one (None: the default)
CONFIGS = [
    ("nuts", "gauss2d", 1, 300, 300, None),
    ("nuts", "gauss2d", 4, 300, 300, None),
    ("nuts", "eight_schools", 4, 300, 300, None),
    ("nuts", "eight_schools", 16, 200, 200, None),
    ("nuts", "gauss2d", 128, 100, 100, None),
    ("nuts", "gauss2d", 1024, 50, 50, None),
    ("nuts", "gauss2d", 1024, 50, 50, "torch"),
    ("hmc", "gauss2d", 1, 300, 300, None),
    ("hmc", "gauss2d", 4, 300, 300, None),
    ("hmc", "gauss2d", 1024, 100, 100, None),
]

WORKER = r"""
import inspect, json, sys, time
import torch
torch.set_num_threads(1)
import hmc

kernel_name, target, chains, warmup, draws, engine = json.loads(sys.argv[1])
options = {}
if engine and "engine" in inspect.signature(hmc.sample).parameters:
    options["engine"] = engine

def gauss2d(q):
    return -0.5 * (q[0] ** 2 + (q[1] / 3.0) ** 2)

Y = torch.tensor([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0], dtype=torch.float64)
S = torch.tensor([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0], dtype=torch.float64)

def eight_schools(q):
    mu, log_tau, eta = q[0], q[1], q[2:]
    theta = mu + torch.exp(log_tau) * eta
    return (-0.5 * (mu / 5) ** 2 - 0.5 * (torch.exp(log_tau) / 5) ** 2 + log_tau
            - 0.5 * (eta ** 2).sum() - 0.5 * (((Y - theta) / S) ** 2).sum())

log_prob, dim = {"gauss2d": (gauss2d, 2), "eight_schools": (eight_schools, 10)}[target]
kernel = hmc.HMC(num_steps=10) if kernel_name == "hmc" else hmc.NUTS()
# a short call first pays the lazy imports (ArviZ, xarray), the same for both trees
hmc.sample(log_prob, dim=dim, chains=chains, warmup=5, draws=5, seed=2, kernel=kernel,
           progress=False, **options)
started = time.process_time()
dt = hmc.sample(log_prob, dim=dim, chains=chains, warmup=warmup, draws=draws, seed=1,
                kernel=kernel, progress=False, **options)
seconds = time.process_time() - started
print(json.dumps({"seconds": seconds, "gradients": dt.attrs["n_gradient_evaluations"],
                  "engine": dt.attrs.get("engine")}))
"""


def run(source: Path, config: tuple) -> tuple[float, str | None]:
    """CPU µs per leapfrog step of a chain for one run of ``config`` with the package in
    ``source``, and the engine the run recorded (None for a tree without engines)."""
    env = dict(os.environ, PYTHONPATH=str(source), OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", WORKER, json.dumps(config)],
        env=env,
        cwd=source,
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    chains = config[2]
    return 1e6 * result["seconds"] / (result["gradients"] / chains), result.get("engine")


def revision_tree(revision: str, folder: Path) -> Path:
    """The package of ``revision`` unpacked into ``folder``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "hmc"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="git revision to compare with")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", default=None, help="kernel name to run alone (nuts or hmc)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        f"`python benchmarks/against.py --against {args.against} --reps {args.reps}"
        + (f" --only {args.only}" if args.only else "")
        + "` "
        f"(this tree at {head}, with uncommitted changes if any)",
        "",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in machine().items()) + ", one thread.",
        "",
        "| kernel | target | chains | warmup + draws | engine (recorded: this / other) | "
        "this (µs / step) | "
        f"{args.against} (µs / step) | this / {args.against} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        other = revision_tree(args.against, Path(tmp))
        for config in CONFIGS:
            if args.only and config[0] != args.only:
                continue
            times: dict[str, list[float]] = {"this": [], "other": []}
            engines: dict[str, str | None] = {}
            for rep in range(args.reps):
                order = (("this", ROOT), ("other", other))
                for name, source in order if rep % 2 == 0 else order[::-1]:
                    us, engines[name] = run(source, config)
                    times[name].append(us)
            this, before = (statistics.median(times[k]) for k in ("this", "other"))
            kernel, target, chains, warmup, draws, engine = config
            row = (
                f"| {kernel} | {target} | {chains} | {warmup} + {draws} | "
                f"{engine or 'default'} ({engines['this']} / {engines['other'] or '-'}) "
                f"| {this:.1f} | "
                f"{before:.1f} | {this / before:.2f} |"
            )
            print(row, flush=True)
            lines.append(row)
    lines.append("")
    lines.append(f"Medians of {args.reps} runs each, alternating which tree runs first.")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
