"""Benchmark: a hand-written leapfrog loop against ``hmc.sample`` (static HMC, one chain).

Target: the 2-D Gaussian with precision ``[[10.25, -9.74], [-9.74, 10.25]]``
(``log p(q) = -q^T P q / 2``). Every method runs static HMC with 10 leapfrog steps of size
0.25 and a Metropolis test, 10,000 transitions (100,000 leapfrog steps), one chain, float64:

- ``loop-backward``: the hand-written loop, modernised: one ``energy(q).backward()`` per
  leapfrog step (the gradient is carried from step to step and across transitions, so
  there is no recomputation and no cache), ``q.grad`` read and reset, proper leapfrog
  (half kick, drift, half kick) and a Metropolis test;
- ``loop-grad``: the floor: the same loop with ``q.detach().requires_grad_()``, the energy
  and one ``torch.autograd.grad`` per step;
- ``hmc``: ``hmc.sample(log_prob, init, kernel=hmc.HMC(num_steps=10), step_size=0.25,
  warmup=0, draws=10000, chains=1, seed=..., progress=False)``, timed around the whole
  call (start-up, sampling and building the DataTree), with ``dt.attrs["sampling_time"]``
  reported too.

Repetitions are interleaved (every method once per round, in a rotating order) and the
median of each method is reported, with the median of the rounds' hmc / loop-grad ratios
(the machine's speed drifts between rounds more than within one).
``torch.set_num_threads(1)``. Gradients per leapfrog step count the loops' own calls and
``dt.attrs["n_gradient_evaluations"]`` for ``hmc`` (which includes the one evaluation at
the initial point). With ``--profile`` the script also runs ``cProfile`` over one
``hmc.sample`` call and prints where the time goes.

Run from the repository root::

    python -m benchmarks.loop_vs_hmc --reps 5 --out loop-section.md
"""

from __future__ import annotations

import argparse
import cProfile
import io
import math
import pstats
import statistics
import time

import torch

import hmc

try:
    from benchmarks.machine import machine
except ModuleNotFoundError:  # run as a plain file: its folder is on sys.path
    from machine import machine

PRECISION = torch.tensor([[10.25, -9.74], [-9.74, 10.25]], dtype=torch.float64)
STEP_SIZE = 0.25
NUM_STEPS = 10
DRAWS = 10_000
INIT = torch.tensor([0.5, -0.3], dtype=torch.float64)
TARGET_RATIO = 1.2


def machine_info() -> dict[str, str]:
    """The machine, with the torch version (reported with every result)."""
    return {**machine(), "torch": torch.__version__}


def log_prob(q: torch.Tensor) -> torch.Tensor:
    """Log density of one position ``(2,)``."""
    return -0.5 * (q @ PRECISION @ q)


def energy(q: torch.Tensor) -> torch.Tensor:
    """Potential energy U(q) = -log p(q) of one position ``(2,)``."""
    return 0.5 * (q @ PRECISION @ q)


class Counter:
    def __init__(self) -> None:
        self.calls = 0


def loop_backward(seed: int, draws: int = DRAWS) -> tuple[float, int, float, torch.Tensor]:
    """The hand-written loop with ``.backward()``: returns (seconds, gradients, acceptance,
    draws)."""
    gen = torch.Generator().manual_seed(seed)
    calls = 0
    out = torch.empty(draws, 2, dtype=torch.float64)
    started = time.perf_counter()
    q = INIT.clone().requires_grad_(True)
    U = energy(q)
    U.backward()
    calls += 1
    grad = q.grad.clone()
    q.grad = None
    U = U.detach()
    accepted = 0
    eps = STEP_SIZE
    for i in range(draws):
        p0 = torch.randn(2, dtype=torch.float64, generator=gen)
        H0 = float(U) + 0.5 * float(p0 @ p0)
        q_new = q.detach()
        p = p0 - 0.5 * eps * grad
        g_new = grad
        for _ in range(NUM_STEPS):
            q_new = (q_new.detach() + eps * p).requires_grad_(True)
            U_new = energy(q_new)
            U_new.backward()
            calls += 1
            g_new = q_new.grad
            p = p - 0.5 * eps * g_new
            if _ < NUM_STEPS - 1:
                p = p - 0.5 * eps * g_new
        H1 = float(U_new.detach()) + 0.5 * float(p @ p)
        u = float(torch.rand((), dtype=torch.float64, generator=gen))
        if math.log(u) < H0 - H1:
            q, U, grad = q_new, U_new.detach(), g_new.clone()
            accepted += 1
        out[i] = q.detach()
    return time.perf_counter() - started, calls, accepted / draws, out


def loop_grad(seed: int, draws: int = DRAWS) -> tuple[float, int, float, torch.Tensor]:
    """The floor: a bare ``torch.autograd.grad`` leapfrog loop; same returns."""
    gen = torch.Generator().manual_seed(seed)
    calls = 0
    out = torch.empty(draws, 2, dtype=torch.float64)
    started = time.perf_counter()

    def value_and_grad(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = q.detach().requires_grad_()
        U = energy(q)
        (g,) = torch.autograd.grad(U, q)
        return U.detach(), g

    q = INIT.clone()
    U, grad = value_and_grad(q)
    calls += 1
    accepted = 0
    eps = STEP_SIZE
    for i in range(draws):
        p = torch.randn(2, dtype=torch.float64, generator=gen)
        H0 = float(U) + 0.5 * float(p @ p)
        q_new, g_new = q, grad
        for _ in range(NUM_STEPS):
            p = p - 0.5 * eps * g_new
            q_new = q_new + eps * p
            U_new, g_new = value_and_grad(q_new)
            calls += 1
            p = p - 0.5 * eps * g_new
        H1 = float(U_new) + 0.5 * float(p @ p)
        u = float(torch.rand((), dtype=torch.float64, generator=gen))
        if math.log(u) < H0 - H1:
            q, U, grad = q_new, U_new, g_new
            accepted += 1
        out[i] = q
    return time.perf_counter() - started, calls, accepted / draws, out


def run_hmc(seed: int, draws: int = DRAWS) -> tuple[float, int, float, torch.Tensor, float]:
    """``hmc.sample``; returns (seconds, gradients, acceptance, draws, attrs sampling_time)."""
    started = time.perf_counter()
    dt = hmc.sample(
        log_prob,
        INIT,
        kernel=hmc.HMC(num_steps=NUM_STEPS),
        step_size=STEP_SIZE,
        warmup=0,
        draws=draws,
        chains=1,
        seed=seed,
        progress=False,
    )
    seconds = time.perf_counter() - started
    grads = int(dt.attrs["n_gradient_evaluations"])
    accept = float(dt["sample_stats"]["acceptance_rate"].mean())
    x = torch.as_tensor(dt["posterior"]["x"].values[0])
    return seconds, grads, accept, x, float(dt.attrs["sampling_time"])


def breakdown(reps: int = 5, calls: int = 3000) -> list[tuple[str, float]]:
    """Median CPU µs per call of the layers between the floor and ``hmc.sample`` (one chain,
    in the NumPy engine it runs on the CPU), interleaved: where the time per leapfrog step
    goes."""
    import numpy as np

    from hmc._torch_compat import distribution_validation_off
    from hmc.arrays import as_arrays
    from hmc.kernels.hmc import HMCDraws

    potential = hmc.Potential(log_prob)
    q = INIT.numpy()[None].copy()
    U, g = potential.value_and_grad(q)
    p = np.array([[0.3, -0.2]])
    metric = as_arrays(hmc.metric_from_inverse(torch.ones(1, 2, dtype=torch.float64)))
    params = hmc.Params(np.full(1, STEP_SIZE), metric)
    state = hmc.State(q, U, g)
    draws = HMCDraws(noise=p, accept=np.array([0.5]), steps=None)
    kernel = hmc.HMC(num_steps=NUM_STEPS)
    q1, p1, g1 = INIT.clone(), torch.from_numpy(p[0]), torch.from_numpy(g[0])
    minus_one = torch.tensor(-1.0, dtype=torch.float64)

    def floor_grad():
        x = q1.detach().requires_grad_()
        (gr,) = torch.autograd.grad(energy(x), x)
        return gr

    def floor_step():
        pp = p1 - 0.5 * STEP_SIZE * g1
        x = (q1 + STEP_SIZE * pp).detach().requires_grad_()
        (gr,) = torch.autograd.grad(energy(x), x)
        return pp - 0.5 * STEP_SIZE * gr

    def numpy_step():
        """A leapfrog step with NumPy kicks and drift around the least a package taking
        ``log_prob`` must run per step (one ``autograd.grad`` of it, with a cotangent of
        -1): no finiteness check, no batch axis, no count."""
        pp = p[0] - 0.5 * STEP_SIZE * g[0]
        x = torch.from_numpy(q[0] + STEP_SIZE * pp).requires_grad_()
        (gr,) = torch.autograd.grad(log_prob(x), x, minus_one)
        return pp - 0.5 * STEP_SIZE * gr.numpy()

    def potential_call():
        return potential.value_and_grad(q)

    def leapfrog_call():
        return hmc.leapfrog(state, p, STEP_SIZE, metric, potential)

    def transition_call():
        # the transition a run makes, from random numbers drawn ahead (as the run draws
        # them, a block of transitions at a time)
        return kernel._transition(state, params, potential, draws)

    layers = {
        "floor: detach + requires_grad + energy + autograd.grad": (floor_grad, 1),
        "floor leapfrog step (loop-grad's inner loop body)": (floor_step, 1),
        "NumPy leapfrog step around autograd.grad of log_prob, no checks": (numpy_step, 1),
        "hmc.Potential.value_and_grad, NumPy row (1 row)": (potential_call, 1),
        "hmc.leapfrog, NumPy arrays (1 chain)": (leapfrog_call, 1),
        "static HMC transition, NumPy engine / 10 (1 chain)": (transition_call, NUM_STEPS),
    }
    times: dict[str, list[float]] = {name: [] for name in layers}
    with distribution_validation_off():  # as in a run
        for _ in range(reps):
            for name, (fn, per) in layers.items():
                n = max(1, calls // per)
                t0 = time.process_time()
                for _ in range(n):
                    fn()
                times[name].append((time.process_time() - t0) / (n * per) * 1e6)
    return [(name, statistics.median(v)) for name, v in times.items()]


def profile_hmc(draws: int = 2000, top: int = 25) -> str:
    """cProfile of one ``hmc.sample`` call: the top functions by own time."""
    profiler = cProfile.Profile(time.process_time)  # CPU time: steadier on a shared machine
    profiler.enable()
    run_hmc(0, draws)
    profiler.disable()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return stream.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--draws", type=int, default=DRAWS)
    parser.add_argument("--out", default=None, help="write the markdown table here")
    parser.add_argument("--profile", action="store_true", help="also cProfile one hmc run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    info = machine_info()

    # warm-up run of each (imports, first-call costs), not timed
    loop_backward(0, 200)
    loop_grad(0, 200)
    run_hmc(0, 200)

    methods = {
        "loop-backward": lambda s: loop_backward(s, args.draws),
        "loop-grad": lambda s: loop_grad(s, args.draws),
        "hmc": lambda s: run_hmc(s, args.draws),
    }
    names = list(methods)
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    grads: dict[str, int] = {}
    accept: dict[str, list[float]] = {n: [] for n in names}
    hmc_sampling: list[float] = []
    means: dict[str, torch.Tensor] = {}
    for rep in range(args.reps):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            cpu0 = time.process_time()
            result = methods[name](1000 + rep)
            cpu[name].append(time.process_time() - cpu0)
            seconds, n_grad, acc, x = result[:4]
            times[name].append(seconds)
            grads[name] = n_grad
            accept[name].append(acc)
            means[name] = x
            if name == "hmc":
                hmc_sampling.append(result[4])
            print(
                f"rep {rep} {name:14s} {seconds:7.3f} s (CPU {cpu[name][-1]:7.3f} s)  grads "
                f"{n_grad}  accept {acc:.3f}",
                flush=True,
            )

    steps = args.draws * NUM_STEPS
    floor = statistics.median(times["loop-grad"]) / steps
    floor_cpu = statistics.median(cpu["loop-grad"]) / steps
    lines = [
        "### Hand-written loop vs hmc.sample (2-D Gaussian, static HMC, L=10, eps=0.25)",
        "",
        f"Machine: {info['cpu']}, nproc={info['nproc']}, torch {info['torch']}, "
        f"Python {info['python']}, torch.set_num_threads(1). {args.draws} transitions x "
        f"{NUM_STEPS} leapfrog steps = {steps} steps per run, one chain, float64; "
        f"{args.reps} interleaved repetitions, medians (min-max in brackets). CPU = process "
        "CPU time (one thread), the steadier number on a shared machine.",
        "",
        "| method | wall time (s) | µs per leapfrog step (wall) | ratio to loop-grad (wall) | "
        "µs per leapfrog step (CPU) | ratio to loop-grad (CPU) | gradients per "
        "leapfrog step | acceptance |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        med = statistics.median(times[name])
        per = med / steps
        per_cpu = statistics.median(cpu[name]) / steps
        lines.append(
            f"| {name} | {med:.3f} [{min(times[name]):.3f}-{max(times[name]):.3f}] | "
            f"{per * 1e6:.1f} | {per / floor:.2f} | {per_cpu * 1e6:.1f} | "
            f"{per_cpu / floor_cpu:.2f} | {grads[name] / steps:.5f} "
            f"({grads[name]} calls) | {statistics.median(accept[name]):.3f} |"
        )
    med_sampling = statistics.median(hmc_sampling)
    lines.append(
        f"| hmc, attrs sampling_time only | {med_sampling:.3f} | {med_sampling / steps * 1e6:.1f} "
        f"| {med_sampling / steps / floor:.2f} | | | | |"
    )
    ratio = statistics.median(times["hmc"]) / steps / floor
    ratio_cpu = statistics.median(cpu["hmc"]) / steps / floor_cpu
    # each round's hmc run against the same round's loop-grad run: the machine's speed
    # drifts between rounds, much less within one
    paired = [h / f for h, f in zip(cpu["hmc"], cpu["loop-grad"], strict=True)]
    ratio_paired = statistics.median(paired)

    def verdict(r: float) -> str:
        return "met" if r <= TARGET_RATIO else f"MISSED by {r / TARGET_RATIO:.2f}x"

    lines += [
        "",
        f"Target: hmc at most {TARGET_RATIO}x loop-grad's time per leapfrog step: ratio of "
        f"the medians {ratio:.2f}x wall ({verdict(ratio)}), {ratio_cpu:.2f}x CPU "
        f"({verdict(ratio_cpu)}); median of the rounds' CPU ratios {ratio_paired:.2f}x "
        f"({verdict(ratio_paired)}; rounds {', '.join(f'{r:.2f}' for r in paired)}). "
        f"One gradient per leapfrog step: {grads['hmc']} = {steps} + 1 (the initial point).",
        "",
        "Sample means (last repetition, truth 0): "
        + ", ".join(f"{n} {[round(v, 3) for v in means[n].mean(0).tolist()]}" for n in names),
    ]
    parts = breakdown()
    base = parts[0][1]
    lines += [
        "",
        "Where the time goes (median CPU µs per call, interleaved, 1 chain):",
        "",
        "| layer | µs per call (per leapfrog step) | x floor grad |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {us:.1f} | {us / base:.2f} |" for name, us in parts]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.profile:
        report = profile_hmc()
        print(report)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
