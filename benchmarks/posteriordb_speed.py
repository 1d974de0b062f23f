"""Whole runs on the posteriordb posteriors: hmc eager, hmc compiled and Stan, start-up
included.

Each posterior runs with posteriordb's default settings (4 chains, 1000 warmup + 1000
draws, seed 1) three ways, each in a process of its own, one after another:

- ``eager``: ``hmc.sample(model, compile=False)``;
- ``compiled``: ``hmc.sample(model, compile=True)`` (what the default does for a run this
  long), with a cold compile cache of its own (a fresh ``TORCHINDUCTOR_CACHE_DIR``), so the
  compile time is the first-run cost; with ``--inductor-cache DIR`` it compiles into
  ``DIR`` instead, and a second such run (the row "compiled (warm cache)") reuses it;
- ``stan``: posteriordb's own Stan program (``shared/posteriordb/<name>/model.stan``) with
  its data through pystan, built with a cold httpstan cache of its own, so the compile time
  is Stan's first-run cost too. pystan lives in another venv (``--stan-python``, see
  ``requirements-anchors.txt``).

Columns: seconds to the end including start-up (the worker process's whole life: imports,
compile, sampling), the compile time apart, gradients (leapfrog steps, all chains, warmup
included; pystan reports Stan's for the kept draws only, so Stan's column counts those and
has no per-gradient time), microseconds per chain-gradient (sampling time without the
compile over gradients), the
smallest bulk ESS over posteriordb's reported parameters, that ESS per second of the
whole run, and the run the row belongs to: each record keeps its machine and the commit of
the package, so rows gathered on different days and machines say so (compare rows within
one run only).

Usage::

    python -m benchmarks.posteriordb_speed --only eight_schools_noncentered arK \\
        --stan-python .venv-anchors/bin/python
    python -m benchmarks.posteriordb_speed --report-only   # the table from the results

Results are appended to ``--results`` (JSON lines, the latest per posterior and sampler
counts) and the table is rewritten into ``--markdown``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    from benchmarks.machine import machine
except ModuleNotFoundError:  # run as a plain file (Stan's worker): its folder is on sys.path
    from machine import machine

HERE = Path(__file__).resolve().parent
DEFAULT_REFERENCE = HERE.parents[1] / "shared" / "posteriordb"
SAMPLERS = ("eager", "compiled", "stan")
SETTINGS = {"chains": 4, "warmup": 1000, "draws": 1000, "seed": 1}


# ---------------------------------------------------------------------- workers
def bulk_ess(chains: Any) -> float:
    """Rank-normalised bulk ESS of ``(chain, draw)`` values, the same function for every
    sampler (arviz-stats' array interface, which needs no xarray)."""
    from arviz_stats.base import array_stats

    return float(array_stats.ess(chains, method="bulk", chain_axis=0, draw_axis=1))


def hmc_worker(name: str, compile: bool) -> dict[str, Any]:
    """One hmc run (in this process); a JSON-able record."""
    import numpy as np
    import torch

    import hmc
    import hmc.models

    torch.set_num_threads(1)
    model = hmc.models.load(name)
    started = time.perf_counter()
    dt = hmc.sample(model, compile=compile, progress=False, **SETTINGS)
    seconds = time.perf_counter() - started
    draws = hmc.models.reference_draws(name, dt)
    ess = min(bulk_ess(np.asarray(v)) for v in draws.values())
    return {
        "sample_s": seconds,
        "compile_s": float(dt.attrs["compile_time"]),
        "compiled": bool(dt.attrs["compiled"]),
        "gradients": int(dt.attrs["n_gradient_evaluations"]),
        "min_ess_bulk": ess,
        "divergences": int(dt["sample_stats"]["diverging"].values.sum()),
    }


def stan_worker(name: str, reference_dir: Path) -> dict[str, Any]:
    """One Stan run through pystan (in this process, the anchors' venv)."""
    import numpy as np
    import stan

    directory = reference_dir / name
    program = (directory / "model.stan").read_text()
    data = json.loads((directory / "data.json").read_text())
    reported = json.loads((directory / "reference.json").read_text())["parameter_names"]
    started = time.perf_counter()
    posterior = stan.build(program, data=data, random_seed=SETTINGS["seed"])
    compiled = time.perf_counter()
    fit = posterior.sample(
        num_chains=SETTINGS["chains"],
        num_warmup=SETTINGS["warmup"],
        num_samples=SETTINGS["draws"],
    )
    finished = time.perf_counter()
    names = list(fit.sample_and_sampler_param_names) + list(fit.constrained_param_names)
    table = np.asarray(fit._draws)  # (parameters, draws, chains)

    def chains_of(parameter: str) -> np.ndarray:  # "theta[1]" -> Stan's "theta.1"
        return table[names.index(re.sub(r"[\[,]", ".", parameter).rstrip("]"))].T

    ess = min(bulk_ess(chains_of(p)) for p in reported)
    return {
        "sample_s": finished - started,
        "compile_s": compiled - started,
        "compiled": True,
        "gradients": int(table[names.index("n_leapfrog__")].sum()),
        "min_ess_bulk": ess,
        "divergences": int(table[names.index("divergent__")].sum()),
    }


# ---------------------------------------------------------------------- driver
def run(name: str, sampler: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one worker process and time its whole life."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="posteriordb-speed-") as cache:
        if sampler == "stan":
            command = [args.stan_python, str(Path(__file__).resolve()), "worker", "stan", name]
            command += ["--reference-dir", str(args.reference_dir)]
            env["XDG_CACHE_HOME"] = cache  # a cold httpstan build cache
        else:
            command = [sys.executable, "-m", "benchmarks.posteriordb_speed", "worker", sampler]
            command += [name]
            env["TORCHINDUCTOR_CACHE_DIR"] = args.inductor_cache or cache
        started = time.perf_counter()
        result = subprocess.run(
            command, env=env, capture_output=True, text=True, cwd=HERE.parent, check=False
        )
        total = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{sampler} on {name} failed:\n{result.stderr[-3000:]}")
    record = json.loads(result.stdout.strip().splitlines()[-1])
    record.update(
        posterior=name,
        sampler=sampler + (" (warm cache)" if args.inductor_cache else ""),
        total_s=total,
        finished=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        cpu="{cpu}, {nproc} cores".format(**machine()),
        commit=_commit(),
    )
    return record


def _commit() -> str:
    """The short hash of the checkout this script runs from."""
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()


def markdown(records: list[dict[str, Any]]) -> str:
    """The table of ``records``, with a column naming the run each row belongs to: its
    machine, its package's commit and its date (rows gathered over several runs)."""
    runs: dict[tuple[str, str, str], str] = {}
    lines = [
        "| posterior | sampler | total s (start-up included) | compile s | gradients | "
        "us per chain-gradient | min bulk ESS | ESS / s | divergences | run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        run_key = (r["cpu"], r["commit"], r["finished"][:10])
        label = runs.setdefault(run_key, chr(ord("A") + len(runs)))
        sampling = r["sample_s"] - r["compile_s"]
        if r["sampler"] == "stan":  # pystan returns the kept draws' statistics only
            gradients, per_gradient = f"{r['gradients']:,} (draws only)", "-"
        else:
            gradients = f"{r['gradients']:,}"
            per_gradient = f"{sampling / r['gradients'] * 1e6:.1f}"
        lines.append(
            f"| {r['posterior']} | {r['sampler']} "
            f"| {r['total_s']:.1f} | {r['compile_s']:.1f} | {gradients} "
            f"| {per_gradient} | {r['min_ess_bulk']:.0f} "
            f"| {r['min_ess_bulk'] / r['total_s']:.1f} | {r['divergences']} | {label} |"
        )
    header = [
        f"Settings: {SETTINGS['chains']} chains, {SETTINGS['warmup']} + {SETTINGS['draws']}, "
        f"seed {SETTINGS['seed']}; each row one process with one thread, run one after "
        "another. Runs (compare rows within one run):",
        "",
    ]
    header += [
        f"- {label}: {cpu}, package at {commit}, {date}"
        for (cpu, commit, date), label in runs.items()
    ]
    return "\n".join(header) + "\n\n" + "\n".join(lines) + "\n"


def latest(path: Path) -> list[dict[str, Any]]:
    """The latest record per (posterior, sampler), in posterior then sampler order."""
    records: dict[tuple[str, str], dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            records[record["posterior"], record["sampler"]] = record
    return [records[key] for key in sorted(records)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    worker = sub.add_parser("worker")
    worker.add_argument("sampler", choices=SAMPLERS)
    worker.add_argument("name")
    worker.add_argument("--reference-dir", type=Path, default=DEFAULT_REFERENCE)
    parser.add_argument("--only", nargs="+", default=None)
    parser.add_argument("--samplers", nargs="+", choices=SAMPLERS, default=list(SAMPLERS))
    parser.add_argument("--stan-python", default=None)
    parser.add_argument("--reference-dir", type=Path, default=DEFAULT_REFERENCE)
    parser.add_argument("--inductor-cache", default=None, help="a compile cache to reuse")
    parser.add_argument("--results", type=Path, default=HERE / "posteriordb-speed.jsonl")
    parser.add_argument("--markdown", type=Path, default=HERE / "posteriordb-speed.md")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    if args.command == "worker":
        if args.sampler == "stan":
            record = stan_worker(args.name, args.reference_dir)
        else:
            record = hmc_worker(args.name, compile=args.sampler == "compiled")
        print(json.dumps(record))
        return
    if not args.report_only:
        import hmc.models

        names = args.only or hmc.models.names()
        names = [n for n in hmc.models.names() if n in names or n.split("-", 1)[1] in names]
        for name in names:
            for sampler in args.samplers:
                if sampler == "stan" and args.stan_python is None:
                    continue
                record = run(name, sampler, args)
                with args.results.open("a") as out:
                    out.write(json.dumps(record) + "\n")
                print(json.dumps(record), flush=True)
    args.markdown.write_text(
        "# Whole runs: hmc eager, hmc compiled, Stan\n\nGenerated by `python -m "
        "benchmarks.posteriordb_speed`.\n\n" + markdown(latest(args.results))
    )


if __name__ == "__main__":
    main()
