"""NUTS with each chain's tree kept in plain Python: the NumPy engine's layout (CPU).

The transition, its statistics and its random numbers are those of
:mod:`hmc.kernels.nuts` (Stan's transition; the same momentum, direction and merge
uniforms from ``(seed, chain, transition)``), with the same rules
(:mod:`hmc.kernels.nuts_rules`), checked against the same recursive oracle.
Every tick still advances every busy chain by one leapfrog step with one batched energy
call. What differs is where the tree lives: the batched layout keeps it in tensors and pays
the dispatch cost of a few hundred small tensor operations per tick, whatever the number of
chains; here each chain's tree is a record of Python floats and NumPy rows, and a leaf
costs a chain some tens of microseconds of interpreter time, which is far cheaper for the
chain counts a CPU runs (measured in ``benchmarks/RESULTS.md``). On the CPU a tensor is in
host memory already, so the per-tick reads (``.numpy()``, ``.tolist()``) are not device
round trips.

Per tick: the chains that start a transition draw their momenta in one batched call; the
chains that begin a doubling draw its direction and turn to that end; the busy chains'
edges are stacked into ``(B, D)`` NumPy arrays and take one leapfrog step
(:func:`hmc.integrators.leapfrog` on NumPy arrays, around one call of
:meth:`hmc.Potential.value_and_grad`), with the energies ``H`` and velocities
``M^-1 p`` computed batched in NumPy; then each chain adds its leaf to its
tree: the sub-subtrees the leaf closes are merged one level at a time (Stan's
``build_tree`` unrolled over the trailing one-bits of the leaf's index, with a stack of
completed left halves, one per level) and a completed doubling merges into the
trajectory. Every vector a chain keeps is its own ``(D,)`` copy, or a row of a tick's
``(1, D)`` array when it was the only chain to move, never a view that would keep a whole
``(B, D)`` array alive, so memory is ``O(C x max_tree_depth x D)``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from hmc.arrays import as_arrays
from hmc.integrators import leapfrog
from hmc.kernels.base import Params, Phase
from hmc.kernels.nuts_rules import (
    leaf_error,
    merged_no_u_turn,
    new_subtree_wins,
    right_subtree_wins,
    turns_forward,
)
from hmc.metric import Metric, kinetic_energy_and_velocity
from hmc.potential import Potential
from hmc.random import Stream, normal, stream_keys, uniform_at_scalar
from hmc.state import State, take_rows

__all__ = ["HostNUTSState", "advance", "init", "report"]

TREE_DRAWS_BITS = 32  # each transition owns 2**32 uniforms of its chain's TREE stream
_NOISE_BLOCK = 64  # transitions whose momentum noise a chain draws at once


class _Chain:
    """One chain's transition in flight (mutable; Python scalars and NumPy rows).

    A point is ``(q, U, grad, p, v)`` with ``v = M^-1 p``; a proposal is
    ``(q, U, grad, H)``; a stored left half is ``(log_weight, rho, p_begin, v_begin,
    p_end, v_end, proposal)``.
    """

    __slots__ = (
        "depth",
        "diverging",
        "edge",
        "edge_forward",
        "in_flight",
        "leaf",
        "log_weight",
        "max_depth",
        "max_error",
        "n_steps",
        "near_p",
        "near_v",
        "next_uniform",
        "other",
        "other_v",
        "rho",
        "sample",
        "signed_step",
        "stack",
        "start_energy",
        "starting",
        "sum_accept",
        "transition",
    )  # fmt: skip

    def __init__(self, sample: tuple, levels: int) -> None:
        self.transition = 0  # the position of the chain's random numbers
        self.in_flight = False
        self.starting = True
        self.sample = sample
        self.edge_forward = False
        self.stack: list[tuple | None] = [None] * levels
        self.start_energy = 0.0
        self.n_steps = self.depth = self.leaf = self.next_uniform = self.max_depth = 0
        self.sum_accept = self.max_error = self.log_weight = self.signed_step = 0.0
        self.diverging = False
        self.edge = self.other = None
        self.near_p = self.near_v = self.other_v = self.rho = None


class HostNUTSState:
    """Kernel state of the host layout: one :class:`_Chain` per chain, and the
    per-chain constants the ticks read (updated in place; the driver passes it back)."""

    def __init__(
        self,
        chains: list[_Chain],
        dtype: torch.dtype,
        depths: tuple[int, int],
        max_energy_error: float,
    ) -> None:
        self.chains = chains
        self.dtype = dtype
        self.depths = depths  # (warmup, sampling) depth caps
        self.max_energy_error = max_energy_error
        self.none_done = np.zeros(len(chains), dtype=bool)  # ``done`` when no chain finished
        self.rows = np.arange(len(chains))
        # momentum noise (C, _NOISE_BLOCK, D) of chain c's transitions noise_from[c] up to
        # noise_until[c] (excluded)
        self.noise: np.ndarray | None = None
        self.noise_from = [0] * len(chains)
        self.noise_until = [0] * len(chains)
        self.finished: list[int] = []  # the chains whose transition ended in the last tick
        self.moved: list[int] = []  # the chains that took a leapfrog step in it
        # the last tick's busy chains, their leaves and their leapfrog's constants: the
        # next tick's edges when no chain started, turned or stopped in between
        self.last: _Edges | None = None
        self.keys: torch.Tensor | None = None
        self.tree_keys: list[int] = []
        self.step_source: torch.Tensor | None = None
        self.step_sizes: list[float] = []
        self.metric_source: Metric | None = None
        self.metric: Metric | None = None  # params.metric with NumPy fields
        self.left_source: np.ndarray | None = None
        self.left: list[int] = []  # phase.left as a list


class _Edges(NamedTuple):
    """The busy chains' edges, stacked for one batched leapfrog step: ``busy`` (B chain
    indices), NumPy ``position``, ``grad`` and ``momentum`` ``(B, D)``, signed
    ``step_size`` ``(B, 1)`` and the busy rows of the NumPy ``metric``."""

    busy: list[int]
    position: np.ndarray
    grad: np.ndarray
    momentum: np.ndarray
    step_size: np.ndarray
    metric: Metric


def init(
    state: State, depths: tuple[int, int], max_energy_error: float, first_transition: int = 0
) -> HostNUTSState:
    """Host kernel state for chains at ``state`` (NumPy arrays), with ``(warmup,
    sampling)`` depth caps, each to begin its transition number ``first_transition``."""
    q, g = state.position, state.grad
    potentials = state.potential.tolist()
    chains = [
        _Chain((q[c].copy(), potentials[c], g[c].copy(), 0.0), max(depths))
        for c in range(q.shape[0])
    ]
    for chain in chains:
        chain.transition = first_transition
    return HostNUTSState(chains, torch.from_numpy(q).dtype, depths, max_energy_error)


def advance(
    kernel_state: HostNUTSState,
    params: Params,
    potential: Potential,
    keys: torch.Tensor,
    phase: Phase,
) -> tuple[HostNUTSState, np.ndarray]:
    """One tick (see :meth:`hmc.NUTS.step`); returns the state and ``done`` ``(C,)``,
    a NumPy bool array (the same chains as the list ``kernel_state.finished``)."""
    chains = kernel_state.chains
    if kernel_state.keys is not keys:
        kernel_state.keys, kernel_state.tree_keys = keys, stream_keys(keys, Stream.TREE).tolist()
    if kernel_state.step_source is not params.step_size:
        kernel_state.step_source, kernel_state.step_sizes = (
            params.step_size,
            params.step_size.tolist(),
        )
    if kernel_state.metric_source is not params.metric:
        kernel_state.metric_source, kernel_state.metric = params.metric, as_arrays(params.metric)
        kernel_state.last = None
    if kernel_state.left_source is not phase.left:
        kernel_state.left_source, kernel_state.left = phase.left, phase.left.tolist()
    moved = any(chain.starting for chain in chains)  # some edge is not the last leaf
    if moved:
        _start(kernel_state, keys, phase.sampling)
    busy = [c for c, chain in enumerate(chains) if chain.in_flight]
    kernel_state.moved, kernel_state.finished = busy, []
    if not busy:
        return kernel_state, kernel_state.none_done
    for c in busy:
        if chains[c].leaf == 0:
            moved |= _begin_doubling(
                chains[c], kernel_state.tree_keys[c], kernel_state.step_sizes[c]
            )
    if moved or kernel_state.last is None or kernel_state.last.busy != busy:
        kernel_state.last = _edges(kernel_state, busy)
    q, U, g, p, v, H = _leapfrog_step(kernel_state, potential)
    max_energy_error = kernel_state.max_energy_error
    finished = []
    alone = len(busy) == 1  # the (1, D) arrays are that chain's own: no copies needed
    for i, c in enumerate(busy):
        chain = chains[c]
        if alone:
            leaf = (q[0], U[0], g[0], p[0], v[0])
        else:
            leaf = (q[i].copy(), U[i], g[i].copy(), p[i].copy(), v[i].copy())
        if _add_leaf(chain, leaf, H[i], max_energy_error, kernel_state.tree_keys[c]):
            chain.transition += 1
            chain.in_flight = False
            chain.starting = kernel_state.left[c] > 1
            finished.append(c)
    kernel_state.finished = finished
    if not finished:
        return kernel_state, kernel_state.none_done
    done = np.zeros(len(chains), dtype=bool)
    done[finished] = True
    return kernel_state, done


def report(kernel_state: HostNUTSState) -> tuple[State, dict[str, np.ndarray]]:
    """Every chain's last draw and the statistics of its last transition, ``(C,)`` each
    under their ArviZ names (valid in the rows of the chains reported ``done``), as NumPy
    arrays: a state of ``(C, D)`` and ``(C,)`` arrays and a dict of ``(C,)`` arrays."""
    chains = kernel_state.chains
    samples = [chain.sample for chain in chains]
    floats = np.array(
        [
            [s[1] for s in samples],
            [s[3] for s in samples],
            [s[3] - chain.start_energy for s, chain in zip(samples, chains, strict=True)],
            [chain.max_error for chain in chains],
            [chain.sum_accept / max(chain.n_steps, 1) for chain in chains],
        ],
        dtype=samples[0][0].dtype,
    )
    ints = np.array([[chain.n_steps for chain in chains], [chain.depth for chain in chains]])
    bools = np.array(
        [
            [chain.diverging for chain in chains],
            [chain.depth >= chain.max_depth for chain in chains],
        ]
    )
    position = np.array([s[0] for s in samples])
    grad = np.array([s[2] for s in samples])
    info = {
        "acceptance_rate": floats[4],
        "n_steps": ints[0],
        "diverging": bools[0],
        "energy": floats[1],
        "energy_error": floats[2],
        "max_energy_error": floats[3],
        "tree_depth": ints[1],
        "reached_max_treedepth": bools[1],
    }
    return State(position, floats[0], grad), info


# ---------------------------------------------------------------------- the pieces
def _start(kernel_state: HostNUTSState, keys: torch.Tensor, sampling: torch.Tensor) -> None:
    """Fresh trajectories for the chains that start one. Chain ``c``'s momentum noise for
    its transition ``t`` comes from ``(seed, c, t)``; it is drawn for the transitions left in
    the call, up to ``_NOISE_BLOCK`` at a time, and the metric turns it into momenta for all
    chains at once."""
    chains = kernel_state.chains
    starting = [c for c, chain in enumerate(chains) if chain.starting]
    begin, until = kernel_state.noise_from, kernel_state.noise_until
    stale = [c for c in starting if not begin[c] <= chains[c].transition < until[c]]
    if stale:
        _draw_noise(kernel_state, keys, stale)
    index = [
        chain.transition - begin[c] if begin[c] <= chain.transition < until[c] else 0
        for c, chain in enumerate(chains)
    ]
    noise = kernel_state.noise[kernel_state.rows, index]
    metric = kernel_state.metric
    momentum = metric.momentum(noise)
    kinetic, velocity = kinetic_energy_and_velocity(metric, momentum)
    kinetic = kinetic.tolist()
    warm_depth, sample_depth = kernel_state.depths
    in_sampling = sampling.tolist()
    for c in starting:
        chain = chains[c]
        q, U, g, _ = chain.sample
        energy = U + kinetic[c]
        point = (q, U, g, momentum[c].copy(), velocity[c].copy())
        chain.start_energy = energy
        chain.edge = chain.other = point
        chain.rho = point[3]
        chain.log_weight = 0.0
        chain.sample = (q, U, g, energy)
        chain.depth = chain.leaf = chain.n_steps = 0
        chain.sum_accept = chain.max_error = 0.0
        chain.diverging = False
        chain.next_uniform = chain.transition << TREE_DRAWS_BITS
        chain.max_depth = sample_depth if in_sampling[c] else warm_depth
        chain.in_flight, chain.starting = True, False


def _draw_noise(kernel_state: HostNUTSState, keys: torch.Tensor, rows: list[int]) -> None:
    """Momentum noise of the chains ``rows`` for their next transitions: as many as the
    most any of them has left in this call (one per call in a pooled warmup, or in
    :meth:`hmc.NUTS.transition`), at most ``_NOISE_BLOCK``."""
    first = [kernel_state.chains[c].transition for c in rows]
    count = max(1, min(_NOISE_BLOCK, max(kernel_state.left[c] for c in rows)))
    counters = torch.tensor(first).unsqueeze(-1) + torch.arange(count)
    dim = kernel_state.chains[0].sample[0].shape[0]
    block = normal(keys[rows], Stream.MOMENTUM, counters, dim, kernel_state.dtype).numpy()
    if kernel_state.noise is None:
        kernel_state.noise = np.zeros(
            (len(kernel_state.chains), _NOISE_BLOCK, dim), dtype=block.dtype
        )
    kernel_state.noise[rows, :count] = block
    for c, t in zip(rows, first, strict=True):
        kernel_state.noise_from[c], kernel_state.noise_until[c] = t, t + count


def _begin_doubling(chain: _Chain, tree_key: int, step_size: float) -> bool:
    """Draw the doubling's direction (forward when u > 1/2) and turn to that end;
    returns whether the chain turned."""
    forward = turns_forward(uniform_at_scalar(tree_key, chain.next_uniform))
    turned = forward != chain.edge_forward
    if turned:
        chain.edge, chain.other = chain.other, chain.edge
    chain.edge_forward = forward
    chain.signed_step = step_size if forward else -step_size
    chain.near_p, chain.near_v = chain.edge[3], chain.edge[4]
    chain.other_v = chain.other[4]
    chain.next_uniform += 1
    return turned


def _edges(kernel_state: HostNUTSState, busy: list[int]) -> _Edges:
    """The ``busy`` chains' edges, stacked."""
    edges = [kernel_state.chains[c].edge for c in busy]
    metric = kernel_state.metric
    if len(busy) < len(kernel_state.chains):
        metric = take_rows(metric, np.array(busy))
    return _Edges(  # np.array of a list of rows stacks them, faster than np.stack
        busy,
        np.array([e[0] for e in edges]),
        np.array([e[2] for e in edges]),
        np.array([e[3] for e in edges]),
        np.array([[kernel_state.chains[c].signed_step] for c in busy], dtype=edges[0][0].dtype),
        metric,
    )


def _leapfrog_step(kernel_state: HostNUTSState, potential: Potential):
    """One batched leapfrog step from the edges in ``kernel_state.last``, which then holds the new
    leaves: returns NumPy ``(B, D)`` positions, gradients, momenta and velocities, and
    lists of potentials and energies (a NaN energy counts as ``+inf`` in :func:`_add_leaf`)."""
    edges = kernel_state.last
    metric = edges.metric
    moved, p = leapfrog(
        State(edges.position, None, edges.grad), edges.momentum, edges.step_size, metric, potential
    )
    q, U, g = moved
    kernel_state.last = _Edges(edges.busy, q, g, p, edges.step_size, metric)
    kinetic, velocity = kinetic_energy_and_velocity(metric, p)
    return q, U.tolist(), g, p, velocity, (U + kinetic).tolist()


def _add_leaf(
    chain: _Chain, leaf: tuple, energy: float, max_energy_error: float, tree_key: int
) -> bool:
    """Add the new leaf to the chain's tree: merge the sub-subtrees it closes; at a
    completed doubling, merge into the trajectory and test the whole. Returns whether the
    transition ended at this leaf."""
    q, U, g, p, v = leaf
    error, accept, divergent = leaf_error(energy, chain.start_energy, max_energy_error)
    chain.n_steps += 1
    chain.sum_accept += accept
    if abs(error) > chain.max_error:
        chain.max_error = abs(error)
    chain.edge = leaf
    k = chain.leaf
    chain.leaf = k + 1
    if divergent:
        chain.diverging = True
        return True
    # node: the subtree of 2**level leaves ending at this leaf
    weight, rho, p_begin, v_begin, proposal = -error, p, p, v, (q, U, g, energy)
    stack = chain.stack
    base = chain.next_uniform
    level = 0
    while k & 1:  # leaf k closes one sub-subtree per trailing one-bit of k
        left_weight, left_rho, left_p_begin, left_v_begin, left_p_end, left_v_end, left = stack[
            level
        ]
        merged = _log_add_exp(left_weight, weight)
        if not right_subtree_wins(uniform_at_scalar(tree_key, base + level), weight, merged):
            proposal = left
        right_rho = rho
        rho = left_rho + right_rho
        level += 1
        if not merged_no_u_turn(
            rho, left_rho, left_v_begin, left_p_end, left_v_end, right_rho, p_begin, v_begin, v
        ):
            chain.next_uniform = base + level
            return True
        weight, p_begin, v_begin = merged, left_p_begin, left_v_begin
        k >>= 1
    chain.next_uniform = base + level
    if level < chain.depth:  # a left half: it waits for its sibling
        stack[level] = (weight, rho, p_begin, v_begin, p, v, proposal)
        return False
    # the doubling is complete: biased progressive sampling, then the whole trajectory
    if new_subtree_wins(uniform_at_scalar(tree_key, base + level), weight, chain.log_weight):
        chain.sample = proposal
    chain.log_weight = _log_add_exp(chain.log_weight, weight)
    before = chain.rho
    chain.rho = before + rho
    persists = merged_no_u_turn(
        chain.rho, before, chain.other_v, chain.near_p, chain.near_v, rho, p_begin, v_begin, v
    )
    chain.depth += 1
    chain.leaf = 0
    chain.next_uniform += 1
    return not persists or chain.depth >= chain.max_depth


def _log_add_exp(a: float, b: float) -> float:
    """``log(exp(a) + exp(b))`` for floats (``-inf`` when both are)."""
    high, low = (a, b) if a >= b else (b, a)
    if high == -math.inf:
        return high
    return high + math.log1p(math.exp(low - high))
