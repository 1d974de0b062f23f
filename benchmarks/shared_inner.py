"""Benchmark: gradients of k outer functions g_i(f(x)) through one expensive inner f.

Three ways to get every ``g_i(f(x))`` and its gradient:

- ``floor``: one forward and one backward through ``f`` alone (what a single gradient costs);
- ``shared``: :func:`hmc.autodiff.shared_inner_grads` (one forward, one backward through f);
- ``separate``: a forward and a backward per outer function (the hand-rolled loop);
- ``vmap-k`` (scalar cases only): ``torch.autograd.grad(y, x, grad_outputs=k cotangents,
  is_grads_batched=True)``, the batched product that ``shared`` avoids for a scalar ``y``.

Times: the process's CPU time (``time.process_time``, with one torch thread it is the work
done, and it hardly moves when other processes load the machine) and, in parentheses,
wall-clock time. Ratios use CPU time.

Cases: the scalar ``slow_fun`` (trace of ``matrix_exp`` of an ``n x n`` complex matrix,
n = 1000 and a fast n = 300), and a tensor-valued ``f`` (``matrix_exp`` of a matrix built
from ``x`` of shape ``(n,)``, returned whole) with scalar reductions as outer functions.
Repetitions are interleaved (every method once per round) and medians reported.

Run from the repository root::

    python benchmarks/shared_inner.py --out shared-inner-section.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hmc.autodiff import shared_inner_grads

KS = (2, 4, 8)
TARGET = 1.15
NOTE = (
    "A scalar f needs one backward whatever k is: shared costs the floor. A tensor-valued f "
    "needs k vector-Jacobian products whatever one does (one per cotangent); the batched "
    "product saves the k - 1 repeated forward passes, which matrix_exp's backward dwarfs "
    "here, so shared / floor grows with k there and the gain over separate passes is the "
    "forward's share."
)


def slow_fun(x: torch.Tensor, n: int = 1000) -> torch.Tensor:
    """The example: a 0-d ``x`` -> real 0-d trace of ``exp(i x ones(n, n))``."""
    A = x * torch.ones((n, n))
    B = torch.matrix_exp(1j * A)
    return torch.real(torch.trace(B))


def scalar_outer(n: int) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    """Eight outer functions of a scalar: sin(i y) and (y / n)**i."""
    sines = [lambda y, i=i: torch.sin(i * y) for i in range(1, 5)]
    powers = [lambda y, i=i: (y / n) ** i for i in range(1, 5)]
    return [g for pair in zip(sines, powers, strict=True) for g in pair]


def matrix_fun(n: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x`` ``(n,)`` -> ``(n, n)`` ``matrix_exp(W * x[:, None] + diag(x))``."""
    generator = torch.Generator().manual_seed(0)
    W = torch.randn(n, n, generator=generator, dtype=torch.float64) / n

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.matrix_exp(W * x[:, None] + torch.diag(x))

    return f


TENSOR_OUTER: list[Callable[[torch.Tensor], torch.Tensor]] = [
    torch.trace,
    torch.sum,
    lambda y: (y**2).sum(),
    lambda y: torch.sin(y).sum(),
    lambda y: torch.logsumexp(y.reshape(-1), 0),
    lambda y: y[:, 0].sum(),
    lambda y: (y.diagonal() ** 3).sum(),
    torch.linalg.matrix_norm,
]


@dataclass
class Case:
    name: str
    f: Callable[[torch.Tensor], torch.Tensor]
    outer: list[Callable[[torch.Tensor], torch.Tensor]]
    x: torch.Tensor
    reps: int


def floor(case: Case, k: int) -> None:
    x = case.x.detach().requires_grad_(True)
    y = case.f(x)
    torch.autograd.grad(y, x, grad_outputs=torch.ones_like(y))


def shared(case: Case, k: int) -> None:
    shared_inner_grads(case.f, case.outer[:k], case.x)


def separate(case: Case, k: int) -> None:
    for g in case.outer[:k]:
        x = case.x.detach().requires_grad_(True)
        torch.autograd.grad(g(case.f(x)), x)


def vmap_k(case: Case, k: int) -> None:
    x = case.x.detach().requires_grad_(True)
    y = case.f(x)
    cotangents = torch.ones((k, *y.shape), dtype=y.dtype)
    torch.autograd.grad(y, x, grad_outputs=cotangents, is_grads_batched=True)


def run_case(case: Case, with_vmap: bool) -> dict[tuple[str, int], tuple[float, float]]:
    """Median (CPU, wall) seconds per (method, k), repetitions interleaved across methods."""
    plan = [("floor", 1)]
    for k in KS:
        plan += [("shared", k), ("separate", k)] + ([("vmap-k", k)] if with_vmap else [])
    methods = {"floor": floor, "shared": shared, "separate": separate, "vmap-k": vmap_k}
    floor(case, 1)  # warm-up
    cpu: dict[tuple[str, int], list[float]] = {entry: [] for entry in plan}
    wall: dict[tuple[str, int], list[float]] = {entry: [] for entry in plan}
    for rep in range(case.reps):
        for method, k in plan:
            start_cpu, start_wall = time.process_time(), time.perf_counter()
            methods[method](case, k)
            cpu[method, k].append(time.process_time() - start_cpu)
            wall[method, k].append(time.perf_counter() - start_wall)
        print(f"  {case.name}: round {rep + 1}/{case.reps} done", flush=True)
    return {e: (statistics.median(cpu[e]), statistics.median(wall[e])) for e in plan}


def cpu_model() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    for line in lines.splitlines():
        if line.startswith("Model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def table(
    case: Case, medians: dict[tuple[str, int], tuple[float, float]], with_vmap: bool
) -> list[str]:
    def cell(entry: tuple[str, int]) -> str:
        return f"{medians[entry][0]:.3f} ({medians[entry][1]:.3f})"

    base = medians["floor", 1][0]
    header = "| k | floor: 1 fwd + 1 bwd (s) | shared (s) | shared / floor | separate (s) |"
    rule = "|---|---|---|---|---|"
    if with_vmap:
        header += " separate / shared | vmap-k (s) | vmap-k / floor |"
        rule += "---|---|---|"
    else:
        header += " separate / shared |"
        rule += "---|"
    lines = [f"### {case.name} ({case.reps} interleaved rounds, medians)", "", header, rule]
    for k in KS:
        s, p = medians["shared", k][0], medians["separate", k][0]
        row = f"| {k} | {cell(('floor', 1))} | {cell(('shared', k))} | {s / base:.3f} "
        row += f"| {cell(('separate', k))} | {p / s:.2f} |"
        if with_vmap:
            v = medians["vmap-k", k][0]
            row += f" {cell(('vmap-k', k))} | {v / base:.2f} |"
        lines.append(row)
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--slow-n", type=int, default=1000)
    parser.add_argument("--fast-n", type=int, default=300)
    parser.add_argument("--tensor-n", type=int, default=300)
    parser.add_argument("--reps-slow", type=int, default=3)
    parser.add_argument("--reps-fast", type=int, default=9)
    parser.add_argument("--out", default=None, help="write the markdown section here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    scalar = torch.tensor(0.3, dtype=torch.float64)
    cases = [
        (Case(f"scalar slow_fun, n = {args.fast_n}", lambda x: slow_fun(x, args.fast_n),
              scalar_outer(args.fast_n), scalar, args.reps_fast), True),
        (Case(f"tensor-valued matrix_exp, x (n,) -> (n, n), n = {args.tensor_n}",
              matrix_fun(args.tensor_n), TENSOR_OUTER,
              torch.linspace(-1.0, 1.0, args.tensor_n, dtype=torch.float64), args.reps_fast),
         False),
        (Case(f"scalar slow_fun, n = {args.slow_n}", lambda x: slow_fun(x, args.slow_n),
              scalar_outer(args.slow_n), scalar, args.reps_slow), False),
    ]  # fmt: skip
    load_before = os.getloadavg()
    started = time.perf_counter()
    lines = [
        "## Shared inner function: k outer functions, one backward (`benchmarks/shared_inner.py`)",
        "",
        f"Machine: {os.cpu_count()} cores, {cpu_model()}; torch {torch.__version__}, "
        f"`torch.set_num_threads({args.threads})`, Python {platform.python_version()}. "
        "Each cell: median CPU seconds (wall-clock seconds) to get all k values and "
        "gradients, forward passes included; ratios use CPU time.",
        "",
    ]
    for case, with_vmap in cases:
        print(f"{case.name} ...", flush=True)
        lines += table(case, run_case(case, with_vmap), with_vmap)
    elapsed = time.perf_counter() - started
    load_after = os.getloadavg()
    lines.append(
        f"Run took {elapsed:.0f} s; 1-minute load average {load_before[0]:.2f} before, "
        f"{load_after[0]:.2f} after. Target: shared / floor <= {TARGET} for scalar f."
    )
    lines += ["", NOTE]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
