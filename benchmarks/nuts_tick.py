"""Benchmark: NUTS cost per tick (one leapfrog step of every chain), both engines.

Times ``hmc.sample`` with NUTS (Stan warmup, 300 + 300 iterations, ``batched=True``) on
the 2-D correlated Gaussian at 1 and 4 chains and on the demo's non-centred eight schools
at 4 and 16 chains, and reports CPU microseconds per tick (process CPU time over gradient
evaluations per chain) in the NumPy engine (``engine="numpy"``, the CPU default: each
chain's tree on the host) and the torch engine (``engine="torch"``: the trees in batched
tensors, as on an accelerator), interleaved in one process, against the floor: one bare
``torch.autograd.grad`` of the same log density at the same number of chains. It also
reports how far apart the two engines' draws are (they run the same transitions from the
same random numbers; sums taken in a different order can differ in the last bits).
``--crossover`` instead times both engines at 16 to 256 chains (100 + 100 iterations, one
run each): the torch engine's cost per tick against the NumPy engine's as the number of
chains grows. ``--one-chain`` times one chain on each of ``nuts_anchors.py``'s five
targets against the floor of that target, with the log density passed for one position
``(D,) -> ()`` and as batched ``(1, D) -> (1,)`` (the same shape-generic function); the
per-tick figure leaves out each run's fixed cost (set-up and the DataTree), measured by a
one-draw run beside it. ``--split`` takes one chain's tick on the two Gaussians apart:
the whole tick; the same run with the energy module's ``value_and_grad`` replaced by the
closed-form energy and gradient in the engine's arrays (what the tree, the leapfrog's
arithmetic, the recording and the warmup cost around a gradient that evicts nothing);
the energy module's call alone, in a loop; and the floor. What the whole tick costs
beyond the sum of its parts is what the autograd call's passes through the caches cost
the code around it. ``--one-chain`` and ``--split`` run in the engine ``--engine`` names
(the default picks NumPy on the CPU).

To compare whole runs with another git revision of the package, use
``benchmarks/against.py`` (each tree in its own subprocesses, interleaved).

Run from the repository root::

    python -m benchmarks.nuts_tick --reps 3
    python -m benchmarks.nuts_tick --crossover
    python -m benchmarks.nuts_tick --one-chain --reps 3 [--engine torch]
    python -m benchmarks.nuts_tick --split --reps 5 [--engine torch]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import numpy as np
import torch

import hmc
from hmc._torch_compat import distribution_validation_off
from hmc.arrays import ENGINES, as_arrays
from hmc.demo import eight_schools

try:
    from benchmarks.machine import machine
    from benchmarks.nuts_anchors import PRECISION as PRECISION_2D
    from benchmarks.nuts_anchors import SDS100, TARGETS, inits, torch_log_prob
except ModuleNotFoundError:  # run as a plain file: its folder is on sys.path
    from machine import machine
    from nuts_anchors import PRECISION as PRECISION_2D
    from nuts_anchors import SDS100, TARGETS, inits, torch_log_prob

PRECISION = torch.tensor([[10.25, -9.74], [-9.74, 10.25]], dtype=torch.float64)


def gauss2d(q: torch.Tensor) -> torch.Tensor:
    """Batched log density ``(C, 2) -> (C,)`` of the correlated 2-D Gaussian."""
    return -0.5 * ((q @ PRECISION) * q).sum(-1)


CASES = {
    "gauss2d, 1 chain": (gauss2d, 2, 1),
    "gauss2d, 4 chains": (gauss2d, 2, 4),
    "eight schools, 4 chains": (eight_schools().log_prob, 10, 4),
    "eight schools, 16 chains": (eight_schools().log_prob, 10, 16),
}


#: the engines the default comparison and ``--crossover`` time, side by side
COMPARED = ("numpy", "torch")


def time_one(engine: str, case: tuple, iterations: int, seed: int) -> tuple[float, np.ndarray]:
    """(CPU µs per tick, draws) of one NUTS run of a ``(log_prob, dim, chains)`` case in
    ``engine``."""
    log_prob, dim, chains = case
    started = time.process_time()
    dt = hmc.sample(
        log_prob, dim=dim, chains=chains, warmup=iterations, draws=iterations, seed=seed,
        batched=True, progress=False, kernel="nuts", engine=engine,
    )  # fmt: skip
    seconds = time.process_time() - started
    assert dt.attrs["engine"] == engine, (dt.attrs["engine"], engine)
    ticks = int(dt.attrs["n_gradient_evaluations"]) / chains
    return seconds / ticks * 1e6, dt["posterior"]["x"].values


def warm_up() -> None:
    """One short untimed run in each engine (imports, first-call costs)."""
    for engine in COMPARED:
        for case in ((gauss2d, 2, 1), (eight_schools().log_prob, 10, 4)):
            time_one(engine, case, 10, seed=0)


def floor_us(case: str, calls: int = 500) -> float:
    """CPU µs of one bare ``torch.autograd.grad`` of the case's log density."""
    log_prob, dim, chains = CASES[case]
    q = torch.randn(chains, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    started = time.process_time()
    for _ in range(calls):
        x = q.detach().requires_grad_()
        torch.autograd.grad(log_prob(x).sum(), x)
    return (time.process_time() - started) / calls * 1e6


def crossover(iterations: int = 100, chain_counts=(16, 32, 64, 128, 256)) -> None:
    """CPU µs per tick of both engines at 16-256 chains (one run each)."""
    warm_up()
    print("| target | chains | numpy (µs / tick) | torch (µs / tick) | torch / numpy |")
    print("|---|---|---|---|---|")
    for name, (log_prob, dim) in {
        "gauss2d": (gauss2d, 2),
        "eight schools": (eight_schools().log_prob, 10),
    }.items():
        for chains in chain_counts:
            case = (log_prob, dim, chains)
            us = {e: time_one(e, case, iterations, seed=3)[0] for e in COMPARED}
            print(
                f"| {name} | {chains} | {us['numpy']:.0f} | {us['torch']:.0f} | "
                f"{us['torch'] / us['numpy']:.2f} |",
                flush=True,
            )


def one_chain(reps: int, iterations: int, engine: str = "auto", targets=TARGETS) -> None:
    """CPU µs per tick of one chain on each anchor target in ``engine``, without the
    run's fixed cost, against one bare ``autograd.grad`` of the same function (medians of
    ``reps``)."""
    print(
        f"CPU µs per tick, one chain, engine {engine}, {iterations} + {iterations} "
        f"iterations, medians of {reps}; fixed cost per run (from a one-draw run) "
        "subtracted.\n"
    )
    print("| target | density | tick (µs) | floor (µs) | tick / floor | fixed (s) | mean n_steps |")
    print("|---|---|---|---|---|---|---|")
    for target in targets:
        log_prob = torch_log_prob(target)
        init = torch.as_tensor(inits(target, 1, seed=1)[0])
        forms = {"one position": (False, init), "batched": (True, init.unsqueeze(0))}
        for form, (batched, point) in forms.items():

            def sample(warmup: int, draws: int, seed: int, lp=log_prob, b=batched, x0=init):
                started = time.process_time()
                dt = hmc.sample(
                    lp, x0, chains=1, warmup=warmup, draws=draws, seed=seed,
                    batched=b, progress=False, engine=engine,
                )  # fmt: skip
                seconds = time.process_time() - started
                return seconds, int(dt.attrs["n_gradient_evaluations"]), dt

            def floor(calls: int = 300, lp=log_prob, x0=point) -> float:
                started = time.process_time()
                for _ in range(calls):
                    x = x0.detach().requires_grad_()
                    torch.autograd.grad(lp(x).sum(), x)
                return (time.process_time() - started) / calls * 1e6

            sample(5, 5, seed=0)  # first-call costs
            ticks, floors, fixed, steps = [], [], [], []
            for rep in range(reps):
                fixed.append(min(sample(0, 1, seed=rep)[0] for _ in range(2)))
                seconds, grads, dt = sample(iterations, iterations, seed=rep)
                ticks.append((seconds - fixed[-1]) / grads * 1e6)
                floors.append(floor())
                steps.append(float(dt["sample_stats"]["n_steps"].values.mean()))
            tick, low = statistics.median(ticks), statistics.median(floors)
            print(
                f"| {target} | {form} | {tick:.0f} | {low:.0f} | {tick / low:.2f} | "
                f"{statistics.median(fixed):.2f} | {statistics.mean(steps):.1f} |",
                flush=True,
            )


#: the Gaussians' precision and variances for ``--split``'s closed forms, as a NumPy
#: array and as a tensor (indexed by whether the positions are tensors)
_CONSTANTS = {
    "gauss2d": (PRECISION_2D, torch.as_tensor(PRECISION_2D)),
    "diag100": (SDS100**2, torch.as_tensor(SDS100**2)),
}
#: closed-form gradients of U = -log p for ``--split``: ``(C, D) -> (C, D)``, NumPy arrays
#: or tensors (the engine's arrays)
CLOSED_FORM_GRADS = {
    "gauss2d": lambda q: q @ _CONSTANTS["gauss2d"][isinstance(q, torch.Tensor)],
    "diag100": lambda q: q / _CONSTANTS["diag100"][isinstance(q, torch.Tensor)],
}


@contextlib.contextmanager
def energy_replaced(grad):
    """``hmc.Potential.value_and_grad`` replaced by a closed-form Gaussian energy
    ``U = q . grad(q) / 2`` in the arrays it is given (counted as the original counts)."""
    original = hmc.Potential.value_and_grad

    def closed_form(self, q):
        self.evaluations += q.shape[0]
        g = grad(q)
        if isinstance(q, np.ndarray):
            return 0.5 * np.add.reduce(g * q, -1), g
        return 0.5 * (g * q).sum(-1), g

    hmc.Potential.value_and_grad = closed_form
    try:
        yield
    finally:
        hmc.Potential.value_and_grad = original


def split(reps: int, iterations: int, calls: int = 2000, engine: str = "auto") -> None:
    """One chain's tick on the two Gaussians in ``engine``, taken apart (see the module's
    docstring)."""
    rows_of = {"auto": "numpy", "numpy": "numpy", "torch": "torch"}[engine]  # on the CPU
    print(
        f"CPU µs per gradient, one chain, one position, engine {engine}, {iterations} + "
        f"{iterations} iterations (each run's fixed cost, from a one-draw run, subtracted), "
        f"medians of {reps} interleaved rounds; loops of {calls} calls on {rows_of} rows.\n"
    )
    print(
        "| target | tick | tick, closed-form energy | energy module alone | closed form alone "
        "| floor | tick / floor | rest of tick / floor | energy module / floor | unexplained |"
    )
    print("|---" * 10 + "|")
    for target, grad in CLOSED_FORM_GRADS.items():
        log_prob = torch_log_prob(target)
        point = torch.as_tensor(inits(target, 1, seed=1)[0])
        rows = point[None].clone()
        rows = as_arrays(rows) if rows_of == "numpy" else rows

        def tick(seed: int, lp=log_prob, x0=point) -> float:
            def run(warmup: int, draws: int) -> tuple[float, int]:
                started = time.process_time()
                dt = hmc.sample(
                    lp, x0, chains=1, warmup=warmup, draws=draws, seed=seed, progress=False,
                    engine=engine,
                )  # fmt: skip
                return time.process_time() - started, int(dt.attrs["n_gradient_evaluations"])

            fixed = min(run(0, 1)[0] for _ in range(2))
            seconds, grads = run(iterations, iterations)
            return (seconds - fixed) / grads * 1e6

        def alone(q=rows, lp=log_prob) -> float:
            potential = hmc.Potential(lp)
            with distribution_validation_off():
                started = time.process_time()
                for _ in range(calls):
                    potential.value_and_grad(q)
            return (time.process_time() - started) / calls * 1e6

        def floor(lp=log_prob, x0=point) -> float:
            started = time.process_time()
            for _ in range(calls):
                x = x0.detach().requires_grad_()
                torch.autograd.grad(lp(x).sum(), x)
            return (time.process_time() - started) / calls * 1e6

        def closed(seed: int, g=grad) -> tuple[float, float]:
            with energy_replaced(g):
                return tick(seed), alone()

        tick(0)  # first-call costs
        times: dict[str, list[float]] = {}
        for seed in range(reps):
            whole = tick(seed)
            closed_tick, closed_alone = closed(seed)
            for name, us in zip(
                ("tick", "closed", "alone", "closed alone", "floor"),
                (whole, closed_tick, alone(), closed_alone, floor()),
                strict=True,
            ):
                times.setdefault(name, []).append(us)
        m = {name: statistics.median(us) for name, us in times.items()}
        rest = m["closed"] - m["closed alone"]
        unexplained = m["tick"] - rest - m["alone"]
        print(
            f"| {target} | {m['tick']:.0f} | {m['closed']:.0f} | {m['alone']:.0f} | "
            f"{m['closed alone']:.1f} | {m['floor']:.0f} | {m['tick'] / m['floor']:.2f} | "
            f"{rest / m['floor']:.2f} | {m['alone'] / m['floor']:.2f} | "
            f"{unexplained:.0f} ({unexplained / m['floor']:.2f}) |",
            flush=True,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--iterations",
        type=int,
        default=None,
        help="warmup = draws = this (300; 100 for --crossover)",
    )
    parser.add_argument("--crossover", action="store_true", help="16-256 chains, both ways")
    parser.add_argument("--one-chain", action="store_true", help="one chain, five targets")
    parser.add_argument("--split", action="store_true", help="one chain's tick taken apart")
    parser.add_argument(
        "--engine", default="auto", choices=ENGINES, help="for --one-chain and --split"
    )
    parser.add_argument(
        "--chains", default="16,32,64,128,256", help="for --crossover: comma-separated counts"
    )
    parser.add_argument(
        "--targets", default=",".join(TARGETS), help="for --one-chain: comma-separated targets"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.crossover:
        crossover(args.iterations or 100, [int(c) for c in args.chains.split(",")])
        return
    args.iterations = args.iterations or 300
    if args.one_chain:
        one_chain(args.reps, args.iterations, args.engine, args.targets.split(","))
        return
    if args.split:
        split(args.reps, args.iterations, engine=args.engine)
        return
    labels = list(COMPARED)
    warm_up()
    times: dict[tuple[str, str], list[float]] = {}
    gaps: dict[str, float] = {}
    for rep in range(args.reps):
        for case in CASES:
            draws = {}
            order = labels[::-1] if rep % 2 else labels  # alternate who goes first
            for label in order:
                us, draws[label] = time_one(label, CASES[case], args.iterations, seed=rep)
                times.setdefault((case, label), []).append(us)
            times.setdefault((case, "floor"), []).append(floor_us(case))
            gap = float(np.abs(draws["numpy"] - draws["torch"]).max())
            gaps[case] = max(gaps.get(case, 0.0), gap)
    info = {**machine(), "torch": torch.__version__}
    print(
        f"Machine: {', '.join(f'{k} {v}' for k, v in info.items())}. CPU µs per tick, medians "
        f"of {args.reps} interleaved runs (alternating order), "
        f"{args.iterations} + {args.iterations} iterations; floor: one bare autograd.grad "
        "at the same number of chains.\n"
    )
    columns = [*labels, "floor"]
    print(
        "| case | "
        + " | ".join(f"{c} (µs)" for c in columns)
        + " | torch / numpy | numpy / floor | max |numpy - torch| draw |"
    )
    print("|---" * (len(columns) + 4) + "|")
    for case in CASES:
        m = {c: statistics.median(times[(case, c)]) for c in columns}
        print(
            f"| {case} | "
            + " | ".join(f"{m[c]:.0f}" for c in columns)
            + f" | {m['torch'] / m['numpy']:.2f} | {m['numpy'] / m['floor']:.2f} "
            f"| {gaps[case]:.1e} |"
        )


if __name__ == "__main__":
    main()
