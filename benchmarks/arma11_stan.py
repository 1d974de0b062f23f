"""Stan on arma11 from the starting points of ``hmc.sample``'s default run.

``benchmarks/posteriordb.md`` reports arma11 failing with the default settings: one chain
starts where ``|theta| > 1`` makes the errors grow like ``theta^200`` and stays there.
This script asks whether that is the sampler or the start: it runs Stan's NUTS (pystan,
default settings, 1000 + 1000) from exactly the points hmc's chains started from and
reports where each chain ends up.

Two steps, because Stan lives in the anchors venv (``requirements-anchors.txt``) and hmc
in the package's::

    python -m benchmarks.arma11_stan starts --seed 1 > /tmp/starts.json
    .venv-anchors/bin/python benchmarks/arma11_stan.py stan /tmp/starts.json \\
        --out benchmarks/arma11-stan.json

``starts`` prints hmc's chain starts (uniform(-2, 2) on the unconstrained scale, the
default of :func:`hmc.sample`) on the constrained scale; ``stan`` samples one Stan chain
from each and prints, per chain, the sampling-phase means, the adapted step size and the
max-tree-depth hits.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1] / "shared" / "posteriordb" / "arma-arma11" / "data.json"
PARAMETERS = ("mu", "phi", "theta", "sigma")

# posteriordb's arma11.stan, as described in shared/posteriordb/arma-arma11/model.md
STAN_CODE = """
data { int<lower=1> T; array[T] real y; }
parameters { real mu; real phi; real theta; real<lower=0> sigma; }
model {
  vector[T] nu;
  vector[T] err;
  nu[1] = mu + phi * mu;
  err[1] = y[1] - nu[1];
  for (t in 2:T) {
    nu[t] = mu + phi * y[t - 1] + theta * err[t - 1];
    err[t] = y[t] - nu[t];
  }
  mu ~ normal(0, 10);
  phi ~ normal(0, 2);
  theta ~ normal(0, 2);
  sigma ~ cauchy(0, 2.5);
  err ~ normal(0, sigma);
}
"""


def hmc_starts(seed: int, chains: int) -> list[dict[str, float]]:
    """The constrained starting points of ``hmc.sample(arma11, seed=seed)``'s chains."""
    import torch

    import hmc.models
    from hmc.initial import DEFAULT_INIT_RADIUS
    from hmc.random import Stream, chain_keys, uniform

    model = hmc.models.load("arma-arma11")
    keys = chain_keys(seed, torch.arange(chains))
    counter = torch.zeros(chains, dtype=torch.int64)
    u = DEFAULT_INIT_RADIUS * (2 * uniform(keys, Stream.INIT, counter, model.dim) - 1)
    potential = hmc.Potential(model.log_prob)
    U, _ = potential.value_and_grad(u)
    if not torch.isfinite(U).all():  # hmc would redraw these chains' starts
        raise RuntimeError(f"seed {seed}: a first draw is not finite; the starts differ")
    constrained = model.constrain(u)
    return [
        {name: float(constrained[name][c]) for name in PARAMETERS} | {"lp": float(-U[c])}
        for c in range(chains)
    ]


def stan_from(starts: list[dict[str, float]], seed: int) -> list[dict[str, float]]:
    """One Stan chain from each start: sampling means, adapted step size, depth hits."""
    import stan

    data = json.loads(DATA.read_text())
    inits = [{name: s[name] for name in PARAMETERS} for s in starts]
    fit = stan.build(STAN_CODE, data=data, random_seed=seed).sample(
        num_chains=len(starts), num_warmup=1000, num_samples=1000, init=inits
    )
    names = list(fit.sample_and_sampler_param_names) + list(fit.constrained_param_names)
    table = np.asarray(fit._draws)  # (parameters, draws, chains)
    out = []
    for c, start in enumerate(starts):
        row = {f"start_{k}": v for k, v in start.items()}
        row |= {f"mean_{name}": float(table[names.index(name), :, c].mean()) for name in PARAMETERS}
        row["step_size"] = float(table[names.index("stepsize__"), -1, c])
        row["max_treedepth_hits"] = int((table[names.index("treedepth__"), :, c] >= 10).sum())
        row["divergences"] = int(table[names.index("divergent__"), :, c].sum())
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    starts = sub.add_parser("starts", help="print hmc's chain starts as JSON")
    starts.add_argument("--seed", type=int, default=1)
    starts.add_argument("--chains", type=int, default=4)
    run = sub.add_parser("stan", help="run Stan from the starts in a JSON file")
    run.add_argument("starts")
    run.add_argument("--seed", type=int, default=1)
    run.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.command == "starts":
        json.dump(hmc_starts(args.seed, args.chains), sys.stdout, indent=1)
        return
    rows = stan_from(json.loads(Path(args.starts).read_text()), args.seed)
    for c, row in enumerate(rows):
        print(
            f"chain {c}: start theta {row['start_theta']:+.3f} phi {row['start_phi']:+.3f} "
            f"(lp {row['start_lp']:.3g}) -> mean theta {row['mean_theta']:+.3f} "
            f"phi {row['mean_phi']:+.3f}, step size {row['step_size']:.3g}, "
            f"{row['max_treedepth_hits']} max-depth draws of 1000"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
