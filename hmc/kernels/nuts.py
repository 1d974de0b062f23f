"""Stan's NUTS, iterative, batched over chains and asynchronous.

The transition is Stan's (``base_nuts.hpp``): multinomial sampling, biased progressive
sampling at the top level and uniform progressive sampling inside subtrees; the
momentum-sum U-turn criterion on velocities ``M^-1 p`` with strict ``> 0``, including the
two extra checks across the halves of every subtree and of every doubling; a transition
is divergent when ``H - H0`` exceeds ``max_energy_error`` (NaN counts as +inf), one-sided
and sticky; ``tree_depth`` counts the completed valid doublings; ``acceptance_rate``
averages ``min(1, exp(H0 - H))`` over every leapfrog state computed.

How it runs. Each call of :meth:`NUTS.step` is one *tick*: every busy chain takes exactly
one leapfrog step, with one batched energy call. The recursion of Stan's ``build_tree`` is
replaced by a checkpoint stack with one slot per tree level: when leaf ``k`` of a subtree is
computed, it closes the sub-subtrees whose last leaf it is (one per trailing one-bit of
``k``), and those merges (proposal selection, momentum sums and the three U-turn checks per
merge) are evaluated for all levels at once with cumulative sums over the stack. A chain
whose transition ends reports its draw and starts its next transition at the next tick, so
no chain waits for another's tree. Memory is ``O(C x max_tree_depth x D)``.

Stan's rules themselves (the leaf's error, acceptance statistic and divergence, the
doubling's direction, both progressive-sampling choices, the three U-turn checks of a
merge) are in :mod:`hmc.kernels.nuts_rules`, shared with the host layout; this module
walks the tree. It keeps the trees in batched tensors: the layout of the torch engine (any device,
any number of chains, one host read per tick). The NumPy engine, the CPU's default, keeps
each chain's tree in Python floats and NumPy rows instead (:mod:`hmc.kernels.nuts_host`),
far cheaper per tick for the chain counts CPUs run (``benchmarks/RESULTS.md``). The
kernel picks the layout from the arrays of the state it is given, once per run.

Random numbers. Chain ``c``'s momentum for its transition ``t`` and the uniforms of that
transition (one per doubling for the direction, one per subtree merge in the recursion's
post-order, one per top-level merge) come from ``(seed, c, t)`` and their position in that
order, so results do not depend on the other chains. (Stan draws the top-level uniform
only when the new subtree's weight does not exceed the old one; this kernel always
consumes it, which leaves the distribution unchanged.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from hmc.arrays import zeros
from hmc.integrators import leapfrog
from hmc.kernels import nuts_compiled, nuts_host
from hmc.kernels.base import Params, Phase, Step
from hmc.kernels.nuts_rules import (
    leaf_error,
    merged_no_u_turn,
    new_subtree_wins,
    right_subtree_wins,
    turns_forward,
)
from hmc.metric import kinetic_energy_and_velocity
from hmc.potential import Potential
from hmc.random import Stream, normal, stream_keys, uniform_at
from hmc.state import State, put_rows, take_rows, true_rows, where_rows

__all__ = ["NUTS", "NUTSInfo", "NUTSState"]

_TREE_DRAWS = 1 << nuts_host.TREE_DRAWS_BITS  # uniforms per transition (TREE stream)


class NUTSInfo(NamedTuple):
    """Per-transition statistics, ``(C,)`` each, under their ArviZ names."""

    acceptance_rate: torch.Tensor
    n_steps: torch.Tensor
    diverging: torch.Tensor
    energy: torch.Tensor
    energy_error: torch.Tensor
    max_energy_error: torch.Tensor
    tree_depth: torch.Tensor
    reached_max_treedepth: torch.Tensor


class Point(NamedTuple):
    """A phase-space point: position ``(C, D)``, potential ``(C,)``, gradient and momentum."""

    position: torch.Tensor
    potential: torch.Tensor
    grad: torch.Tensor
    momentum: torch.Tensor


class Proposal(NamedTuple):
    """A candidate draw, packed so that selecting between two takes two ops: ``vectors``
    ``(C, 2, D)`` holds its position and gradient, ``scalars`` ``(C, 2)`` its potential and
    total energy."""

    vectors: torch.Tensor
    scalars: torch.Tensor

    @property
    def energy(self) -> torch.Tensor:
        """``(C,)`` total energy."""
        return self.scalars[:, 1]

    def state(self) -> State:
        """The draw as a :class:`State`."""
        return State(self.vectors[:, 0], self.scalars[:, 0], self.vectors[:, 1])


# Rows of a packed subtree summary (the stack's last-but-one axis, the node's first).
RHO, P_BEGIN, V_BEGIN, P_END, V_END, POSITION, GRAD = range(7)
LOG_WEIGHT, POTENTIAL, ENERGY = range(3)


class Stack(NamedTuple):
    """Completed left halves awaiting their sibling, one slot per tree level, packed.

    vectors : ``(C, L, 7, D)``: the subtree's momentum sum ``rho``, the momenta and
        velocities at its first (``begin``) and last (``end``) leaves, and its proposal's
        position and gradient (rows ``RHO .. GRAD``).
    scalars : ``(C, L, 3)``: the log of its summed weights and its proposal's potential and
        total energy (``LOG_WEIGHT, POTENTIAL, ENERGY``).
    """

    vectors: torch.Tensor
    scalars: torch.Tensor


class Trajectory(NamedTuple):
    """The in-flight transition of every chain (rows of idle chains are stale)."""

    start_energy: torch.Tensor  # H0 (C,)
    edge: Point  # the end being extended by the current doubling
    other: Point  # the opposite end
    edge_forward: torch.Tensor  # (C,) bool: the edge is the forward end
    signed_step: torch.Tensor  # (C, 1) step size, negative when the edge is the backward end
    near_p: torch.Tensor  # (C, D) momentum at the edge when the current doubling began
    near_v: torch.Tensor  # (C, D) its velocity
    other_v: torch.Tensor  # (C, D) velocity at the opposite end
    rho: torch.Tensor  # (C, D) momentum sum of the trajectory before the current doubling
    log_weight: torch.Tensor  # (C,) log sum of exp(H0 - H) over that trajectory
    sample: Proposal  # the current selected point
    depth: torch.Tensor  # (C,) completed valid doublings
    leaf: torch.Tensor  # (C,) leaves done in the current subtree
    n_steps: torch.Tensor  # (C,) leapfrog steps
    sum_accept: torch.Tensor  # (C,) sum of min(1, exp(H0 - H))
    diverging: torch.Tensor  # (C,) bool
    max_error: torch.Tensor  # (C,) max |H - H0|
    next_uniform: torch.Tensor  # (C,) int64 index of the next uniform in the TREE stream
    max_depth: torch.Tensor  # (C,) int64 depth cap of this transition
    stack: Stack  # (C, L, ...) completed left halves awaiting their sibling, per level


class NUTSState(NamedTuple):
    """Kernel state: each chain's in-flight trajectory and counters.

    transition : ``(C,)`` index of the in-flight (or next) transition of each chain: the
        position of its random numbers.
    in_flight, new_doubling : ``(C,)`` bool flags for the next tick.
    starting : ``(C,)`` the chains that start a transition at the next tick; they start
        from their trajectory's ``sample`` (the last draw, or the initial state).
    busy : ``(C,)`` the chains that took a leapfrog step in the last tick.
    readout : ``(7,)`` device tensor for the next tick: whether any chain starts a
        transition, begins a doubling or is busy, then whether all do, then the number of
        busy chains; read by the driver with its own counters (one host read per tick).
        ``read`` holds the values it read.
    keys, tree_keys : the chain keys of the last tick and their TREE stream keys (mixed
        once, not per tick).
    """

    transition: torch.Tensor
    in_flight: torch.Tensor
    new_doubling: torch.Tensor
    starting: torch.Tensor
    busy: torch.Tensor
    trajectory: Trajectory
    readout: torch.Tensor
    read: tuple[int, ...]
    keys: torch.Tensor | None = None
    tree_keys: torch.Tensor | None = None


@dataclass(frozen=True)
class NUTS:
    """The No-U-Turn Sampler as in Stan (multinomial, with the extra U-turn checks).

    Parameters
    ----------
    max_tree_depth : int or (int, int)
        Cap on the number of doublings (a transition takes at most ``2**depth - 1``
        leapfrog steps). A pair gives ``(warmup, sampling)`` caps.
    max_energy_error : float
        Energy error ``H - H0`` above which a transition is divergent (default 1000).

    Examples
    --------
    >>> dt = hmc.sample(log_prob, dim=3, kernel=hmc.NUTS(max_tree_depth=8))  # doctest: +SKIP
    """

    max_tree_depth: int | tuple[int, int] = 10
    max_energy_error: float = 1000.0

    stat_names = NUTSInfo._fields
    spans_calls = True
    compiled_loop = "trees"  # compiling, a call runs every chain's tree (nuts_compiled)

    def __post_init__(self) -> None:
        depths = self._depths()
        if len(depths) != 2 or not all(
            isinstance(d, int) and not isinstance(d, bool) and 1 <= d <= 30 for d in depths
        ):
            raise ValueError(
                "max_tree_depth must be an integer in 1..30 or a (warmup, sampling) pair, "
                f"got {self.max_tree_depth!r}"
            )
        if not self.max_energy_error > 0:
            raise ValueError(f"max_energy_error must be positive, got {self.max_energy_error!r}")

    def _depths(self) -> tuple[int, int]:
        depth = self.max_tree_depth
        return tuple(depth) if isinstance(depth, tuple | list) else (depth, depth)

    # ------------------------------------------------------------------ driver API
    def init(self, state: State, first_transition: int = 0) -> NUTSState | nuts_host.HostNUTSState:
        """Kernel state for chains at ``state``, each to begin its transition number
        ``first_transition`` at the first call. NumPy arrays (the NumPy engine) get each
        chain's tree on the host, tensors the batched trees."""
        position = state.position
        chains, dim = position.shape
        if isinstance(position, np.ndarray):
            return nuts_host.init(state, self._depths(), self.max_energy_error, first_transition)
        device = position.device
        levels = max(self._depths())
        zeros_c = torch.zeros(chains, dtype=position.dtype, device=device)
        ints = torch.zeros(chains, dtype=torch.int64, device=device)
        falses = torch.zeros(chains, dtype=torch.bool, device=device)
        point = Point(position, state.potential, state.grad, torch.zeros_like(position))
        sample = Proposal(
            torch.stack((position, state.grad), 1), torch.stack((state.potential, zeros_c), 1)
        )
        trajectory = Trajectory(
            start_energy=zeros_c,
            edge=point,
            other=point,
            edge_forward=falses,
            signed_step=zeros_c.unsqueeze(-1),
            near_p=torch.zeros_like(position),
            near_v=torch.zeros_like(position),
            other_v=torch.zeros_like(position),
            rho=torch.zeros_like(position),
            log_weight=zeros_c,
            sample=sample,
            depth=ints,
            leaf=ints,
            n_steps=ints,
            sum_accept=zeros_c,
            diverging=falses,
            max_error=zeros_c,
            next_uniform=ints,
            max_depth=ints,
            stack=Stack(
                position.new_zeros(chains, levels, 7, dim), position.new_zeros(chains, levels, 3)
            ),
        )
        starting = ~falses
        return NUTSState(
            transition=ints + first_transition,
            in_flight=falses,
            new_doubling=falses,
            starting=starting,
            busy=falses,
            trajectory=trajectory,
            readout=_readout(starting, starting, starting),
            read=(True,) * 6 + (chains,),
        )

    def step(
        self,
        kernel_state: NUTSState | nuts_host.HostNUTSState,
        params: Params,
        potential: Potential,
        keys: torch.Tensor,
        phase: Phase,
    ) -> tuple[NUTSState | nuts_host.HostNUTSState, Step]:
        """One tick: every busy chain takes one leapfrog step.

        ``phase.sampling`` ``(C,)`` selects the sampling-phase depth cap for transitions
        that start now; a chain whose transition ends begins its next one only if
        ``phase.left`` counts more than the one that ended. Returns the new kernel state
        and the :class:`~hmc.kernels.base.Step`: the chains whose transition ended, with
        their draws and statistics, and the chains that moved (arrays of the run's
        engine).
        """
        if potential.compiles_loops:
            at_draws = nuts_compiled.boundary(kernel_state)
            if at_draws is None:  # drain: the chains in flight end, none starts anew
                phase = phase._replace(left=phase.left * 0)
            else:
                compiled = nuts_compiled.transitions(self, at_draws, params, potential, keys, phase)
                if compiled is not None:
                    return compiled
                kernel_state = at_draws
        if isinstance(kernel_state, nuts_compiled.CompiledNUTSState):  # eager from here
            kernel_state = self._at(kernel_state.state, kernel_state.transition.tolist())
        if isinstance(kernel_state, nuts_host.HostNUTSState):
            return self._host_step(kernel_state, params, potential, keys, phase)
        kernel_state, done = self._tick(kernel_state, params, potential, keys, phase)
        state, info = self._report(kernel_state)
        return kernel_state, Step(done, state, info, kernel_state.busy, None)

    def transition(
        self,
        state: State,
        params: Params,
        potential: Potential,
        keys: torch.Tensor,
        counter: torch.Tensor,
    ) -> tuple[State, NUTSInfo]:
        """One NUTS transition of every chain from ``state`` (its arrays pick the engine),
        for loops written by hand.

        ``counter`` ``(C,)`` numbers each chain's transition: its random numbers come from
        ``(keys[c], counter[c])``, so successive calls need successive counters. Returns
        the new states and statistics, in the arrays of ``state``.
        """
        first = [int(t) for t in counter.tolist()]
        kernel_state = self._at(state, first)
        result: tuple[State, NUTSInfo] | None = None
        pending = len(first)
        one_left = zeros(state.potential, (pending,), "int") + 1
        phase = Phase(sampling=one_left > 0, left=one_left)  # sampling depth cap, one each
        while pending:
            kernel_state, step = self.step(kernel_state, params, potential, keys, phase)
            if step.state is not None:
                new = (step.state, step.info)
                result = new if result is None else where_rows(step.done, new, result)
                phase = phase._replace(left=phase.left - step.done * 1)
            if step.finished is not None:
                pending -= step.finished.size
            elif isinstance(kernel_state, nuts_compiled.CompiledNUTSState):
                pending = 0  # a compiled call ends every chain's transition
            else:  # one read per tick: the readout, whose last entry counts the busy chains
                values = kernel_state.readout.tolist()
                kernel_state, pending = self.with_readout(kernel_state, values), values[-1]
        return result

    def _at(self, state: State, transitions: list[int]) -> NUTSState | nuts_host.HostNUTSState:
        """Kernel state for chains at ``state``, chain ``c`` to begin its transition
        number ``transitions[c]``."""
        kernel_state = self.init(state)
        if isinstance(kernel_state, nuts_host.HostNUTSState):
            for chain, t in zip(kernel_state.chains, transitions, strict=True):
                chain.transition = t
            return kernel_state
        device = kernel_state.transition.device
        return kernel_state._replace(transition=torch.as_tensor(transitions, device=device))

    def _host_step(
        self,
        kernel_state: nuts_host.HostNUTSState,
        params: Params,
        potential: Potential,
        keys: torch.Tensor,
        phase: Phase,
    ) -> tuple[nuts_host.HostNUTSState, Step]:
        """:meth:`step` with each chain's tree on the host (the NumPy engine)."""
        kernel_state, done = nuts_host.advance(kernel_state, params, potential, keys, phase)
        work = np.zeros(done.shape)
        work[kernel_state.moved] = 1.0
        finished = np.array(kernel_state.finished, dtype=np.int64)
        if not kernel_state.finished:
            return kernel_state, Step(done, None, None, work, finished)
        state, stats = nuts_host.report(kernel_state)
        return kernel_state, Step(done, state, NUTSInfo(**stats), work, finished)

    def _tick(
        self,
        kernel_state: NUTSState,
        params: Params,
        potential: Potential,
        keys: torch.Tensor,
        phase: Phase,
    ) -> tuple[NUTSState, torch.Tensor]:
        """One tick of the batched trees: the new kernel state and ``done`` ``(C,)``."""
        any_start, any_doubling, _, all_start, all_doubling, all_busy, n_busy = kernel_state.read
        tree_keys = (
            kernel_state.tree_keys if kernel_state.keys is keys else stream_keys(keys, Stream.TREE)
        )
        traj = kernel_state.trajectory
        # 1. chains without a transition in flight start one (if they have any left)
        start = kernel_state.starting
        if any_start:
            fresh = self._start(kernel_state, params, keys, phase.sampling)
            traj = fresh if all_start else where_rows(start, fresh, traj)
        in_flight = kernel_state.in_flight | start
        # 2. the tick's uniforms in one go: the direction of a doubling that begins now
        # (the first), then those of the merges the leaf may close (the rest, shifted by
        # one for chains that begin a doubling, which takes the first)
        chains, levels = traj.stack.scalars.shape[:2]
        span = _constants(chains, levels, keys.device)[2]
        u = uniform_at(tree_keys, traj.next_uniform.unsqueeze(-1) + span)  # (C, L+2)
        merge_u = u[:, :-1]
        # chains beginning a doubling turn to the end it extends
        if any_doubling:
            doubling = None if all_doubling else kernel_state.new_doubling | start
            traj = _begin_doubling(traj, params, turns_forward(u[:, 0]), doubling)
            after = u[:, 1:]
            merge_u = after if doubling is None else torch.where(doubling[:, None], after, merge_u)
        # 3. one leapfrog step from the edge of every busy chain
        edge, signed = traj.edge, traj.signed_step
        base = State(edge.position, edge.potential, edge.grad)
        if all_busy:
            moved, p = leapfrog(base, edge.momentum, signed, params.metric, potential)
        else:
            rows = true_rows(in_flight, n_busy)
            sub, sub_p = leapfrog(
                take_rows(base, rows),
                edge.momentum.index_select(0, rows),
                signed.index_select(0, rows),
                take_rows(params.metric, rows),
                potential,
            )
            moved = put_rows(base, rows, sub)
            p = edge.momentum.index_copy(0, rows, sub_p)
        leaf = Point(moved.position, moved.potential, moved.grad, p)
        # 4. the leaf joins its subtree; closing sub-subtrees are merged and checked
        traj, finished = self._add_leaf(traj, leaf, params, merge_u)
        done = finished & in_flight
        # 5. chains whose transition ended start anew from their draw next tick
        transition = kernel_state.transition + done.to(kernel_state.transition.dtype)
        still = in_flight & ~done
        new_doubling = still & (traj.leaf == 0)
        starting = ~still & (phase.left > done.to(phase.left.dtype))
        state = NUTSState(
            transition=transition,
            in_flight=still,
            new_doubling=new_doubling,
            starting=starting,
            busy=in_flight,
            trajectory=traj,
            readout=_readout(starting, new_doubling | starting, still | starting),
            read=kernel_state.read,
            keys=keys,
            tree_keys=tree_keys,
        )
        return state, done

    @staticmethod
    def _report(kernel_state: NUTSState) -> tuple[State, NUTSInfo]:
        """Every chain's last draw and the statistics of its last transition (valid in the
        rows of the chains whose transition ended in the last tick)."""
        traj = kernel_state.trajectory
        n_steps = traj.n_steps
        energy = traj.sample.energy
        info = NUTSInfo(
            acceptance_rate=traj.sum_accept / n_steps.clamp(min=1).to(traj.sum_accept.dtype),
            n_steps=n_steps,
            diverging=traj.diverging,
            energy=energy,
            energy_error=energy - traj.start_energy,
            max_energy_error=traj.max_error,
            tree_depth=traj.depth,
            reached_max_treedepth=traj.depth >= traj.max_depth,
        )
        return traj.sample.state(), info

    @staticmethod
    def with_readout(kernel_state: NUTSState, values: list) -> NUTSState:
        """The kernel state with the readout's values, as the driver read them."""
        return kernel_state._replace(read=tuple(int(v) for v in values))

    # ------------------------------------------------------------------ the pieces
    def _start(
        self,
        kernel_state: NUTSState,
        params: Params,
        keys: torch.Tensor,
        sampling: torch.Tensor,
    ) -> Trajectory:
        """A fresh trajectory at each chain's last draw (rows of starting chains)."""
        traj = kernel_state.trajectory
        current = traj.sample.state()
        metric = params.metric
        dtype = current.position.dtype
        noise = normal(
            keys, Stream.MOMENTUM, kernel_state.transition, current.position.shape[1], dtype
        )
        p = metric.momentum(noise)
        energy = current.potential + metric.kinetic_energy(p)
        point = Point(current.position, current.potential, current.grad, p)
        warm_depth, sample_depth = self._depths()
        zeros_c = torch.zeros_like(energy)
        ints = torch.zeros_like(kernel_state.transition)
        return traj._replace(
            start_energy=energy,
            edge=point,
            other=point,
            rho=p,
            log_weight=zeros_c,
            sample=Proposal(traj.sample.vectors, torch.stack((current.potential, energy), 1)),
            depth=ints,
            leaf=ints,
            n_steps=ints,
            sum_accept=zeros_c,
            diverging=torch.zeros_like(kernel_state.in_flight),
            max_error=zeros_c,
            next_uniform=kernel_state.transition * _TREE_DRAWS,
            max_depth=torch.where(sampling, sample_depth, warm_depth).to(ints.dtype),
        )

    def _add_leaf(
        self, traj: Trajectory, leaf: Point, params: Params, u: torch.Tensor
    ) -> tuple[Trajectory, torch.Tensor]:
        """Record a new leaf; merge the sub-subtrees it closes; at a completed doubling,
        merge into the trajectory and test the whole. ``u`` ``(C, L+1)`` holds the
        uniforms ``next_uniform + 0 .. L`` of the TREE stream. Returns the new trajectory
        and ``finished`` ``(C,)`` (the transition ended at this leaf)."""
        metric = params.metric
        vectors, scalars = traj.stack
        chains, levels = scalars.shape[:2]
        level, level_mask, span, rows = _constants(chains, levels, leaf.position.device)
        h0 = traj.start_energy
        kinetic, velocity = kinetic_energy_and_velocity(metric, leaf.momentum)
        energy = leaf.potential + kinetic
        error, accept, divergent = leaf_error(energy, h0, self.max_energy_error)
        log_w = -error  # H0 - H, -inf when H is infinite
        ends = torch.stack((leaf.momentum, velocity), 1)  # (C, 2, D): p and v at the leaf
        leaf_proposal = Proposal(
            torch.stack((leaf.position, leaf.grad), 1), torch.stack((leaf.potential, energy), 1)
        )

        # Sub-subtrees closing at leaf k: one per trailing one-bit of k (levels 0..t-1);
        # level l closes iff bits 0..l of k are all ones, i.e. 2**(l+1) divides k + 1.
        k = traj.leaf
        closing = ((k + 1).unsqueeze(-1) & level_mask) == 0  # (C, L)
        closes = closing.sum(-1)  # t (C,)
        # node_l: the subtree of 2**l leaves ending at this leaf (node_0 is the leaf).
        # Its weight and momentum sum accumulate the stored left halves below level l.
        log_weights = torch.logcumsumexp(
            torch.cat((log_w.unsqueeze(-1), scalars[:, :, LOG_WEIGHT]), dim=1), dim=1
        )  # (C, L+1): log weight of node_l
        rhos = torch.cumsum(torch.cat((leaf.momentum.unsqueeze(1), vectors[:, :, RHO]), 1), 1)
        # p and v at the first leaf of node_l's right half R_l = node_l: the leaf for l = 0
        begin_r = torch.cat((ends.unsqueeze(1), vectors[:, :-1, P_BEGIN : V_BEGIN + 1]), 1)
        v_leaf = velocity.unsqueeze(1).expand(-1, levels, -1)
        v_begin_l = vectors[:, :, V_BEGIN]
        # Stan's three checks of a merge of left_l and node_l: across the whole merged
        # subtree, and across each half with the first (last) point of the other.
        ok = merged_no_u_turn(
            rhos[:, 1:],
            vectors[:, :, RHO],
            v_begin_l,
            vectors[:, :, P_END],
            vectors[:, :, V_END],
            rhos[:, :-1],
            begin_r[:, :, 0],
            begin_r[:, :, 1],
            v_leaf,
        )
        failed = closing & ~ok
        any_failed = failed.any(-1)
        # uniforms of the merges actually performed: levels 0..t-1, or up to the failure
        merges = torch.where(failed, span[1:-1], closes.unsqueeze(-1)).min(-1).values
        merges = torch.where(divergent, 0, merges)
        # at a merge of left_l and node_l, node_l's proposal wins w.p. w(node_l) / w(node_{l+1})
        right_wins = right_subtree_wins(u[:, :levels], log_weights[:, :-1], log_weights[:, 1:])
        # the proposal of node_t: from the highest closing level where the left half won
        left_won = closing & ~right_wins
        source = torch.where(left_won, level, -1).amax(-1)  # -1: the leaf itself
        # one gather for both stored subtrees read: the proposal's source and the level
        # below node_t, whose first leaf begins node_t
        below = (closes - 1).clamp(min=0)
        picked = vectors[rows.unsqueeze(-1), torch.stack((source.clamp(min=0), below), 1)]
        from_stack = Proposal(
            picked[:, 0, POSITION:], scalars[rows, source.clamp(min=0), POTENTIAL:]
        )
        proposal = _where_proposal(source >= 0, from_stack, leaf_proposal)
        valid = ~(divergent | any_failed)
        node_weight = log_weights[rows, closes]
        node_rho = rhos[rows, closes]
        node_begin = torch.where(
            (closes > 0).view(-1, 1, 1), picked[:, 1, P_BEGIN : V_BEGIN + 1], ends
        )  # (C, 2, D): p and v at node_t's first leaf
        complete = valid & (closes == traj.depth)
        # A completed left half waits on the stack at its level. Other chains write the
        # same slot too: for them it is above every level the current subtree reads
        # before writing it again, or their transition is over (idle chains' counters
        # run on, hence the clamp).
        slot = closes.clamp(max=levels - 1)
        vectors = vectors.index_put(
            (rows, slot), torch.cat((node_rho.unsqueeze(1), node_begin, ends, proposal.vectors), 1)
        )
        scalars = scalars.index_put(
            (rows, slot), torch.cat((node_weight.unsqueeze(1), proposal.scalars), 1)
        )

        # ---- top level: a completed doubling merges into the trajectory
        top_u = u[rows, merges]
        take = new_subtree_wins(top_u, node_weight, traj.log_weight)
        sample = _where_proposal(complete & take, proposal, traj.sample)
        log_weight = torch.where(
            complete, torch.logaddexp(traj.log_weight, node_weight), traj.log_weight
        )
        rho_total = traj.rho + node_rho
        persists = merged_no_u_turn(
            rho_total,
            traj.rho,
            traj.other_v,
            traj.near_p,
            traj.near_v,
            node_rho,
            node_begin[:, 0],
            node_begin[:, 1],
            velocity,
        )
        completed = complete.to(traj.depth.dtype)
        depth = traj.depth + completed
        finished = ~valid | (complete & (~persists | (depth >= traj.max_depth)))
        return traj._replace(
            edge=leaf,
            rho=torch.where(complete.unsqueeze(-1), rho_total, traj.rho),
            log_weight=log_weight,
            sample=sample,
            depth=depth,
            leaf=torch.where(complete, 0, k + 1),
            n_steps=traj.n_steps + 1,
            sum_accept=traj.sum_accept + accept,
            diverging=traj.diverging | divergent,
            max_error=torch.maximum(traj.max_error, error.abs()),
            next_uniform=traj.next_uniform + merges + completed,
            stack=Stack(vectors, scalars),
        ), finished


def _begin_doubling(
    traj: Trajectory, params: Params, forward: torch.Tensor, doubling: torch.Tensor | None
) -> Trajectory:
    """Chains ``doubling`` ``(C,)`` (every chain when None) begin a doubling in the drawn
    direction (``forward`` ``(C,)``): that end becomes the edge. Other rows keep theirs."""
    swap = forward != traj.edge_forward
    if doubling is not None:
        swap = swap & doubling
    edge = where_rows(swap, traj.other, traj.edge)
    other = where_rows(swap, traj.edge, traj.other)
    step_size = params.step_size
    velocity = params.metric.velocity
    fresh = (
        torch.where(forward, step_size, -step_size).unsqueeze(-1),
        edge.momentum,
        velocity(edge.momentum),
        velocity(other.momentum),
    )
    if doubling is None:
        signed_step, near_p, near_v, other_v = fresh
        leaf, next_uniform = torch.zeros_like(traj.leaf), traj.next_uniform + 1
    else:
        kept = (traj.signed_step, traj.near_p, traj.near_v, traj.other_v)
        rows = doubling.unsqueeze(-1)
        signed_step, near_p, near_v, other_v = (
            torch.where(rows, new, old) for new, old in zip(fresh, kept, strict=True)
        )
        leaf, next_uniform = torch.where(doubling, 0, traj.leaf), traj.next_uniform + doubling
    return traj._replace(
        edge=edge,
        other=other,
        edge_forward=traj.edge_forward ^ swap,
        signed_step=signed_step,
        near_p=near_p,
        near_v=near_v,
        other_v=other_v,
        leaf=leaf,
        next_uniform=next_uniform,
    )


def _where_proposal(mask: torch.Tensor, a: Proposal, b: Proposal) -> Proposal:
    """Row-wise select: chain ``c``'s proposal from ``a`` where ``mask[c]``."""
    return Proposal(
        torch.where(mask.view(-1, 1, 1), a.vectors, b.vectors),
        torch.where(mask.view(-1, 1), a.scalars, b.scalars),
    )


def _readout(starting: torch.Tensor, doubling: torch.Tensor, busy: torch.Tensor) -> torch.Tensor:
    """``(7,)`` int64: whether any chain, then whether every chain, starts a transition,
    begins a doubling, or is busy at the next tick; then the number of busy chains."""
    masks = torch.stack((starting, doubling, busy))
    return torch.cat((masks.any(1), masks.all(1), busy.sum(0, keepdim=True)))


_CONSTANTS: dict[tuple[int, int, torch.device], tuple[torch.Tensor, ...]] = {}


def _constants(chains: int, levels: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """``arange(levels)``, the masks ``2**(l+1) - 1`` of the low ``l + 1`` bits,
    ``arange(levels + 2)`` and ``arange(chains)``, on ``device``, made once. None is a
    view of another: torch's ``while_loop`` refuses inputs that alias one another, and
    a tick traced inside one takes these as inputs."""
    key = (chains, levels, device)
    found = _CONSTANTS.get(key)
    if found is None:
        level = torch.arange(levels, device=device)
        span = torch.arange(levels + 2, device=device)
        found = (level, (2 << level) - 1, span, torch.arange(chains, device=device))
        _CONSTANTS[key] = found
    return found
