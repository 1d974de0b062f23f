"""NUTS transitions compiled whole: every chain's tree in one compiled ``while_loop``.

With an energy that compiles loops (:meth:`hmc.Potential.loop`), one call of
:meth:`hmc.NUTS.step` runs one whole transition of every chain that has one left: the
batched trees of :mod:`hmc.kernels.nuts`, tick after tick, inside one graph with the
user's density and its reverse pass, until no chain is in flight. Every chain takes the
leapfrog step of every tick (the rows of chains whose tree has ended are discarded by a
row select), so a call lasts as many ticks as the largest tree among the chains: the
chains wait for each other at the end of each transition, as the driver's counters do
on the host once per call instead of once per tick. The draws are those of the eager
layouts: the same rules, the same random numbers from ``(seed, chain, transition)``.

Between calls every chain stands at a draw, so the kernel state is just the chains'
states and transition numbers (:class:`CompiledNUTSState`). An eager kernel state
(either layout) becomes one where no chain is in flight; until then the eager ticks
start no new transition (they drain), which changes no draw. The first call compiles and
checks the graph against the eager ticks on one tick (:class:`hmc.compiled.CompiledLoop`);
a failure falls back to the eager layouts with one warning.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import torch
import torch.utils._pytree as pytree
from torch._higher_order_ops.while_loop import while_loop

from hmc.arrays import as_arrays
from hmc.integrators import Energy
from hmc.kernels import nuts as batched
from hmc.kernels import nuts_host
from hmc.kernels.base import Params, Phase, Step
from hmc.potential import Potential
from hmc.random import Stream, stream_keys
from hmc.state import State, where_rows

__all__ = ["CompiledNUTSState", "boundary", "transitions"]


class CompiledNUTSState(NamedTuple):
    """Every chain at a draw, between compiled calls: its ``state`` (arrays of the run's
    engine, ``(C, D)``, ``(C,)``, ``(C, D)``), the number ``transition`` ``(C,)`` int64
    tensor of its next transition, and ``readout``, empty (a call ends every chain's
    transition: nothing is left to read for the next)."""

    state: State
    transition: torch.Tensor
    readout: torch.Tensor


def boundary(kernel_state) -> CompiledNUTSState | None:
    """``kernel_state`` (any layout) as a :class:`CompiledNUTSState`, or None while a
    chain's transition is in flight."""
    if isinstance(kernel_state, CompiledNUTSState):
        return kernel_state
    if isinstance(kernel_state, nuts_host.HostNUTSState):
        chains = kernel_state.chains
        if any(chain.in_flight for chain in chains):
            return None
        state = State(
            np.stack([chain.sample[0] for chain in chains]),
            np.array([chain.sample[1] for chain in chains], dtype=chains[0].sample[0].dtype),
            np.stack([chain.sample[2] for chain in chains]),
        )
        transition = torch.tensor([chain.transition for chain in chains])
        return CompiledNUTSState(state, transition, transition[:0])
    _, _, _, all_start, _, _, busy = kernel_state.read  # the next tick's, as the driver read
    if busy and not all_start:  # (starting chains are never in flight)
        return None
    transition = kernel_state.transition
    return CompiledNUTSState(kernel_state.trajectory.sample.state(), transition, transition[:0])


def transitions(
    nuts,
    kernel_state: CompiledNUTSState,
    params: Params,
    potential: Potential,
    keys: torch.Tensor,
    phase: Phase,
) -> tuple[CompiledNUTSState, Step] | None:
    """One transition of every chain with ``phase.left > 0``, through the energy's
    compiled loop; None where the energy runs this call eagerly (the caller's ticks then
    run)."""
    state = kernel_state.state
    on_numpy = isinstance(state.position, np.ndarray)
    chains = state.potential.shape[0]
    left = torch.as_tensor(phase.left)
    tensors = tuple(  # contiguous: torch's guards check strides
        torch.as_tensor(x).contiguous()
        for x in (
            *state,
            kernel_state.transition,
            left,
            phase.sampling,
            params.step_size,
            keys,
            *params.metric,
        )
    )
    batched._constants(chains, max(nuts._depths()), left.device)  # made outside the graph
    function = functools.partial(_trees, nuts, type(params.metric))
    key = (nuts, type(params.metric))
    result = potential.loop(key, function, _one_tick, (_NO_LIMIT, *tensors), 0)
    if result is None:
        return None
    new_state, info, transition, ticks = result
    ticks = int(ticks)  # read from the device
    potential.evaluations += chains * ticks  # every chain steps at every tick
    done = left > 0
    new_state, info = State(*new_state), batched.NUTSInfo(*info)
    work = done * info.n_steps / max(ticks, 1)
    finished = None  # the torch engine's driver reads its counters from the device
    if on_numpy:
        new_state, info, done, work = map(as_arrays, (new_state, info, done, work))
        finished = np.flatnonzero(done)
    compiled_state = CompiledNUTSState(new_state, transition, transition[:0])
    return compiled_state, Step(done, new_state, info, work, finished)


#: no bound on a call's ticks (the transitions end them); the first call's check runs one
_NO_LIMIT = torch.tensor(1 << 62)


def _one_tick(tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The arguments of :func:`_trees` bounded to one tick: what the compiled graph is
    first checked on."""
    return (torch.ones_like(tensors[0]), *tensors[1:])


def _trees(
    nuts,
    metric_type: type,
    energy,
    max_ticks: torch.Tensor,
    position: torch.Tensor,
    potential_energy: torch.Tensor,
    grad: torch.Tensor,
    transition: torch.Tensor,
    left: torch.Tensor,
    sampling: torch.Tensor,
    step_size: torch.Tensor,
    keys: torch.Tensor,
    *metric_fields: torch.Tensor,
) -> tuple[tuple, tuple, torch.Tensor, torch.Tensor]:
    """The ticks of every chain's next transition (chains with ``left > 0``), at most
    ``max_ticks`` of them, in torch operations: the function the energy compiles. The
    state ``(C, D)``, ``(C,)``, ``(C, D)``, the transition numbers, transitions left and
    sampling flags ``(C,)``, step sizes ``(C,)``, chain keys ``(C,)`` and the metric's
    fields. Returns the new state and statistics as plain tuples, the transition numbers
    and the number of ticks run (0-d)."""
    params = Params(step_size, metric_type(*metric_fields))
    chains = position.shape[0]
    start = nuts.init(State(position, potential_energy, grad))
    fixed = {
        "read": (1, 1, 1, 0, 0, 1, chains),  # any start, doubling, busy; not all; all step
        "keys": keys,
        "tree_keys": stream_keys(keys, Stream.TREE),
        "readout": transition[:0],
    }
    carried = dict.fromkeys(fixed, ())  # fixed fields: no leaves in the loop
    start = start._replace(transition=transition, starting=left > 0, **carried)
    leaves, spec = pytree.tree_flatten(start)
    leaves = [x.clone() for x in leaves]  # while_loop refuses aliased inputs
    potential = Energy(energy)

    def unpack(leaves):
        return pytree.tree_unflatten(list(leaves), spec)._replace(**fixed)

    def busy(tick, remaining, *leaves):
        kernel_state = unpack(leaves)
        return (tick < max_ticks) & (kernel_state.in_flight | kernel_state.starting).any()

    def advance(tick, remaining, *leaves):
        kernel_state = unpack(leaves)
        stepping = kernel_state.in_flight | kernel_state.starting
        new, done = nuts._tick(kernel_state, params, potential, keys, Phase(sampling, remaining))
        kept = where_rows(stepping, new.trajectory, kernel_state.trajectory)
        new = new._replace(trajectory=kept, **carried)
        return (tick + 1, remaining - done.to(remaining.dtype), *pytree.tree_leaves(new))

    first = (torch.zeros((), dtype=torch.int64, device=position.device), left.clamp(max=1))
    carried_values = (*first, *leaves)
    if torch.compiler.is_compiling():
        carried_values = while_loop(busy, advance, carried_values)
    else:  # eager (the check of a compiled loop): a plain loop, no tracing of any kind
        while bool(busy(*carried_values)):
            carried_values = advance(*carried_values)
    ticks, _, *leaves = carried_values
    end = unpack(leaves)
    state, info = nuts._report(end)
    return tuple(state), tuple(info), end.transition, ticks
