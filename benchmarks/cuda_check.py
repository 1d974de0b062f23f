"""Check and benchmark: the batched sampler on a CUDA device, against the CPU.

One run, sized to finish in about five minutes on one GPU, in four parts (each writes its
results as it goes, so a run cut short keeps what it measured):

1. **Same draws as the CPU.** ``hmc.sample`` with one seed on the CPU (``engine="numpy"``,
   the CPU's default: each NUTS tree on the host; ``--cpu-engine torch`` for batched
   tensors on the CPU instead) and on the device (``engine="torch"``), 8 chains, NUTS and
   static HMC, on a diagonal Gaussian (elementwise arithmetic) and the correlated 2-D
   Gaussian (a matrix product); once with a given step size and no warmup, once after
   Stan's warmup. Random numbers are a function of (seed, chain, counter) only, so the
   two runs differ only by floating-point rounding: per chain, the first draw where they
   differ by more than 1e-8 (or none), the largest difference before it, and the gradient
   counts and adapted step sizes of both. Without warmup they must agree; warmup amplifies
   rounding until the chains part. With ``--device cpu`` this compares the two engines on
   the CPU.
   ``sensitivity`` repeats one run with its starts moved by 1e-14 (on one device): how far
   warmup's adaptation carries a rounding-sized change.
2. **Host syncs.** ``torch.cuda.set_sync_debug_mode("warn")`` makes torch warn at every
   call that waits for the device (``.item()``, ``.tolist()``, a copy to the host,
   ``nonzero``...). The warnings of a whole ``hmc.sample`` run are counted, with the
   number of kernel calls (``step``: one leapfrog step of every chain for NUTS, one
   transition for static HMC) and where each sync comes from.
3. **Statistics at many chains.** NUTS with 4096 chains on the device: the mean and
   second moment of every coordinate of both Gaussians, and the 2-D cross moment, against
   the exact values. Chains are independent, so the standard error of the average over
   chains is the standard deviation of the per-chain averages over sqrt(4096), with no
   autocorrelation estimate; the largest |z| is compared with a Bonferroni bound.
4. **Throughput**: time per chain-gradient for static HMC (``num_steps=10``, fixed step,
   no warmup) and NUTS (Stan's warmup) on the 2-D Gaussian and the logistic regression
   (N=5000, D=50) of ``throughput.py``, at 1024, 10240 and 102400 chains, plus the same
   static HMC rows at 1024 chains on the CPU (one thread), in both engines, side by side.

Run from the repository root (``--device cpu --quick`` runs parts 1, 3 and 4 in small on
a machine without a GPU, to check the script)::

    python -m benchmarks.cuda_check --out DIR
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import statistics
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch

import hmc

try:
    from benchmarks.machine import machine
    from benchmarks.throughput import PRECISION, make_logistic, run_hmc, run_nuts
except ModuleNotFoundError:  # run as a plain file: its folder is on sys.path
    from machine import machine
    from throughput import PRECISION, make_logistic, run_hmc, run_nuts

PARTS = ("agreement", "sensitivity", "syncs", "moments", "throughput")
DIAG_SCALES = torch.linspace(0.5, 5.0, 10, dtype=torch.float64)
AGREE_TOL = 1e-8
SEED = 1
#: the engines of the CPU rows beside the device's in the throughput part
CPU_ENGINES = ("numpy", "torch")


def make_gauss2d(device, dtype=torch.float64):
    """The correlated 2-D Gaussian ``(C, 2) -> (C,)`` on ``device`` (a matrix product)."""
    precision = PRECISION.to(device, dtype)

    def log_prob(q: torch.Tensor) -> torch.Tensor:
        return -0.5 * ((q @ precision) * q).sum(-1)

    return log_prob


def make_diag10(device, dtype=torch.float64):
    """A 10-D diagonal Gaussian, scales 0.5 to 5 (elementwise arithmetic only)."""
    scales = DIAG_SCALES.to(device, dtype)

    def log_prob(q: torch.Tensor) -> torch.Tensor:
        return -0.5 * ((q / scales) ** 2).sum(-1)

    return log_prob


TARGETS = {"diag10": (make_diag10, 10), "gauss2d": (make_gauss2d, 2)}


def kernel_named(name: str):
    """``nuts``; ``hmc``: 10 steps; ``hmc-jitter``: Stan's 2π trajectory, jittered."""
    return {"nuts": hmc.NUTS, "hmc": lambda: hmc.HMC(num_steps=10), "hmc-jitter": hmc.HMC}[name]()


def sample_on(
    device, target: str, kernel, chains: int, warmup: int, draws: int, step=None, **extra
):
    """``hmc.sample`` of ``target`` on ``device`` with the kernel named ``kernel`` (or that
    kernel instance) and seed 1; ``extra`` goes to ``hmc.sample``."""
    make, dim = TARGETS[target]
    return hmc.sample(
        make(device),
        dim=dim,
        chains=chains,
        warmup=warmup,
        draws=draws,
        kernel=kernel_named(kernel) if isinstance(kernel, str) else kernel,
        step_size=step,
        seed=SEED,
        device=device,
        progress=False,
        batched=True,
        **extra,
    )


# ---------------------------------------------------------------------- 1. agreement
#: stable step sizes (no warmup) for the fixed-parameter comparison
FIXED_STEP = {("diag10", "nuts"): 0.5, ("diag10", "hmc"): 0.2}
FIXED_STEP |= {("gauss2d", "nuts"): 0.15, ("gauss2d", "hmc"): 0.1}


def agreement(
    device: str,
    target: str,
    kernel: str,
    chains: int,
    iterations: int,
    adapted: bool,
    cpu_engine: str = "numpy",
) -> dict:
    """The same run on the CPU in ``cpu_engine`` and on ``device`` in the torch engine:
    where each chain's draws part. Without ``adapted``, no warmup and a given stable step
    size (the draws must agree to rounding); with it, Stan's warmup first (rounding then
    grows until chains part)."""
    warmup, step = (iterations, None) if adapted else (0, FIXED_STEP[target, kernel])
    runs = []
    for where, engine in (("cpu", cpu_engine), (device, "torch")):
        t0 = time.perf_counter()
        dt = sample_on(where, target, kernel, chains, warmup, iterations, step, engine=engine)
        runs.append((dt, time.perf_counter() - t0))
    (a, ta), (b, tb) = runs
    xa, xb = a["posterior"]["x"].values, b["posterior"]["x"].values  # (C, N, D)
    diff = np.abs(xa - xb).max(-1)  # (C, N)
    parted = diff > AGREE_TOL
    first = [int(row.argmax()) if row.any() else None for row in parted]
    before = [
        float(d[: f if f is not None else None].max(initial=0.0))
        for d, f in zip(diff, first, strict=True)
    ]
    step_a = a["adaptation"]["step_size"].values
    step_b = b["adaptation"]["step_size"].values
    return {
        "part": "agreement",
        "target": target,
        "kernel": kernel,
        "chains": chains,
        "warmup": warmup,
        "draws": iterations,
        "engine_cpu": a.attrs["engine"],
        "engine_device": b.attrs["engine"],
        "max_abs_diff": float(diff.max()),
        "chains_identical_within_tol": sum(f is None for f in first),
        "first_parting_draw": first,
        "max_diff_before_parting": max(before),
        "grads_cpu": int(a.attrs["n_gradient_evaluations"]),
        "grads_device": int(b.attrs["n_gradient_evaluations"]),
        "step_size_max_rel_diff": float(np.abs(step_a / step_b - 1).max()),
        "seconds_cpu": ta,
        "seconds_device": tb,
    }


def sensitivity(device: str, kernel: str, iterations: int = 150) -> dict:
    """How far warmup carries a rounding-sized change: the same run on one device with
    the starts moved by 1e-14; chain 0's largest coordinate difference and step-size
    difference at selected warmup iterations."""
    starts = 4 * torch.rand(4, 10, generator=torch.Generator().manual_seed(0)) - 2
    a, b = (
        sample_on(
            device,
            "diag10",
            kernel,
            4,
            iterations,
            1,
            init=starts.to(torch.float64) + shift,
            save_warmup=True,
        )
        for shift in (0.0, 1e-14)
    )
    dx = np.abs(a["warmup_posterior"]["x"].values - b["warmup_posterior"]["x"].values)[0]
    step_a = a["warmup_sample_stats"]["step_size"].values[0]
    step_b = b["warmup_sample_stats"]["step_size"].values[0]
    at = [t for t in (1, 10, 20, 30, 50, 75, 100, iterations - 1) if t < iterations]
    return {
        "part": "sensitivity",
        "kernel": kernel,
        "iteration": at,
        "max_abs_dx_chain0": [float(dx[t].max()) for t in at],
        "abs_dstep_chain0": [float(abs(step_a[t] - step_b[t])) for t in at],
        "step_chain0": [float(step_a[t]) for t in at],
    }


# ---------------------------------------------------------------------- 2. host syncs
def count_syncs(device: str, target: str, kernel: str, chains: int, iterations: int) -> dict:
    """Every synchronizing call of one ``hmc.sample`` run on ``device``, with the number
    of kernel calls and the syncs made inside them."""
    calls = collections.Counter()
    kernel_obj = kernel_named(kernel)
    cls = type(kernel_obj)
    original = cls.step
    seen: list[warnings.WarningMessage] = []

    def counted(self, *args, **kwargs):
        calls["step"] += 1
        before = len(seen)
        out = original(self, *args, **kwargs)
        calls["inside"] += len(seen) - before
        return out

    cls.step = counted
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            seen = caught
            t0 = time.perf_counter()
            dt = sample_on(device, target, kernel_obj, chains, iterations, iterations)
            seconds = time.perf_counter() - t0
    finally:
        torch.cuda.set_sync_debug_mode("default")
        cls.step = original
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    where = collections.Counter(f"{Path(w.filename).name}:{w.lineno}" for w in syncs)
    steps = int(dt["sample_stats"]["n_steps"].values.sum())
    return {
        "part": "syncs",
        "target": target,
        "kernel": kernel,
        "chains": chains,
        "iterations": iterations,
        "kernel_calls": calls["step"],
        "syncs_total": len(syncs),
        "syncs_inside_kernel_calls": calls["inside"],
        "syncs_per_kernel_call": len(syncs) / max(1, calls["step"]),
        "leapfrog_steps_per_chain_kept": steps / chains,
        "sync_sites": dict(where.most_common(12)),
        "seconds": seconds,
    }


# ---------------------------------------------------------------------- 3. statistics
def moments_check(device: str, target: str, chains: int, iterations: int) -> dict:
    """z-scores of the per-coordinate mean and second moment (and the 2-D cross moment)
    against exact values, from per-chain averages of independent chains."""
    dt = sample_on(device, target, "nuts", chains, iterations, iterations)
    x = dt["posterior"]["x"].values  # (C, N, D)
    if target == "diag10":
        cov = torch.diag(DIAG_SCALES**2).numpy()
    else:
        cov = torch.linalg.inv(PRECISION).numpy()
    dim = cov.shape[0]
    stats = {f"mean[{i}]": (x[..., i], 0.0) for i in range(dim)}
    stats.update({f"E[x{i}^2]": (x[..., i] ** 2, cov[i, i]) for i in range(dim)})
    if dim == 2:
        stats["E[x0 x1]"] = (x[..., 0] * x[..., 1], cov[0, 1])
    z = {}
    for name, (values, truth) in stats.items():
        per_chain = values.mean(1)  # (C,)
        se = per_chain.std(ddof=1) / math.sqrt(chains)
        z[name] = float((per_chain.mean() - truth) / se)
    bound = statistics.NormalDist().inv_cdf(1 - 0.001 / (2 * len(z)))
    worst = max(z, key=lambda k: abs(z[k]))
    return {
        "part": "moments",
        "target": target,
        "chains": chains,
        "warmup": iterations,
        "draws": iterations,
        "tests": len(z),
        "max_abs_z": abs(z[worst]),
        "worst": worst,
        "bonferroni_bound_0.001": bound,
        "passed": abs(z[worst]) < bound,
        "divergences": int(dt["sample_stats"]["diverging"].values.sum()),
        "z": z,
    }


# ---------------------------------------------------------------------- 4. throughput
def throughput_rows(device: str, quick: bool):
    """(label, thunk) for every timed run, cheapest first."""
    scale = 0.1 if quick else 1.0
    big = (1024, 10240) if quick else (1024, 10240, 102400)
    gauss_dev = make_gauss2d(device)
    logistic_dev, beta_dev = make_logistic(device)
    logistic_cpu, beta_cpu = make_logistic("cpu")
    zeros2 = torch.zeros(2, dtype=torch.float64)
    rows = []
    for chains in big:
        draws = max(5, int(scale * (200 if chains <= 10240 else 100)))
        rows.append(
            (
                ("gauss2d", "hmc", device, chains),
                lambda c=chains, d=draws: run_hmc(gauss_dev, zeros2, c, 0.25, d, 7, device=device),
            )
        )
    for engine in CPU_ENGINES:
        rows.append(
            (
                ("gauss2d", "hmc", f"cpu/{engine}", 1024),
                lambda e=engine: run_hmc(
                    make_gauss2d("cpu"), zeros2, 1024, 0.25, max(5, int(50 * scale)), 7, e
                ),
            )
        )
    for chains in big:
        it = max(20, int(scale * 100))
        rows.append(
            (
                ("gauss2d", "nuts", device, chains),
                lambda c=chains, i=it: run_nuts(gauss_dev, 2, c, i, i, 7, device=device),
            )
        )
    rows.append(
        (
            ("gauss2d", "hmc-float32", device, big[-1]),
            lambda: run_hmc(
                make_gauss2d(device, torch.float32),
                zeros2,
                big[-1],
                0.25,
                max(5, int(100 * scale)),
                7,
                device=device,
                dtype=torch.float32,
            ),
        )
    )
    for chains in big:
        draws = max(2, int(scale * {1024: 50, 10240: 20}.get(chains, 5)))
        rows.append(
            (
                ("logistic", "hmc", device, chains),
                lambda c=chains, d=draws: run_hmc(
                    logistic_dev, beta_dev, c, 0.015, d, 7, device=device
                ),
            )
        )
    for engine in CPU_ENGINES:
        rows.append(
            (
                ("logistic", "hmc", f"cpu/{engine}", 1024),
                lambda e=engine: run_hmc(logistic_cpu, beta_cpu, 1024, 0.015, 2, 7, e),
            )
        )
    for chains in big:
        it = max(20, int(scale * {1024: 60, 10240: 40}.get(chains, 30)))
        rows.append(
            (
                ("logistic", "nuts", device, chains),
                lambda c=chains, i=it: run_nuts(logistic_dev, 50, c, i, i, 7, device=device),
            )
        )
    return rows


# ---------------------------------------------------------------------- driver
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=".")
    parser.add_argument("--quick", action="store_true", help="small sizes (a script check)")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds; later runs skip")
    parser.add_argument("--parts", default=",".join(PARTS), help="a comma-separated subset")
    parser.add_argument(
        "--cpu-engine",
        default="numpy",
        choices=("numpy", "torch"),
        help="the CPU side's engine in the agreement part",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="Found chain dimension")  # 10k chains, 20 draws
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "cuda_check.jsonl").open("w")
    started = time.perf_counter()
    info = {**machine(), "torch": torch.__version__, "device": args.device}
    if args.device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(args.device)
    log.write(json.dumps({"part": "machine", **info}) + "\n")

    def record(label, thunk):
        elapsed = time.perf_counter() - started
        if elapsed > args.budget:
            result = {"part": "skipped", "run": label, "elapsed": elapsed}
        else:
            try:
                if args.device.startswith("cuda"):
                    torch.cuda.reset_peak_memory_stats()
                result = thunk()
                if args.device.startswith("cuda"):
                    result["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
            except Exception:  # a failure is a result: report it and go on
                result = {"part": "error", "run": label, "error": traceback.format_exc()}
        if "run" not in result:
            result["run"] = label
        print(json.dumps(result), flush=True)
        log.write(json.dumps(result) + "\n")
        log.flush()

    # first-call costs (CUDA context, kernels, vmap), not timed
    record(
        "warm-up",
        lambda: {"seconds": _time(lambda: sample_on(args.device, "diag10", "nuts", 4, 20, 20))},
    )
    parts = args.parts.split(",")
    cuda = args.device.startswith("cuda")
    n = 20 if args.quick else 300
    for target in TARGETS if "agreement" in parts else ():
        for kernel, adapted in itertools.product(("nuts", "hmc"), (False, True)):
            record(
                ("agreement", target, kernel, "adapted" if adapted else "fixed"),
                lambda t=target, k=kernel, a=adapted: agreement(
                    args.device, t, k, 8, n, a, args.cpu_engine
                ),
            )
    for kernel in ("hmc", "nuts") if "sensitivity" in parts else ():
        record(("sensitivity", kernel), lambda k=kernel: sensitivity(args.device, k))
    for kernel in ("nuts", "hmc", "hmc-jitter") if "syncs" in parts and cuda else ():
        record(
            ("syncs", kernel),
            lambda k=kernel: count_syncs(args.device, "gauss2d", k, 1024, 10 if args.quick else 50),
        )
    many = 256 if args.quick else 4096
    for target in TARGETS if "moments" in parts else ():
        record(
            ("moments", target),
            lambda t=target: moments_check(args.device, t, many, 50 if args.quick else 300),
        )
    for label, thunk in throughput_rows(args.device, args.quick) if "throughput" in parts else ():
        record(("throughput", *label), lambda th=thunk: {"part": "throughput", **th()})
    log.close()


def _time(thunk) -> float:
    t0 = time.perf_counter()
    thunk()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
