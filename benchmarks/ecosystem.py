"""Pyro models sampled by Pyro's NUTS and by ``hmc`` through ``hmc.from_pyro``.

Each (target, sampler) pair runs in a process of its own (this script with ``--worker``),
one after another, side by side in one run; a worker reports its process's CPU seconds
from start to end (model construction, tracing and compiling included), the smallest bulk
ESS over the latent coordinates (unconstrained sites' entries, on the constrained scale),
and the CPU seconds to 1,000 bulk ESS at that rate.

Samplers, 4 chains of 1,000 warmup and 1,000 kept draws each, NUTS with Stan's warmup and
a diagonal metric in all three:

- ``pyro``: ``pyro.infer.MCMC(NUTS(model))``, the four chains one after another in the
  worker (Pyro's ``num_chains=4`` runs them in child processes, whose CPU time the worker
  would not see), float64;
- ``hmc``: ``hmc.sample(hmc.from_pyro(model, ...), compile=False)``;
- ``hmc-compiled``: the same with ``compile=True``.

Targets: the non-centred eight schools and a logistic regression (200 points, 5
predictors and an intercept), both written in Pyro with a ``pyro.plate``.

    python benchmarks/ecosystem.py --out ecosystem-section.md [--targets eight_schools]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLERS = ("pyro", "hmc", "hmc-compiled")
CHAINS, WARMUP, DRAWS = 4, 1000, 1000


def eight_schools_problem():
    import pyro
    import pyro.distributions as dist
    import torch

    y = torch.tensor([28.0, 8, -3, 7, -1, 1, 18, 12], dtype=torch.float64)
    sigma = torch.tensor([15.0, 10, 16, 11, 9, 11, 10, 18], dtype=torch.float64)

    def eight_schools(y, sigma):
        mu = pyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = pyro.sample("tau", dist.HalfCauchy(5.0))
        with pyro.plate("school", len(y)):
            z = pyro.sample("z", dist.Normal(0.0, 1.0))
            theta = pyro.deterministic("theta", mu + tau * z)
            pyro.sample("y", dist.Normal(theta, sigma), obs=y)

    return eight_schools, (y, sigma)


def logistic_problem():
    import pyro
    import pyro.distributions as dist
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 5, generator=g, dtype=torch.float64)
    truth = torch.tensor([1.0, -0.5, 0.25, 0.0, 2.0], dtype=torch.float64)
    y = torch.bernoulli(torch.sigmoid(0.3 + x @ truth), generator=g)

    def logistic_regression(x, y):
        alpha = pyro.sample("alpha", dist.Normal(0.0, 2.5))
        with pyro.plate("predictor", x.shape[1]):
            beta = pyro.sample("beta", dist.Normal(0.0, 2.5))
        with pyro.plate("obs", len(y)):
            pyro.sample("y", dist.Bernoulli(logits=alpha + x @ beta), obs=y)

    return logistic_regression, (x, y)


TARGETS = {"eight_schools": eight_schools_problem, "logistic": logistic_problem}


def smallest_bulk_ess(draws: dict) -> float:
    """The smallest bulk ESS over every entry of ``name -> (chain, draw, ...)`` arrays."""
    import arviz_stats
    import numpy as np

    out = []
    for value in draws.values():
        flat = np.asarray(value).reshape(*np.shape(value)[:2], -1)
        out += [float(arviz_stats.ess(flat[..., i], method="bulk")) for i in range(flat.shape[-1])]
    return min(out)


def worker(target: str, sampler: str) -> dict:
    start = time.process_time()
    import torch

    torch.set_num_threads(1)
    model, args = TARGETS[target]()
    if sampler == "pyro":
        import numpy as np
        import pyro
        from pyro.infer import MCMC, NUTS

        torch.set_default_dtype(torch.float64)
        chains = []
        for chain in range(CHAINS):
            pyro.set_rng_seed(chain)
            mcmc = MCMC(NUTS(model), num_samples=DRAWS, warmup_steps=WARMUP, disable_progbar=True)
            mcmc.run(*args)
            chains.append({k: v.numpy() for k, v in mcmc.get_samples().items()})
        draws = {k: np.stack([c[k] for c in chains]) for k in chains[0]}
        extra = {}
    else:
        import hmc

        posterior = hmc.from_pyro(model, *args)
        dt = hmc.sample(
            posterior, chains=CHAINS, warmup=WARMUP, draws=DRAWS, seed=1, progress=False,
            compile=sampler == "hmc-compiled",
        )  # fmt: skip
        draws = {name: dt["posterior"][name].values for name in posterior.names}
        extra = {
            "gradients": int(dt.attrs["n_gradient_evaluations"]),
            "compiled": int(dt.attrs["compiled"]),
            "divergences": int(dt["sample_stats"]["diverging"].sum()),
        }
    ess = smallest_bulk_ess(draws)
    seconds = time.process_time() - start
    return {"target": target, "sampler": sampler, "cpu_s": seconds, "min_bulk_ess": ess,
            "cpu_s_per_1000_ess": 1000 * seconds / ess, **extra}  # fmt: skip


def table(rows: list[dict]) -> str:
    lines = [
        "| target | sampler | CPU s | min bulk ESS | CPU s to 1,000 bulk ESS | vs Pyro "
        "| gradients |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        pyro_row = next(
            (r for r in rows if r["target"] == row["target"] and r["sampler"] == "pyro"), None
        )
        speedup = (
            f"{pyro_row['cpu_s_per_1000_ess'] / row['cpu_s_per_1000_ess']:.1f}x"
            if pyro_row
            else "-"
        )
        lines.append(
            f"| {row['target']} | {row['sampler']} | {row['cpu_s']:.1f} | "
            f"{row['min_bulk_ess']:.0f} | {row['cpu_s_per_1000_ess']:.2f} | {speedup} | "
            f"{row.get('gradients', '-')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--samplers", default=",".join(SAMPLERS))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", nargs=2, metavar=("TARGET", "SAMPLER"), help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        print(json.dumps(worker(*options.worker)))
        return
    sys.path.insert(0, str(ROOT))
    from benchmarks.machine import machine

    rows = []
    for target in options.targets.split(","):
        for sampler in options.samplers.split(","):
            done = subprocess.run(
                [sys.executable, __file__, "--worker", target, sampler],
                capture_output=True, text=True, check=True, cwd=ROOT,
            )  # fmt: skip
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    about = machine()
    text = (
        f"{CHAINS} chains x ({WARMUP} + {DRAWS}), one process per row; {about['cpu']}, "
        f"{about['nproc']} cores, one thread, Python {about['python']}.\n\n{table(rows)}\n"
    )
    print(text)
    if options.out:
        options.out.write_text(text)


if __name__ == "__main__":
    main()
