"""Benchmark: should the NUTS tick itself go into the compiled graph?

With a compiled energy (``compile=True``), the gradient is no longer most of a NUTS tick
(one leapfrog step of every busy chain): the tree's bookkeeping is. This script times one
tick four ways, on the same model, chains, step size, metric and starting points,
interleaved in one process (CPU microseconds per tick, median of the rounds):

- ``host``: what ``hmc.sample(compile=True)`` runs on the CPU: the NumPy engine, each
  chain's tree in Python floats and NumPy rows (:mod:`hmc.kernels.nuts_host`), around the
  compiled energy;
- ``batched``: the torch engine's trees in batched tensors (:mod:`hmc.kernels.nuts`), a
  few hundred small tensor operations per tick, around the same compiled energy;
- ``whole``: that batched tick and the energy compiled together as one
  ``torch.compile`` graph. To be one graph it has no host branches: every chain takes the
  step (an idle chain's result is discarded by a row select), a transition starts or a
  doubling begins wherever a chain needs one, with the tick's flags fixed to their
  general values. The tick's output records go back in as the next tick's inputs; the
  outputs that alias one another are copied so that torch's guards see the same inputs
  at every call;
- ``loop``: the same tick and energy as ``whole``, ``--ticks`` ticks per call inside one
  compiled ``torch._higher_order_ops.while_loop`` (inductor's C++ wrapper runs the loop,
  so no tick returns to Python). It carries the kernel state's tensors, flattened, and
  returns them for the next call.

The script prints the number of graphs compiled so far: three per number of chains (the
energy, the whole tick, the loop), so none recompiled. It checks the loop against the
``batched`` ticks, run eagerly from the same start for as many ticks as the loop ran: the
same number of transitions and the same leapfrog steps and depth in flight for every
chain, and the current draws within 1e-9. Those eager ticks also give the mean tree depth
of the transitions that ended in the timed ticks (every variant runs the same
transitions).

``--start mode`` (the default) starts the chains at draws of the Laplace approximation
(the mode found by L-BFGS, the inverse Hessian there), with its marginal variances as the
diagonal inverse metric and, as step size, its narrowest standard deviation in the
metric's coordinates (the square root of the smallest eigenvalue of its correlation
matrix), so that trees reach the depths of a sampling run. ``--start origin`` starts at
``0.1 * randn`` with a unit metric and step size 0.05, where on kidscore_interaction
every transition diverges at its first leaf.

The ``whole`` and ``loop`` variants are not in the package: they are the measurement
behind keeping the tree outside the graph (``docs/how-it-works.md``, the compiled
energy). Also reported: the compile times of the energy, of the ``whole`` graph and of
the loop (run with an empty ``TORCHINDUCTOR_CACHE_DIR`` for cold-cache figures).

Run from the repository root::

    python -m benchmarks.compiled_tick --chains 4,64,256 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
import types

import torch
import torch.utils._pytree as pytree
from torch._higher_order_ops.while_loop import while_loop

import hmc.models
from hmc.compiled import energy_function
from hmc.kernels.base import Params, Phase
from hmc.kernels.nuts import NUTS, _constants
from hmc.metric import metric_from_inverse
from hmc.potential import Potential
from hmc.random import Stream, chain_keys, stream_keys
from hmc.sampler import as_target
from hmc.state import State, where_rows

try:
    from benchmarks.machine import machine
except ModuleNotFoundError:  # run as a plain file: its folder is on sys.path
    from machine import machine


def _distinct(record):
    """The record with every tensor that appears twice copied (torch guards on aliasing)."""
    leaves, spec = pytree.tree_flatten(record)
    seen: set[int] = set()
    for i, x in enumerate(leaves):
        if isinstance(x, torch.Tensor):
            if id(x) in seen:
                leaves[i] = x = x.clone()
            seen.add(id(x))
    return pytree.tree_unflatten(leaves, spec)


def _laplace(target) -> tuple[torch.Tensor, torch.Tensor]:
    """The mode ``(D,)`` of the target's log density (L-BFGS) and the inverse of the
    negative Hessian there ``(D, D)``: the Laplace approximation's mean and covariance."""
    x = torch.zeros(target.dim, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [x], max_iter=500, tolerance_grad=1e-10, line_search_fn="strong_wolfe"
    )

    def closure():
        optimizer.zero_grad()
        loss = -target.log_prob(x)
        loss.backward()
        return loss

    for _ in range(5):
        optimizer.step(closure)
    mode = x.detach()
    hessian = torch.autograd.functional.hessian(lambda q: -target.log_prob(q), mode)
    return mode, torch.linalg.inv(hessian)


def _start(target, chains: int, start: str, generator: torch.Generator):
    """Positions ``(C, D)``, diagonal inverse metric ``(C, D)`` and step size of ``start``
    (see the module docstring)."""
    dim = target.dim
    noise = torch.randn(chains, dim, dtype=torch.float64, generator=generator)
    if start == "origin":
        return 0.1 * noise, torch.ones(chains, dim, dtype=torch.float64), 0.05
    mode, covariance = _laplace(target)
    variance = covariance.diagonal()
    correlation = covariance / (variance.sqrt()[:, None] * variance.sqrt())
    step_size = torch.linalg.eigvalsh(correlation)[0].sqrt().item()
    q = mode + noise @ torch.linalg.cholesky(covariance).mT
    return q, variance.expand(chains, dim).clone(), step_size


def _setup(name: str, chains: int, start: str, step_size: float | None):
    target = as_target(hmc.models.load(name), None, None)
    generator = torch.Generator().manual_seed(1)
    q, inverse, start_step = _start(target, chains, start, generator)
    potential = Potential(target.log_prob, batched=target.batched, compile=True)
    U, grad = potential.value_and_grad(q)  # compiles the energy alone
    params = Params(
        torch.full((chains,), step_size or start_step, dtype=torch.float64),
        metric_from_inverse(inverse),
    )
    phase = Phase(
        torch.ones(chains, dtype=torch.bool), torch.full((chains,), 1 << 40, dtype=torch.int64)
    )
    keys = chain_keys(1, torch.arange(chains))
    return target, potential, State(q, U, grad), params, phase, keys


def _repeat(tick):
    """``ticks(n)``: ``n`` calls of ``tick``; returns the last one's result."""

    def ticks(n: int):
        for _ in range(n):
            result = tick()
        return result

    return ticks


def _host_ticks(nuts, state, params, potential, keys, phase):
    arrays = State(state.position.numpy(), state.potential.numpy(), state.grad.numpy())
    kernel_state = nuts.init(arrays)

    def tick():
        nonlocal kernel_state
        kernel_state, _ = nuts.step(kernel_state, params, potential, keys, phase)

    return _repeat(tick)


def _batched_ticks(nuts, state, params, potential, keys, phase):
    """``ticks(n)``: ``n`` ticks of the torch engine, as its driver runs them; returns the
    kernel state and the last tick's :class:`~hmc.kernels.base.Step`."""
    kernel_state = nuts.init(state)

    def tick():
        nonlocal kernel_state
        kernel_state, step = nuts.step(kernel_state, params, potential, keys, phase)
        kernel_state = nuts.with_readout(kernel_state, kernel_state.readout.tolist())
        return kernel_state, step

    return _repeat(tick)


def _general_tick(nuts, params, target, keys, phase):
    """The tick with no host branches (see the module docstring) and the kernel state's
    read flags and keys it runs with: ``tick(kernel_state) -> (kernel_state, done)``."""
    chains = keys.shape[0]
    general = (1, 1, 1, 0, 0, 1, chains)  # any start, doubling, busy; not all; all step
    # the energy as the leapfrog calls it, traced into the same graph as the tick
    energy = types.SimpleNamespace(value_and_grad=energy_function(target.log_prob, target.batched))
    tree_keys = stream_keys(keys, Stream.TREE)

    def tick(kernel_state):
        stepping = kernel_state.in_flight | kernel_state.starting
        new, done = nuts._tick(kernel_state, params, energy, keys, phase)
        kept = where_rows(stepping, new.trajectory, kernel_state.trajectory)
        return new._replace(trajectory=kept), done

    _constants(chains, max(nuts._depths()), keys.device)  # made before tracing: no recompile
    return tick, {"read": general, "keys": keys, "tree_keys": tree_keys}


def _whole_ticks(nuts, state, params, target, keys, phase):
    tick, fixed = _general_tick(nuts, params, target, keys, phase)
    compiled = torch.compile(tick, dynamic=False, fullgraph=True)
    kernel_state = _distinct(nuts.init(state)._replace(**fixed))
    started = time.perf_counter()
    compiled(kernel_state)
    seconds = time.perf_counter() - started

    def whole():
        nonlocal kernel_state
        kernel_state, _ = compiled(kernel_state)
        kernel_state.readout.tolist()  # what the driver reads each tick
        kernel_state = _distinct(kernel_state._replace(**fixed))

    return _repeat(whole), seconds


def _loop_ticks(nuts, state, params, target, keys, phase):
    """``ticks(n)``: ``n`` general ticks in one call of the compiled while_loop; returns
    the kernel state. Also the compile seconds."""
    tick, fixed = _general_tick(nuts, params, target, keys, phase)
    # the loop carries the tensors that change from tick to tick; the rest is fixed
    carried = dict.fromkeys(fixed, ())  # no leaves
    leaves, spec = pytree.tree_flatten(nuts.init(state)._replace(**carried))

    def body(i, *leaves):
        kernel_state = pytree.tree_unflatten(leaves, spec)._replace(**fixed)
        new, _ = tick(kernel_state)
        return (i + 1, *pytree.tree_leaves(new._replace(**carried)))

    def run(n, *leaves):
        return while_loop(lambda i, *_: i < n, body, (torch.zeros_like(n), *leaves))[1:]

    compiled = torch.compile(run, dynamic=False, fullgraph=True, options={"cpp_wrapper": True})
    leaves = [x.clone() for x in pytree.tree_leaves(_distinct(leaves))]
    started = time.perf_counter()
    compiled(torch.tensor(0), *leaves)
    seconds = time.perf_counter() - started

    def loop(n: int):
        nonlocal leaves
        leaves = compiled(torch.tensor(n), *leaves)
        return pytree.tree_unflatten(leaves, spec)

    return loop, seconds


def _check(nuts, state, params, potential, keys, phase, warmup, total, loop_state):
    """The eager ``batched`` ticks from ``state`` for ``total`` ticks against the loop's
    kernel state after as many: a line saying whether they agree, and the mean tree
    depth of the transitions that ended after the first ``warmup`` ticks."""
    ticks = _batched_ticks(nuts, state, params, potential, keys, phase)
    ticks(warmup)
    depths, ended = 0, 0
    for _ in range(total - warmup):
        kernel_state, step = ticks(1)
        depths += int(step.info.tree_depth[step.done].sum())
        ended += int(step.done.sum())
    eager, loop = kernel_state.trajectory, loop_state.trajectory
    same = (
        torch.equal(kernel_state.transition, loop_state.transition)
        and torch.equal(eager.n_steps, loop.n_steps)
        and torch.equal(eager.depth, loop.depth)
    )
    difference = (eager.sample.vectors - loop.sample.vectors).abs().max().item()
    verdict = "agree" if same and difference <= 1e-9 else "DISAGREE"
    line = (
        f"{keys.shape[0]} chains, loop against eager over {total} ticks: {verdict} "
        f"(transitions {'equal' if same else 'differ'}, max |draw difference| {difference:.1e})"
    )
    return line, depths / max(ended, 1)


def _time(ticks, n: int) -> float:
    started = time.process_time()
    ticks(n)
    return 1e6 * (time.process_time() - started) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="kidiq-kidscore_interaction")
    parser.add_argument("--chains", default="4,64,256")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ticks", type=int, default=500)
    parser.add_argument("--start", choices=("mode", "origin"), default="mode")
    parser.add_argument("--step-size", type=float, default=None, help="overrides --start's")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    info = machine()
    lines, checks = [], []
    nuts = NUTS()
    for chains in (int(c) for c in args.chains.split(",")):
        target, potential, state, params, phase, keys = _setup(
            args.model, chains, args.start, args.step_size
        )
        ticks = {
            "host": _host_ticks(nuts, state, params, potential, keys, phase),
            "batched": _batched_ticks(nuts, state, params, potential, keys, phase),
        }
        ticks["whole"], whole_seconds = _whole_ticks(nuts, state, params, target, keys, phase)
        ticks["loop"], loop_seconds = _loop_ticks(nuts, state, params, target, keys, phase)
        warmup = args.ticks // 5
        for run in ticks.values():  # past the first transitions' start-up
            run(warmup)
        times: dict[str, list[float]] = {name: [] for name in ticks}
        for _ in range(args.rounds):
            for name, run in ticks.items():
                times[name].append(_time(run, args.ticks))
        median = {name: statistics.median(values) for name, values in times.items()}
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        total = warmup + args.rounds * args.ticks
        check, depth = _check(
            nuts, state, params, potential, keys, phase, warmup, total, ticks["loop"](0)
        )
        checks.append(check)
        lines.append(
            f"| {chains} | {depth:.1f} | {median['host']:.0f} | {median['batched']:.0f} | "
            f"{median['whole']:.0f} | {median['loop']:.0f} | "
            f"{median['whole'] / median['host']:.2f} | {median['loop'] / median['host']:.2f} | "
            f"{potential.compile_seconds:.1f}, {whole_seconds:.1f}, {loop_seconds:.1f} |"
        )
        print(lines[-1], f"(graphs compiled so far: {graphs})", flush=True)
        print(check, flush=True)
    metric = "unit" if args.start == "origin" else "Laplace diagonal"
    text = "\n".join(
        [
            f"Model {args.model}, start {args.start}, step size "
            f"{params.step_size[0].item():.4g}, {metric} metric, "
            f"{args.rounds} rounds of {args.ticks} ticks; {info['cpu']}, {info['nproc']} "
            f"cores, one thread, Python {info['python']}, torch {torch.__version__}.",
            "",
            "| chains | mean depth | host (µs/tick) | batched | whole | loop | whole / host "
            "| loop / host | compile s: energy, whole, loop |",
            "|---|---|---|---|---|---|---|---|---|",
            *lines,
            "",
            *checks,
        ]
    )
    print(text)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    main()
