"""Benchmark: time per chain-gradient with many chains batched on the CPU.

Time per chain-gradient = wall time of the sampling / the number of (chain, position)
gradient evaluations (``dt.attrs["n_gradient_evaluations"]`` counts rows). Targets, each
with a log density written batched (``batched=True``, ``(C, D) -> (C,)``), float64:

- ``gauss2d``: the 2-D Gaussian with precision ``[[10.25, -9.74], [-9.74, 10.25]]``;
- ``logistic``: logistic regression, N=5000 observations, D=50 coefficients, synthetic
  data from a fixed seed (``numpy.random.default_rng``), N(0, 1) prior.

Kernels, at 1, 4, 16, 64, 256 and 1024 chains:

- ``hmc``: ``hmc.HMC(num_steps=10)``, fixed step size, ``warmup=0`` (so the time is the
  leapfrog loop and nothing else); inits near the posterior, in the default engine (on
  the CPU, NumPy: NumPy arithmetic between energy calls); ``hmc-tensor`` is the same run
  with ``engine="torch"`` (batched tensor operations, as on a GPU);
- ``nuts``: the default kernel (NUTS) with Stan's warmup, random inits; the table gives the
  number of warmup and kept draws, the whole run's time per chain-gradient
  (``total_time / n_gradient_evaluations``), the sampling phase's
  (``sampling_time / sum(n_steps)`` over the kept draws) and ``chain_utilization``
  (the fraction of chain slots that took a leapfrog step in the sampling ticks).

Fewer draws are run at large chain counts to keep the whole script near five minutes on a
2-core machine. ``torch.set_num_threads(1)``. Besides wall time, the process CPU time is
reported (with one thread it is a proxy for the time on an unloaded core: on a shared
machine, wall time includes waiting for the CPU).

Run from the repository root::

    python -m benchmarks.throughput --out throughput-section.md
    python -m benchmarks.throughput --quick          # a smaller sweep, ~1 minute
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import hmc

try:
    from benchmarks.machine import machine
except ModuleNotFoundError:  # run as a plain file: its folder is on sys.path
    from machine import machine

CHAINS = (1, 4, 16, 64, 256, 1024)
PRECISION = torch.tensor([[10.25, -9.74], [-9.74, 10.25]], dtype=torch.float64)
TARGET_US = 0.5  # at 1024 chains on gauss2d
DATA_SEED = 20261202


def machine_info() -> dict[str, str]:
    """The machine, with the torch version (reported with every result)."""
    return {**machine(), "torch": torch.__version__}


# ---------------------------------------------------------------------- targets
def gauss2d_log_prob(q: torch.Tensor) -> torch.Tensor:
    """``(C, 2) -> (C,)``."""
    return -0.5 * ((q @ PRECISION) * q).sum(-1)


def logistic_data(n: int = 5000, d: int = 50, seed: int = DATA_SEED):
    """Synthetic design ``X`` ``(n, d)``, labels ``y`` ``(n,)`` and the true coefficients
    (numpy arrays; the same generator is used by the anchors in ``nuts_anchors``)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    beta = 0.3 * rng.standard_normal(d)
    p = 1.0 / (1.0 + np.exp(-(X @ beta)))
    y = (rng.uniform(size=n) < p).astype(np.float64)
    return X, y, beta


def make_logistic(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float64):
    """The logistic regression's batched log density on ``device`` and the true
    coefficients ``(50,)``."""
    X_np, y_np, beta = logistic_data()
    X = torch.as_tensor(X_np, dtype=dtype, device=device)
    y = torch.as_tensor(y_np, dtype=dtype, device=device)

    def log_prob(b: torch.Tensor) -> torch.Tensor:
        """``(C, 50) -> (C,)``: Bernoulli-logit likelihood plus a N(0, 1) prior."""
        logits = b @ X.T  # (C, N)
        loglik = (y * logits - torch.nn.functional.softplus(logits)).sum(-1)
        return loglik - 0.5 * (b * b).sum(-1)

    return log_prob, torch.as_tensor(beta, dtype=dtype, device=device)


# ---------------------------------------------------------------------- runs
def _draws(budget: float, chains: int, steps: int, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, round(budget / (chains * steps)))))


def run_hmc(
    log_prob,
    init,
    chains: int,
    step_size: float,
    draws: int,
    seed: int,
    engine: str = "auto",
    device: str = "cpu",
    dtype: torch.dtype = torch.float64,
) -> dict:
    dim = init.shape[-1]
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(chains, dim, dtype=torch.float64, generator=gen)
    starts = init.to("cpu", torch.float64) + 0.01 * noise
    wall0, cpu0 = time.perf_counter(), time.process_time()
    dt = hmc.sample(
        log_prob,
        starts,
        chains=chains,
        kernel=hmc.HMC(num_steps=10),
        step_size=step_size,
        warmup=0,
        draws=draws,
        seed=seed,
        progress=False,
        batched=True,
        device=device,
        dtype=dtype,
        engine=engine,
    )
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    grads = int(dt.attrs["n_gradient_evaluations"])
    return {
        "engine": dt.attrs["engine"],
        "draws": draws,
        "grads": grads,
        "wall": wall,
        "cpu": cpu,
        "sampling_time": float(dt.attrs["sampling_time"]),
        "us": wall / grads * 1e6,
        "cpu_us": cpu / grads * 1e6,
        "sampling_us": float(dt.attrs["sampling_time"]) / grads * 1e6,
        "accept": float(dt["sample_stats"]["acceptance_rate"].mean()),
    }


def run_nuts(
    log_prob,
    dim: int,
    chains: int,
    warmup: int,
    draws: int,
    seed: int,
    device: str = "cpu",
    dtype: torch.dtype = torch.float64,
    engine: str = "auto",
) -> dict:
    wall0, cpu0 = time.perf_counter(), time.process_time()
    dt = hmc.sample(
        log_prob,
        dim=dim,
        chains=chains,
        warmup=warmup,
        draws=draws,
        seed=seed,
        progress=False,
        batched=True,
        device=device,
        dtype=dtype,
        engine=engine,
    )
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    grads = int(dt.attrs["n_gradient_evaluations"])
    stats = dt["sample_stats"]
    sampling_grads = int(stats["n_steps"].values.sum())
    return {
        "engine": dt.attrs["engine"],
        "warmup": warmup,
        "draws": draws,
        "grads": grads,
        "wall": wall,
        "cpu": cpu,
        "us": wall / grads * 1e6,
        "cpu_us": cpu / grads * 1e6,
        "sampling_us": float(dt.attrs["sampling_time"]) / sampling_grads * 1e6,
        "utilization": float(dt.attrs["chain_utilization"]),
        "mean_steps": float(stats["n_steps"].values.mean()),
        "accept": float(stats["acceptance_rate"].mean()),
        "divergences": int(stats["diverging"].values.sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the markdown tables here")
    parser.add_argument("--quick", action="store_true", help="a smaller, faster sweep")
    parser.add_argument("--chains", default=",".join(map(str, CHAINS)))
    parser.add_argument("--targets", default="gauss2d,logistic")
    parser.add_argument("--kernels", default="hmc,nuts")
    args = parser.parse_args()
    torch.set_num_threads(1)
    info = machine_info()
    chain_counts = [int(c) for c in args.chains.split(",")]
    scale = 0.25 if args.quick else 1.0

    logistic_lp, beta_true = make_logistic()
    targets = {
        "gauss2d": {
            "log_prob": gauss2d_log_prob,
            "init": torch.zeros(2, dtype=torch.float64),
            "step_size": 0.25,
            "hmc_budget": 2e6,  # chain-gradients per HMC run (draws clamped below)
            "hmc_draws": (20, 500),
            "nuts_draws": lambda c: (200, 200) if c <= 64 else (150, 150),
        },
        "logistic": {
            "log_prob": logistic_lp,
            "init": beta_true,
            "step_size": 0.015,
            "hmc_budget": 1e5,
            "hmc_draws": (3, 300),
            # the likelihood dominates (5000 x 50 per chain-gradient): at 1024 chains NUTS
            # would need minutes for a few draws, so that row is skipped
            "nuts_draws": lambda c: None if c > 256 else (150, 150) if c <= 16 else (60, 60),
        },
    }
    # warm-up (first-call costs), not timed
    run_hmc(gauss2d_log_prob, torch.zeros(2, dtype=torch.float64), 2, 0.25, 5, 0)
    run_hmc(logistic_lp, beta_true, 2, 0.015, 5, 0)

    results: dict[tuple[str, str, int], dict] = {}
    for name in args.targets.split(","):
        t = targets[name]
        for kernel in args.kernels.split(","):
            for chains in chain_counts:
                if kernel.startswith("hmc"):
                    lo, hi = t["hmc_draws"]
                    draws = _draws(t["hmc_budget"] * scale, chains, 10, lo, hi)
                    engine = "torch" if kernel == "hmc-tensor" else "auto"
                    r = run_hmc(t["log_prob"], t["init"], chains, t["step_size"], draws, 7, engine)
                else:
                    if t["nuts_draws"](chains) is None:
                        continue
                    warmup, draws = t["nuts_draws"](chains)
                    warmup, draws = max(20, int(warmup * scale)), max(20, int(draws * scale))
                    dim = t["init"].shape[-1]
                    r = run_nuts(t["log_prob"], dim, chains, warmup, draws, 7)
                results[(name, kernel, chains)] = r
                shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}
                print(name, kernel, chains, shown, flush=True)

    lines = [
        "### Throughput: time per chain-gradient vs number of chains",
        "",
        f"Machine: {info['cpu']}, nproc={info['nproc']}, torch {info['torch']}, Python "
        f"{info['python']}, torch.set_num_threads(1), float64, log densities written batched "
        "(`batched=True`). One run per row; CPU = process CPU time / gradients, the steadier "
        "number when other jobs share the machine.",
        "",
    ]
    hmc_kernels = {"hmc": "default engine", "hmc-tensor": '`engine="torch"`'}
    for name in args.targets.split(","):
        for hmc_kernel in (k for k in args.kernels.split(",") if k in hmc_kernels):
            engines = sorted(
                {r["engine"] for (t, k, _), r in results.items() if (t, k) == (name, hmc_kernel)}
            )
            lines += [
                f"**{name}, static HMC** (`hmc.HMC(num_steps=10)`, {hmc_kernels[hmc_kernel]}: "
                f"{', '.join(engines)}; step size {targets[name]['step_size']}, warmup=0)",
                "",
                "| chains | draws | chain-gradients | wall (s) | µs / chain-gradient (wall) | "
                "µs / chain-gradient (CPU) | acceptance |",
                "|---|---|---|---|---|---|---|",
            ]
            for chains in chain_counts:
                r = results.get((name, hmc_kernel, chains))
                if r:
                    lines.append(
                        f"| {chains} | {r['draws']} | {r['grads']} | {r['wall']:.2f} | "
                        f"{r['us']:.2f} | {r['cpu_us']:.2f} | {r['accept']:.3f} |"
                    )
            lines.append("")
        if "nuts" in args.kernels.split(","):
            lines += [
                f"**{name}, NUTS** (default kernel, Stan warmup, random inits)",
                "",
                "| chains | warmup + draws | chain-gradients | wall (s) | µs / chain-gradient "
                "(whole run, wall) | (whole run, CPU) | (sampling phase, wall) | "
                "chain_utilization | mean n_steps | divergences |",
                "|---|---|---|---|---|---|---|---|---|---|",
            ]
            for chains in chain_counts:
                r = results.get((name, "nuts", chains))
                if r:
                    lines.append(
                        f"| {chains} | {r['warmup']} + {r['draws']} | {r['grads']} | "
                        f"{r['wall']:.2f} | {r['us']:.2f} | {r['cpu_us']:.2f} | "
                        f"{r['sampling_us']:.2f} | {r['utilization']:.3f} | "
                        f"{r['mean_steps']:.1f} | {r['divergences']} |"
                    )
            lines.append("")
    key = ("gauss2d", "hmc", 1024)
    if key in results:
        us = results[key]["us"]
        verdict = "met" if us <= TARGET_US else f"MISSED by {us / TARGET_US:.1f}x"
        lines.append(
            f"Target: at most {TARGET_US} µs per chain-gradient at 1024 chains on gauss2d "
            f"(static HMC): {us:.2f} µs wall, {results[key]['cpu_us']:.2f} µs CPU ({verdict})."
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
