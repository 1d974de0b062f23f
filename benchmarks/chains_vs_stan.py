"""Benchmark: hmc's NUTS against Stan's, chain by chain: adaptation, tree sizes, divergences.

On one of the targets of ``nuts_anchors.py`` (the same log densities, Stan programs and
data), NUTS with Stan's defaults (1000 warmup + 1000 draws, diagonal metric, target
acceptance 0.8, max tree depth 10) and uniform(-2, 2) starts. Each side records, per
chain: the adapted step size, the mean acceptance statistic and the mean number of leapfrog
steps over the draws, and the number of divergent draws. The two sets of chains are
compared with Mann-Whitney rank tests (normal approximation), which detects a shift in
adaptation that single 4-chain runs hide: on the centred funnel one 4-chain run varies by a
factor of 30 in divergences from seed to seed.

Chains adapt independently, so hmc runs all its chains in one call; Stan runs 4-chain fits
with consecutive seeds (the Stan side needs ``pystan``, from
``benchmarks/requirements-anchors.txt``, in its own venv)::

    python benchmarks/chains_vs_stan.py hmc --target funnel10 --chains 40 --seed 1 \\
        --json hmc-1.json
    .venv-anchors/bin/python benchmarks/chains_vs_stan.py stan --target funnel10 \\
        --fits 10 --seed 1 --json stan-1.json
    python benchmarks/chains_vs_stan.py compare --stan stan-*.json --hmc hmc-*.json

The per-chain data behind ``RESULTS.md``'s table are in ``benchmarks/chains-vs-stan/``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

try:
    from benchmarks.nuts_anchors import STAN_CODE, TARGETS, dims, stan_data, torch_log_prob
except ModuleNotFoundError:  # run as a plain file: its folder is on sys.path
    from nuts_anchors import STAN_CODE, TARGETS, dims, stan_data, torch_log_prob

STATS = ("step_size", "accept", "steps", "divergences")


def run_hmc(target: str, chains: int, seed: int) -> dict[str, list[float]]:
    """Per-chain statistics of one hmc run with ``chains`` chains."""
    import torch

    import hmc

    torch.set_num_threads(1)
    dt = hmc.sample(
        torch_log_prob(target), dim=dims(target), chains=chains, seed=seed, batched=True,
        progress=False,
    )  # fmt: skip
    stats = dt["sample_stats"]
    return {
        "step_size": dt["adaptation"]["step_size"].values.tolist(),
        "accept": stats["acceptance_rate"].values.mean(1).tolist(),
        "steps": stats["n_steps"].values.mean(1).tolist(),
        "divergences": stats["diverging"].values.sum(1).tolist(),
    }


def run_stan(target: str, fits: int, seed: int) -> dict[str, list[float]]:
    """Per-chain statistics of ``fits`` 4-chain Stan fits, seeds ``seed, seed + 1, ...``."""
    import stan

    out: dict[str, list[float]] = {name: [] for name in STATS}
    for s in range(seed, seed + fits):
        fit = stan.build(STAN_CODE[target], data=stan_data(target), random_seed=s).sample(
            num_chains=4, num_warmup=1000, num_samples=1000
        )
        names = list(fit.sample_and_sampler_param_names)
        table = np.asarray(fit._draws)  # (parameters, draws, chains)

        def column(name: str, table=table, names=names) -> np.ndarray:
            return table[names.index(name)]

        out["step_size"] += column("stepsize__")[-1].tolist()
        out["accept"] += column("accept_stat__").mean(0).tolist()
        out["steps"] += column("n_leapfrog__").mean(0).tolist()
        out["divergences"] += column("divergent__").sum(0).tolist()
    return out


def rank_test(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Mann-Whitney z of ``a`` against ``b`` (midranks for ties, normal approximation
    with the tie correction) and its two-sided p-value."""
    values = np.concatenate([a, b])
    order = values.argsort(kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for v in np.unique(values):  # midranks
        ranks[values == v] = ranks[values == v].mean()
    n1, n2 = len(a), len(b)
    n = n1 + n2
    u = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    _, counts = np.unique(values, return_counts=True)
    tie = (counts**3 - counts).sum() / (n * (n - 1))
    sd = math.sqrt(n1 * n2 / 12 * (n + 1 - tie))
    z = (u - n1 * n2 / 2) / sd if sd > 0 else 0.0
    return z, math.erfc(abs(z) / math.sqrt(2))


def load(paths: list[str]) -> dict[str, np.ndarray]:
    """Per-chain statistics from several JSON files, concatenated."""
    rows = [json.loads(Path(p).read_text()) for p in paths]
    return {
        name: np.concatenate([np.asarray(r[name], dtype=float) for r in rows]) for name in STATS
    }


def compare(stan: dict[str, np.ndarray], ours: dict[str, np.ndarray]) -> str:
    """A Markdown table: quartiles per side and the rank test per statistic."""
    lines = [
        f"Chains: Stan {len(stan['accept'])}, hmc {len(ours['accept'])}.",
        "",
        "| per chain | Stan median [quartiles] | hmc median [quartiles] | rank z (Stan - hmc) "
        "| p |",
        "|---|---|---|---|---|",
    ]
    for name in STATS:
        cells = []
        for side in (stan, ours):
            q1, q2, q3 = np.quantile(side[name], [0.25, 0.5, 0.75])
            cells.append(f"{q2:.4g} [{q1:.4g}, {q3:.4g}]")
        z, p = rank_test(stan[name], ours[name])
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | {z:+.2f} | {p:.3f} |")
    for label, side in (("Stan", stan), ("hmc", ours)):
        div = side["divergences"]
        lines.append("")
        lines.append(
            f"{label}: {div.sum():.0f} divergent draws in {1000 * len(div)} "
            f"({1000 * div.sum() / (1000 * len(div)):.2f} per 1000), in {(div > 0).sum()} of "
            f"{len(div)} chains, at most {div.max():.0f} in one chain."
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ours = sub.add_parser("hmc", help="one hmc run")
    ours.add_argument("--target", choices=TARGETS, default="funnel10")
    ours.add_argument("--chains", type=int, default=40)
    ours.add_argument("--seed", type=int, default=1)
    ours.add_argument("--json", required=True)
    stan = sub.add_parser("stan", help="4-chain Stan fits with consecutive seeds")
    stan.add_argument("--target", choices=TARGETS, default="funnel10")
    stan.add_argument("--fits", type=int, default=10)
    stan.add_argument("--seed", type=int, default=1)
    stan.add_argument("--json", required=True)
    both = sub.add_parser("compare", help="the Markdown comparison of saved runs")
    both.add_argument("--stan", nargs="+", required=True)
    both.add_argument("--hmc", nargs="+", required=True)
    args = parser.parse_args(argv)
    if args.command == "compare":
        print(compare(load(args.stan), load(args.hmc)))
        return
    if args.command == "hmc":
        result = run_hmc(args.target, args.chains, args.seed)
    else:
        result = run_stan(args.target, args.fits, args.seed)
    Path(args.json).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
