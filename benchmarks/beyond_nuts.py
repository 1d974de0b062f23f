"""Gradients per effective draw: MAMS against NUTS and ChEES, side by side in one process.

For each target and sampler: one run (warmup, then draws), the gradients of the sampling
phase (the sum of ``n_steps`` over the kept transitions, one gradient per leapfrog step)
over the smallest bulk ESS among the coordinates (:func:`hmc.diagnostics.ess`) of the
draws ``x`` and of their squares ``x^2`` (the second moments the MAMS paper scores). Lower
is better. The warmup's gradients are reported too (``n_gradient_evaluations`` less the
sampling ones), and the CPU seconds of the whole run (``time.process_time``).

Targets: a 100-D Gaussian with standard deviations from 0.1 to 10 (condition number 1e4),
axis-aligned (a diagonal metric whitens it) and rotated by a fixed random rotation (it
cannot); the non-centred eight schools of posteriordb (:mod:`hmc.models`).

Usage::

    python -m benchmarks.beyond_nuts                    # every target, every sampler
    python -m benchmarks.beyond_nuts --only gauss100 --draws 500
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch

import hmc
import hmc.models
from hmc.diagnostics import ess

SAMPLERS = {
    "NUTS (Stan warmup, 4 chains)": dict(kernel="nuts", chains=4),
    "ChEES (pooled warmup, 16 chains)": dict(kernel="chees", chains=16),
    "MAMS (Stan warmup, 4 chains)": dict(kernel="mams", chains=4),
    "MAMS (pooled warmup, 16 chains)": dict(kernel="mams", chains=16, adapt="ensemble"),
}


def gaussian(dim: int, rotated: bool):
    """A Gaussian log density ``(C, D) -> (C,)`` with sds ``geomspace(0.1, 10)``."""
    sd = torch.as_tensor(np.geomspace(0.1, 10.0, dim))
    rotation = torch.eye(dim, dtype=torch.float64)
    if rotated:
        generator = torch.Generator().manual_seed(0)
        rotation = torch.linalg.qr(torch.randn(dim, dim, generator=generator, dtype=torch.float64))[
            0
        ]

    def log_prob(q: torch.Tensor) -> torch.Tensor:
        return -0.5 * (((q @ rotation) / sd) ** 2).sum(-1)

    return log_prob


TARGETS = {
    "gauss100": lambda: (gaussian(100, False), dict(dim=100, batched=True)),
    "gauss100-rotated": lambda: (gaussian(100, True), dict(dim=100, batched=True)),
    "eight_schools_noncentered": lambda: (hmc.models.load("eight_schools_noncentered"), {}),
}


def flat_draws(tree) -> np.ndarray:
    """Every posterior variable's draws as ``(chain, draw, K)``."""
    posterior = tree["posterior"]
    arrays = [posterior[name].values for name in posterior.data_vars]
    return np.concatenate([a.reshape(*a.shape[:2], -1) for a in arrays], -1)


def measure(target, options: dict, warmup: int, draws: int, seed: int) -> dict:
    started = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tree = hmc.sample(target, warmup=warmup, draws=draws, seed=seed, progress=False, **options)
    seconds = time.process_time() - started
    x = flat_draws(tree)
    sampling = int(tree["sample_stats"]["n_steps"].values.sum())
    first = min(ess(x[..., k]) for k in range(x.shape[-1]))
    second = min(ess(x[..., k] ** 2) for k in range(x.shape[-1]))
    return dict(
        per_ess=sampling / first,
        per_ess_squares=sampling / second,
        warmup_gradients=int(tree.attrs["n_gradient_evaluations"]) - sampling,
        steps=float(tree["sample_stats"]["n_steps"].values.mean()),
        accept=float(tree["sample_stats"]["acceptance_rate"].values.mean()),
        divergences=int(tree["sample_stats"]["diverging"].values.sum()),
        seconds=seconds,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(TARGETS))
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| target | sampler | gradients / ESS(x) | gradients / ESS(x^2) | steps | "
          "acceptance | divergences | warmup gradients | CPU s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.only or TARGETS:
        target, extra = TARGETS[name]()
        for label, options in SAMPLERS.items():
            row = measure(target, {**extra, **options}, args.warmup, args.draws, args.seed)
            print(
                f"| {name} | {label} | {row['per_ess']:.1f} | {row['per_ess_squares']:.1f} | "
                f"{row['steps']:.1f} | {row['accept']:.2f} | {row['divergences']} | "
                f"{row['warmup_gradients']} | {row['seconds']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
