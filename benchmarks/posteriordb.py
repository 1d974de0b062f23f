"""Validate ``hmc.sample`` on the 14 built-in posteriordb posteriors.

Samples every built-in posterior (:mod:`hmc.models`) with the sampler's default settings
and compares each parameter posteriordb reports with its reference draws
(:mod:`hmc.models.validation`): the z-score of the mean difference with both MCSEs, the
relative error of the sd, z-scores of the 5 % / 95 % quantiles, bulk and tail ESS, R-hat,
divergences.

Pass: every ``|z|`` of the means below the Bonferroni bound ``Phi^-1(1 - 0.01 / (2 m))``
for the posterior's ``m`` reported parameters, and every sd within 10 % of the reference.
The centred eight schools is expected to fail (a funnel); its divergences are reported.

Usage::

    python -m benchmarks.posteriordb                      # all 14, 4 chains, 1000 + 1000
    python -m benchmarks.posteriordb --only sblrc-blr arK --draws 500
    python -m benchmarks.posteriordb --report-only        # rewrite the table from results
    python -m benchmarks.posteriordb --only arma11 --init-radius 0.5
    python -m benchmarks.posteriordb --chains 64 --draws 50 --kernel chees \
        --results chees.jsonl --markdown chees.md     # pooled warmup, ChEES

``benchmarks/arma11_stan.py`` runs Stan from the starting points of the arma11 row.

Each finished posterior is appended to ``--results`` (JSON lines) at once, and the Markdown
table (``--markdown``) is rewritten from all results in that file (the latest line per
posterior), so runs split over several processes add up to one table. A run with
``--init-radius`` gets its own row, named after the radius, and does not count towards
the default settings' verdict.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

import hmc
import hmc.models

try:
    from benchmarks.machine import machine
except ModuleNotFoundError:  # run as a plain file: its folder is on sys.path
    from machine import machine
from hmc.models.validation import ParameterCheck, compare, z_bound

HERE = Path(__file__).resolve().parent
DEFAULT_REFERENCE = HERE.parents[1] / "shared" / "posteriordb"
ALPHA = 0.01
SD_TOLERANCE = 0.10
#: chains per superchain for nested R-hat, reported for runs of 16 chains or more
NESTED_CHAINS = 8
EXPECTED_TROUBLE = {
    "eight_schools-eight_schools_centered": "the funnel: divergences expected",
    "arma-arma11 (init=0.5)": (
        "`--init-radius 0.5`: uniform(-0.5, 0.5) starts keep |theta| < 1; compare the"
        " default-settings row"
    ),
    "arma-arma11": (
        "chain 0 starts at mu 0.88, phi -1.40, theta -1.44, sigma 0.52, where the errors"
        " grow like theta^200 and the log density is -1.0e64 (float64 cannot resolve"
        " energy changes there below ~1e48): no step size moves it. Stan's warmup here"
        " restarts it from another chain at its first slow window's end"
        " (attrs['restarted_chains'], with a warning); Stan itself (pystan 3.14, defaults)"
        " started from the same four points keeps it there: its chain 0 ends at theta"
        " -1.087, phi -1.399 with step size 3.0e-8 and 941 of 1000 draws at max tree"
        " depth (`benchmarks/arma11_stan.py`, `arma11-stan.json`)"
    ),
}


def resolve(names: list[str]) -> list[str]:
    """Posterior names from full names or model names (``blr`` -> ``sblrc-blr``)."""
    known = hmc.models.names()
    out = []
    for name in names:
        matches = [k for k in known if name in (k, k.split("-", 1)[1])]
        if len(matches) != 1:
            raise SystemExit(f"unknown posterior {name!r}; choose from {known}")
        out.extend(matches)
    return out


def reference_values(directory: Path, name: str) -> dict[str, np.ndarray] | None:
    """posteriordb's reference draws ``name -> (10, 1000)``, if ``draws.npz`` is there."""
    path = directory / name / "draws.npz"
    if not path.is_file():
        return None
    with np.load(path) as archive:
        return {key: archive[key] for key in archive.files}


def run_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Sample one posterior and compare it with the reference; a JSON-able record."""
    model = hmc.models.load(name)
    options: dict[str, Any] = dict(
        chains=args.chains, draws=args.draws, seed=args.seed, progress=False
    )
    if args.warmup is not None:
        options["warmup"] = args.warmup
    if args.adapt:
        options["adapt"] = args.adapt
    if args.kernel:
        options["kernel"] = args.kernel
    if args.metric:
        options["metric"] = args.metric
    if args.init_radius is not None:
        options["init"] = args.init_radius
    wall, cpu = time.perf_counter(), time.process_time()
    dt = hmc.sample(model, **options)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    checks = compare(name, dt, reference_values(Path(args.reference_dir), name))
    stats = dt["sample_stats"]
    superchains = args.chains // NESTED_CHAINS if args.chains >= 2 * NESTED_CHAINS else None
    nested = None
    if superchains:
        values = hmc.nested_rhat(dt, superchains=superchains)
        nested = max(float(np.max(values[v].values)) for v in values.data_vars)
    treedepth = stats.get("reached_max_treedepth")
    return {
        "posterior": name,
        "settings": {k: str(v) for k, v in options.items()},
        "kernel": dt.attrs.get("kernel"),
        "engine": dt.attrs.get("engine"),
        "energy": "compiled" if dt.attrs.get("compiled") else "eager",
        "compile_s": float(dt.attrs.get("compile_time", 0.0)),
        "wall_s": wall,
        "cpu_s": cpu,
        "gradient_evaluations": int(dt.attrs["n_gradient_evaluations"]),
        "divergences": int(stats["diverging"].values.sum()),
        "max_treedepth_hits": None if treedepth is None else int(treedepth.values.sum()),
        "mean_steps": float(stats["n_steps"].values.mean()),
        "warmup_iterations": int(dt.attrs["tuning_steps"]),
        "restarted_chains": len(dt.attrs.get("restarted_chains", [])),
        "nested_rhat": nested,
        "superchains": superchains,
        "checks": [asdict(c) for c in checks],
        "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def verdict(record: dict[str, Any]) -> tuple[bool, float, str]:
    """(passed, z bound, note) of one posterior's record. The note also lists what the
    diagnostics flag (divergences, R-hat > 1.01, bulk ESS < 400, quantile |z| beyond the
    bound, max tree depth), which the pass criterion does not include."""
    checks = [ParameterCheck(**c) for c in record["checks"]]
    bound = z_bound(len(checks), ALPHA)
    bad_mean = [c.name for c in checks if not abs(c.mean_z) < bound]
    bad_sd = [c.name for c in checks if not abs(c.sd_rel_error) < SD_TOLERANCE]
    passed = not bad_mean and not bad_sd
    notes = []
    name = row_name(record)
    if name in EXPECTED_TROUBLE and (
        not passed or record["divergences"] or name != record["posterior"]
    ):
        notes.append(EXPECTED_TROUBLE[name])  # what a run with these symptoms should know
    if bad_mean:
        notes.append(f"mean |z| > {bound:.2f}: {', '.join(bad_mean[:4])}")
    if bad_sd:
        notes.append(f"sd off > 10 %: {', '.join(bad_sd[:4])}")
    many = record.get("nested_rhat") is not None
    if many:  # with a few draws per chain classic R-hat stays above 1.01 on mixed chains
        notes.append(
            f"{record['warmup_iterations']} warmup iterations, nested R-hat "
            f"{record['nested_rhat']:.3f} ({record['superchains']} superchains)"
            + (
                f", {record['restarted_chains']} chains restarted"
                if record["restarted_chains"]
                else ""
            )
        )
    flagged = {
        "R-hat > 1.01": [c for c in checks if c.rhat > 1.01 and not many],
        "bulk ESS < 400": [c for c in checks if c.ess_bulk < 400],
        f"quantile |z| > {bound:.2f}": [
            c for c in checks if max(abs(c.q05_z), abs(c.q95_z)) > bound
        ],
    }
    for label, items in flagged.items():
        if items:
            notes.append(f"{label}: {', '.join(c.name for c in items[:4])}")
    if record["divergences"]:
        notes.append(f"{record['divergences']} divergences")
    if record.get("max_treedepth_hits"):
        notes.append(f"max tree depth hit {record['max_treedepth_hits']} times")
    return passed, bound, "; ".join(notes)


def machine_line() -> str:
    """The machine in one line: CPU, cores, torch and its threads, Python."""
    info = machine()
    return (
        f"{info['cpu']}, {info['nproc']} cores, torch {torch.__version__} on "
        f"{torch.get_num_threads()} thread(s), Python {info['python']}"
    )


def settings(records: dict[str, dict[str, Any]]) -> str:
    """The sampler settings of the runs, in words (each distinct set once)."""
    distinct = []
    for record in records.values():
        if record["posterior"] != row_name(record):
            continue
        s = dict(record["settings"], kernel=record.get("kernel") or "default")
        text = (
            f"{s['chains']} chains, {s.get('warmup', 'default')} warmup + {s['draws']} draws, "
            f"seed {s['seed']}, kernel {s['kernel']}, metric {s.get('metric', 'diag (default)')}"
            + (f", adapt {s['adapt']}" if "adapt" in s else "")
        )
        if text not in distinct:
            distinct.append(text)
    return "; ".join(distinct) or "none"


def markdown(records: dict[str, dict[str, Any]]) -> str:
    """The results table, one row per posterior."""
    lines = [
        "# posteriordb validation",
        "",
        "Generated by `python -m benchmarks.posteriordb` (benchmarks/posteriordb.py): each "
        "built-in posterior sampled with `hmc.sample` and the settings below, compared with "
        "posteriordb's reference draws (10 x 1000 Stan NUTS draws).",
        "",
        f"- Machine: {machine_line()}.",
        f"- Settings: {settings(records)}; float64, CPU, one process per run.",
        "- wall / CPU s: elapsed and process CPU time of `hmc.sample` (the machine is shared, "
        "so CPU time is the better measure of cost). grad evals: over all chains.",
        "- max |z|: largest |mean difference| / sqrt(MCSE_run^2 + MCSE_ref^2) over the "
        "reported parameters (MCSE_run from `arviz_stats.mcse`, MCSE_ref = `mcse_mean` of "
        "reference.json). Bound: Bonferroni, Phi^-1(1 - 0.01 / (2 m)) for m parameters.",
        "- sd err: the largest |sd / sd_ref - 1|, signed. q z: largest |z| of the 5 % and "
        "95 % quantiles (information only). ESS: smallest bulk / tail ESS. R-hat: largest "
        "rank-normalised split R-hat.",
        f"- Pass: every mean |z| below the bound and every sd within {SD_TOLERANCE:.0%}.",
        "- finished: when the run ended (UTC). Each row ran with the package of the commit "
        "that added its line to the results file (`--results`). energy: whether the run's energy "
        "was compiled (`hmc.sample`'s default for runs this long since the compiled energy "
        "landed; earlier rows ran eagerly), with the compile time, included in wall.",
        "",
        "| posterior | dim | max \\|z\\| (bound) | sd err | q \\|z\\| | min ESS bulk / tail "
        "| max R-hat | divergences | grad evals | energy | wall / CPU s | finished | pass "
        "| note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    passed_count = 0
    default_runs = {r["posterior"] for r in records.values() if r["posterior"] == row_name(r)}
    for name in sorted(records):
        record = records[name]
        checks = [ParameterCheck(**c) for c in record["checks"]]
        passed, bound, note = verdict(record)
        passed_count += passed and name in default_runs
        worst_sd = max(checks, key=lambda c: abs(c.sd_rel_error)).sd_rel_error
        q = max(max(abs(c.q05_z), abs(c.q95_z)) for c in checks)
        lines.append(
            f"| {name} | {len(checks)} | {max(abs(c.mean_z) for c in checks):.2f} "
            f"({bound:.2f}) | {worst_sd:+.3f} | {q:.2f} "
            f"| {min(c.ess_bulk for c in checks):.0f} / {min(c.ess_tail for c in checks):.0f} "
            f"| {max(c.rhat for c in checks):.3f} | {record['divergences']} "
            f"| {record['gradient_evaluations']:,} | {energy(record)} "
            f"| {record['wall_s']:.0f} / {record['cpu_s']:.0f} "
            f"| {record.get('finished', '')[:16].replace('T', ' ')} "
            f"| {'pass' if passed else 'FAIL'} | {note.replace('|', r'\|')} |"
        )
    missing = [n for n in hmc.models.names() if n not in default_runs]
    lines += ["", f"{passed_count} of {len(default_runs)} posteriors pass with the settings above."]
    others = sorted(set(records) - default_runs)
    if others:
        lines.append(f"Rows with other settings (not counted): {', '.join(others)}.")
    if missing:
        lines.append(f"Not run: {', '.join(missing)}.")
    return "\n".join(lines) + "\n"


def energy(record: dict[str, Any]) -> str:
    """How a row's energy ran: eager, or compiled with its compile time."""
    if record.get("energy") != "compiled":
        return "eager"
    return f"compiled ({record['compile_s']:.0f} s)"


def row_name(record: dict[str, Any]) -> str:
    """A row's name: the posterior's, with the non-default init radius if there was one."""
    init = record["settings"].get("init")
    return record["posterior"] if init is None else f"{record['posterior']} (init={init})"


def read_results(path: Path) -> dict[str, dict[str, Any]]:
    """The latest record of each row name."""
    records: dict[str, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                records[row_name(record)] = record
    return records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=None, help="default: hmc.sample's")
    parser.add_argument("--adapt", default=None, help="default: hmc.sample's default")
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kernel", default=None, help="default: hmc.sample's default")
    parser.add_argument("--metric", default=None, help="default: hmc.sample's default")
    parser.add_argument(
        "--init-radius", type=float, default=None, help="uniform(-R, R) starts (default 2)"
    )
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reference-dir", default=str(DEFAULT_REFERENCE))
    parser.add_argument("--results", default=str(HERE / "posteriordb-results.jsonl"))
    parser.add_argument("--markdown", default=str(HERE / "posteriordb.md"))
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = Path(args.results)
    names = [] if args.report_only else resolve(args.only or hmc.models.names())
    for name in names:
        print(f"{name} ...", flush=True)
        record = run_one(name, args)
        with results.open("a") as out:
            out.write(json.dumps(record) + "\n")
        passed, bound, note = verdict(record)
        worst = max(abs(c["mean_z"]) for c in record["checks"])
        print(
            f"  {'pass' if passed else 'FAIL'}: max |z| {worst:.2f} (bound {bound:.2f}), "
            f"{record['divergences']} divergences, {record['wall_s']:.0f} s. {note}",
            flush=True,
        )
        Path(args.markdown).write_text(markdown(read_results(results)))
    if args.report_only:
        Path(args.markdown).write_text(markdown(read_results(results)))


if __name__ == "__main__":
    main()
