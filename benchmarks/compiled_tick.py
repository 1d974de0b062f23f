"""Benchmark: should the NUTS tick itself go into the compiled graph?

With a compiled energy (``compile=True``), the gradient is no longer most of a NUTS tick
(one leapfrog step of every busy chain): the tree's bookkeeping is. This script times one
tick three ways, on the same model, chains, step size and starting points, interleaved in
one process (CPU microseconds per tick, median of the rounds):

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
  at every call. The script prints the number of graphs compiled so far: two per number
  of chains (the energy, the whole tick), so none recompiled.

The ``whole`` variant is not in the package: it is the measurement behind keeping the
tree outside the graph (``docs/how-it-works.md``, the compiled energy). Also reported:
the compile time of the ``whole`` graph, and that of the energy alone (run with an empty
``TORCHINDUCTOR_CACHE_DIR`` for cold-cache figures).

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


def _setup(name: str, chains: int, step_size: float):
    target = as_target(hmc.models.load(name), None, None)
    generator = torch.Generator().manual_seed(1)
    q = 0.1 * torch.randn(chains, target.dim, dtype=torch.float64, generator=generator)
    potential = Potential(target.log_prob, batched=target.batched, compile=True)
    U, grad = potential.value_and_grad(q)  # compiles the energy alone
    params = Params(
        torch.full((chains,), step_size, dtype=torch.float64),
        metric_from_inverse(torch.ones(chains, target.dim, dtype=torch.float64)),
    )
    phase = Phase(
        torch.ones(chains, dtype=torch.bool), torch.full((chains,), 1 << 40, dtype=torch.int64)
    )
    keys = chain_keys(1, torch.arange(chains))
    return target, potential, State(q, U, grad), params, phase, keys


def _host_ticks(nuts, state, params, potential, keys, phase):
    arrays = State(state.position.numpy(), state.potential.numpy(), state.grad.numpy())
    kernel_state = nuts.init(arrays)

    def tick():
        nonlocal kernel_state
        kernel_state, _ = nuts.step(kernel_state, params, potential, keys, phase)

    return tick


def _batched_ticks(nuts, state, params, potential, keys, phase):
    kernel_state = nuts.init(state)

    def tick():
        nonlocal kernel_state
        kernel_state, _ = nuts.step(kernel_state, params, potential, keys, phase)
        kernel_state = nuts.with_readout(kernel_state, kernel_state.readout.tolist())

    return tick


def _whole_ticks(nuts, state, params, target, keys, phase):
    chains = state.position.shape[0]
    general = (1, 1, 1, 0, 0, 1, chains)  # any start, doubling, busy; not all; all step
    # the energy as the leapfrog calls it, traced into the same graph as the tick
    energy = types.SimpleNamespace(value_and_grad=energy_function(target.log_prob, target.batched))
    tree_keys = stream_keys(keys, Stream.TREE)

    def whole(kernel_state, params, keys, phase):
        stepping = kernel_state.in_flight | kernel_state.starting
        new, done = nuts._tick(kernel_state, params, energy, keys, phase)
        kept = where_rows(stepping, new.trajectory, kernel_state.trajectory)
        return new._replace(trajectory=kept), done

    compiled = torch.compile(whole, dynamic=False, fullgraph=True)
    _constants(chains, max(nuts._depths()), keys.device)  # made before tracing: no recompile
    kernel_state = _distinct(
        nuts.init(state)._replace(read=general, keys=keys, tree_keys=tree_keys)
    )
    started = time.perf_counter()
    compiled(kernel_state, params, keys, phase)
    seconds = time.perf_counter() - started

    def tick():
        nonlocal kernel_state
        kernel_state, _ = compiled(kernel_state, params, keys, phase)
        kernel_state.readout.tolist()  # what the driver reads each tick
        kernel_state = _distinct(kernel_state._replace(read=general, keys=keys))

    return tick, seconds


def _time(tick, ticks: int) -> float:
    started = time.process_time()
    for _ in range(ticks):
        tick()
    return 1e6 * (time.process_time() - started) / ticks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="kidiq-kidscore_interaction")
    parser.add_argument("--chains", default="4,64,256")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ticks", type=int, default=500)
    parser.add_argument("--step-size", type=float, default=0.05)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    info = machine()
    lines = [
        f"Model {args.model}, step size {args.step_size}, unit metric, {args.rounds} rounds "
        f"of {args.ticks} ticks; {info['cpu']}, {info['nproc']} cores, one thread, "
        f"Python {info['python']}, torch {torch.__version__}.",
        "",
        "| chains | host (µs/tick) | batched | whole | whole / host | compile s: energy, whole |",
        "|---|---|---|---|---|---|",
    ]
    nuts = NUTS()
    for chains in (int(c) for c in args.chains.split(",")):
        target, potential, state, params, phase, keys = _setup(args.model, chains, args.step_size)
        ticks = {
            "host": _host_ticks(nuts, state, params, potential, keys, phase),
            "batched": _batched_ticks(nuts, state, params, potential, keys, phase),
        }
        ticks["whole"], whole_seconds = _whole_ticks(nuts, state, params, target, keys, phase)
        for tick in ticks.values():  # past the first transitions' start-up
            _time(tick, args.ticks // 5)
        times: dict[str, list[float]] = {name: [] for name in ticks}
        for _ in range(args.rounds):
            for name, tick in ticks.items():
                times[name].append(_time(tick, args.ticks))
        median = {name: statistics.median(values) for name, values in times.items()}
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        lines.append(
            f"| {chains} | {median['host']:.0f} | {median['batched']:.0f} | "
            f"{median['whole']:.0f} | {median['whole'] / median['host']:.2f} | "
            f"{potential.compile_seconds:.1f}, {whole_seconds:.1f} |"
        )
        print(lines[-1], f"(graphs compiled so far: {graphs})", flush=True)
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    main()
