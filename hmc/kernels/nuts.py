"""Stan's NUTS, iterative, batched over chains and asynchronous.

The transition is Stan's (``base_nuts.hpp``): multinomial sampling, biased progressive
sampling at the top level and uniform progressive sampling inside subtrees; the
momentum-sum U-turn criterion on velocities ``M^-1 p`` with strict ``> 0``, including the
two extra checks across the halves of every subtree and of every doubling; a transition
is divergent when ``H - H0`` exceeds ``max_energy_error`` (NaN counts as +inf), one-sided
and sticky; ``tree_depth`` counts the completed valid doublings; ``acceptance_rate``
averages ``min(1, exp(H0 - H))`` over every leapfrog state computed.

How it runs. Each call of :meth:`NUTS.advance` is one *tick*: every busy chain takes exactly
one leapfrog step, with one batched energy call. The recursion of Stan's ``build_tree`` is
replaced by a checkpoint stack with one slot per tree level: when leaf ``k`` of a subtree is
computed, it closes the sub-subtrees whose last leaf it is (one per trailing one-bit of
``k``), and those merges (proposal selection, momentum sums and the three U-turn checks per
merge) are evaluated for all levels at once with cumulative sums over the stack. A chain
whose transition ends reports its draw and starts its next transition at the next tick, so
no chain waits for another's tree. Memory is ``O(C x max_tree_depth x D)``.

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

import torch

from hmc.integrators import leapfrog
from hmc.kernels.base import Params
from hmc.metric import no_u_turn
from hmc.potential import Potential
from hmc.random import Stream, normal, stream_keys, uniform_from
from hmc.state import State, put_rows, take_rows, where_rows

__all__ = ["NUTS", "NUTSInfo", "NUTSState"]

_TREE_DRAWS = 1 << 32  # uniforms reserved per transition in the TREE stream


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
    """A candidate draw: position, potential, gradient and its total energy ``(C,)``."""

    position: torch.Tensor
    potential: torch.Tensor
    grad: torch.Tensor
    energy: torch.Tensor


class Subtree(NamedTuple):
    """Summary of a complete subtree: log of its summed weights, momentum sum ``rho``, the
    momenta and velocities at its first (``begin``) and last (``end``) leaves, and its
    proposal. In the checkpoint stack every field has a level axis after the chain axis."""

    log_weight: torch.Tensor
    rho: torch.Tensor
    p_begin: torch.Tensor
    v_begin: torch.Tensor
    p_end: torch.Tensor
    v_end: torch.Tensor
    proposal: Proposal


class Trajectory(NamedTuple):
    """The in-flight transition of every chain (rows of idle chains are stale)."""

    start_energy: torch.Tensor  # H0 (C,)
    edge: Point  # the end being extended by the current doubling
    other: Point  # the opposite end
    edge_forward: torch.Tensor  # (C,) bool: the edge is the forward end
    near_p: torch.Tensor  # (C, D) momentum at the edge when the current doubling began
    near_v: torch.Tensor  # (C, D) its velocity
    rho: torch.Tensor  # (C, D) momentum sum of the trajectory before the current doubling
    log_weight: torch.Tensor  # (C,) log sum of exp(H0 - H) over that trajectory
    sample: Proposal  # the current selected point
    depth: torch.Tensor  # (C,) completed valid doublings
    leaf: torch.Tensor  # (C,) leaves done in the current subtree
    n_steps: torch.Tensor  # (C,) leapfrog steps
    sum_accept: torch.Tensor  # (C,) sum of min(1, exp(H0 - H))
    diverging: torch.Tensor  # (C,) bool
    max_error: torch.Tensor  # (C,) max |H - H0|
    uniforms_used: torch.Tensor  # (C,) int64 position in the transition's uniform stream
    max_depth: torch.Tensor  # (C,) int64 depth cap of this transition
    stack: Subtree  # (C, L, ...) completed left halves awaiting their sibling, per level


class NUTSState(NamedTuple):
    """Kernel state: where each chain is, its in-flight trajectory and counters.

    current : the state each chain's next transition starts from.
    transition : ``(C,)`` index of the in-flight (or next) transition of each chain.
    limit : ``(C,)`` number of transitions each chain is to run.
    in_flight, new_doubling : ``(C,)`` bool flags for the next tick.
    busy : ``(C,)`` the chains that took a leapfrog step in the last tick.
    flags : ``(5,)`` device tensor of flags for the next tick, read by the driver with its
        own counters (one host read per tick); ``host`` holds the values it read.
    keys, tree_keys : the chain keys of the last tick and their TREE stream keys (mixed
        once, not per tick).
    """

    current: State
    transition: torch.Tensor
    limit: torch.Tensor
    in_flight: torch.Tensor
    new_doubling: torch.Tensor
    busy: torch.Tensor
    trajectory: Trajectory
    flags: torch.Tensor
    host: tuple[bool, ...]
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
    def init(self, state: State, num_transitions: int | None = None) -> NUTSState:
        """Kernel state for chains at ``state``; each runs ``num_transitions`` (unbounded
        when None) transitions."""
        position = state.position
        chains, dim = position.shape
        device = position.device
        levels = max(self._depths())
        zeros_c = torch.zeros(chains, dtype=position.dtype, device=device)
        ints = torch.zeros(chains, dtype=torch.int64, device=device)
        falses = torch.zeros(chains, dtype=torch.bool, device=device)
        point = Point(position, state.potential, state.grad, torch.zeros_like(position))
        proposal = Proposal(position, state.potential, state.grad, zeros_c)

        def stacked(x: torch.Tensor) -> torch.Tensor:
            return x.unsqueeze(1).expand(-1, levels, *x.shape[1:]).clone()

        stack = Subtree(
            log_weight=stacked(zeros_c),
            rho=stacked(position),
            p_begin=stacked(position),
            v_begin=stacked(position),
            p_end=stacked(position),
            v_end=stacked(position),
            proposal=Proposal(*(stacked(x) for x in proposal)),
        )
        trajectory = Trajectory(
            start_energy=zeros_c,
            edge=point,
            other=point,
            edge_forward=falses,
            near_p=torch.zeros_like(position),
            near_v=torch.zeros_like(position),
            rho=torch.zeros_like(position),
            log_weight=zeros_c,
            sample=proposal,
            depth=ints,
            leaf=ints,
            n_steps=ints,
            sum_accept=zeros_c,
            diverging=falses,
            max_error=zeros_c,
            uniforms_used=ints,
            max_depth=ints,
            stack=stack,
        )
        limit = torch.full(
            (chains,), num_transitions if num_transitions is not None else 2**62, device=device
        )
        del dim
        return NUTSState(
            current=state,
            transition=ints,
            limit=limit,
            in_flight=falses,
            new_doubling=falses,
            busy=falses,
            trajectory=trajectory,
            flags=torch.ones(5, dtype=torch.bool, device=device),
            host=(True, True, True, True, True),
        )

    def advance(
        self,
        kernel_state: NUTSState,
        params: Params,
        potential: Potential,
        keys: torch.Tensor,
        sampling: torch.Tensor,
    ) -> tuple[NUTSState, torch.Tensor]:
        """One tick: every busy chain takes one leapfrog step.

        ``sampling`` ``(C,)`` selects the sampling-phase depth cap for transitions that
        start now. Returns the new kernel state and ``done`` ``(C,)``, the chains whose
        transition ended (their draws and statistics come from :meth:`report`).
        """
        ks = kernel_state
        any_start, all_start, any_doubling, all_doubling, all_busy = ks.host
        tree_keys = ks.tree_keys if ks.keys is keys else stream_keys(keys, Stream.TREE)
        traj = ks.trajectory
        # 1. chains without a transition in flight start one (if they have any left)
        start = ~ks.in_flight & (ks.transition < ks.limit)
        if any_start:
            fresh = self._start(ks, params, keys, sampling)
            traj = fresh if all_start else where_rows(start, fresh, traj)
        in_flight = ks.in_flight | start
        # 2. chains beginning a doubling draw its direction and turn to that end
        if any_doubling:
            turned = _begin_doubling(traj, params, tree_keys, ks.transition)
            traj = turned if all_doubling else where_rows(ks.new_doubling | start, turned, traj)
        # 3. one leapfrog step from the edge of every busy chain
        edge, step_size = traj.edge, params.step_size
        signed = torch.where(traj.edge_forward, step_size, -step_size).unsqueeze(-1)
        base = State(edge.position, edge.potential, edge.grad)
        if all_busy:
            moved, p = leapfrog(base, edge.momentum, signed, params.metric, potential)
        else:
            rows = in_flight.nonzero().flatten()
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
        traj, finished = self._add_leaf(traj, leaf, params, tree_keys, ks.transition)
        done = finished & in_flight
        # 5. chains whose transition ended move to their draw and start anew next tick
        sample = traj.sample
        draw = State(sample.position, sample.potential, sample.grad)
        current = where_rows(done, draw, ks.current)
        transition = ks.transition + done.to(ks.transition.dtype)
        still = in_flight & ~done
        new_doubling = still & (traj.leaf == 0)
        starting = ~still & (transition < ks.limit)
        doubling = new_doubling | starting
        busy = still | starting
        flags = torch.stack(
            (starting.any(), starting.all(), doubling.any(), doubling.all(), busy.all())
        )
        state = NUTSState(
            current=current,
            transition=transition,
            limit=ks.limit,
            in_flight=still,
            new_doubling=new_doubling,
            busy=in_flight,
            trajectory=traj,
            flags=flags,
            host=ks.host,
            keys=keys,
            tree_keys=tree_keys,
        )
        return state, done

    @staticmethod
    def report(kernel_state: NUTSState) -> tuple[State, NUTSInfo]:
        """The draws and statistics of the transitions that ended in the last tick
        (valid in the rows of the chains reported ``done``)."""
        traj = kernel_state.trajectory
        sample = traj.sample
        n_steps = traj.n_steps
        info = NUTSInfo(
            acceptance_rate=traj.sum_accept / n_steps.clamp(min=1).to(traj.sum_accept.dtype),
            n_steps=n_steps,
            diverging=traj.diverging,
            energy=sample.energy,
            energy_error=sample.energy - traj.start_energy,
            max_energy_error=traj.max_error,
            tree_depth=traj.depth,
            reached_max_treedepth=traj.depth >= traj.max_depth,
        )
        return State(sample.position, sample.potential, sample.grad), info

    @staticmethod
    def with_host_flags(kernel_state: NUTSState, values: list) -> NUTSState:
        """The kernel state with the flags the driver read from the device."""
        return kernel_state._replace(host=tuple(bool(v) for v in values))

    # ------------------------------------------------------------------ the pieces
    def _start(
        self,
        ks: NUTSState,
        params: Params,
        keys: torch.Tensor,
        sampling: torch.Tensor,
    ) -> Trajectory:
        """A fresh trajectory at each chain's current state (rows of starting chains)."""
        current = ks.current
        metric = params.metric
        dtype = current.position.dtype
        noise = normal(keys, Stream.MOMENTUM, ks.transition, current.position.shape[1], dtype)
        p = metric.momentum(noise)
        energy = current.potential + metric.kinetic_energy(p)
        point = Point(current.position, current.potential, current.grad, p)
        warm_depth, sample_depth = self._depths()
        traj = ks.trajectory
        zeros_c = torch.zeros_like(energy)
        ints = torch.zeros_like(ks.transition)
        return traj._replace(
            start_energy=energy,
            edge=point,
            other=point,
            rho=p,
            log_weight=zeros_c,
            sample=Proposal(current.position, current.potential, current.grad, energy),
            depth=ints,
            leaf=ints,
            n_steps=ints,
            sum_accept=zeros_c,
            diverging=torch.zeros_like(ks.in_flight),
            max_error=zeros_c,
            uniforms_used=ints,
            max_depth=torch.where(sampling, sample_depth, warm_depth).to(ints.dtype),
        )

    def _add_leaf(
        self,
        traj: Trajectory,
        leaf: Point,
        params: Params,
        tree_keys: torch.Tensor,
        transition: torch.Tensor,
    ) -> tuple[Trajectory, torch.Tensor]:
        """Record a new leaf; merge the sub-subtrees it closes; at a completed doubling,
        merge into the trajectory and test the whole. Returns the new trajectory and
        ``finished`` ``(C,)`` (the transition ended at this leaf)."""
        metric = params.metric
        stack = traj.stack
        levels = stack.log_weight.shape[1]
        h0 = traj.start_energy
        energy = leaf.potential + metric.kinetic_energy(leaf.momentum)
        energy = torch.nan_to_num(energy, nan=torch.inf, posinf=torch.inf)
        error = energy - h0
        divergent = error > self.max_energy_error
        log_w = -error  # H0 - H, -inf when H is infinite
        accept = torch.exp(torch.clamp(log_w, max=0.0))
        velocity = metric.velocity(leaf.momentum)
        leaf_proposal = Proposal(leaf.position, leaf.potential, leaf.grad, energy)

        # Sub-subtrees closing at leaf k: one per trailing one-bit of k (levels 0..t-1).
        k = traj.leaf
        level = torch.arange(levels, device=k.device)
        bits = (k.unsqueeze(-1) >> level) & 1  # (C, L)
        closing = torch.cumprod(bits, dim=1).bool()  # level l closes iff bits 0..l are 1
        closes = closing.sum(-1)  # t (C,)
        # node_l: the subtree of 2**l leaves ending at this leaf (node_0 is the leaf).
        # Its weight and momentum sum accumulate the stored left halves below level l.
        log_weights = torch.logcumsumexp(
            torch.cat((log_w.unsqueeze(-1), stack.log_weight), dim=1), dim=1
        )  # (C, L+1): log weight of node_l
        rhos = torch.cumsum(torch.cat((leaf.momentum.unsqueeze(1), stack.rho), dim=1), dim=1)
        # the first leaf of node_l's right half R_l = node_l: leaf itself for l = 0
        p_begin_r = torch.cat((leaf.momentum.unsqueeze(1), stack.p_begin[:, :-1]), dim=1)
        v_begin_r = torch.cat((velocity.unsqueeze(1), stack.v_begin[:, :-1]), dim=1)
        v_leaf = velocity.unsqueeze(1).expand_as(v_begin_r)
        # Stan's three checks of a merge of left_l and node_l: across the whole merged
        # subtree, and across each half with the first (last) point of the other.
        ok = _no_u_turns(
            torch.stack((stack.v_begin, stack.v_begin, stack.v_end)),
            torch.stack((v_leaf, v_begin_r, v_leaf)),
            torch.stack((rhos[:, 1:], stack.rho + p_begin_r, rhos[:, :-1] + stack.p_end)),
        )
        failed = closing & ~ok
        any_failed = failed.any(-1)
        first_failure = torch.where(failed, level, levels).amin(-1)
        # uniforms of the merges actually performed: levels 0..t-1, or up to the failure
        merges = torch.where(any_failed, first_failure + 1, closes)
        merges = torch.where(divergent, 0, merges)
        index = transition.unsqueeze(-1) * _TREE_DRAWS + traj.uniforms_used.unsqueeze(-1)
        u = uniform_from(tree_keys, index + torch.arange(levels + 1, device=k.device))
        # at a merge of left_l and node_l, node_l's proposal wins w.p. w(node_l) / w(node_{l+1})
        right_wins = u[:, :levels] < torch.exp(log_weights[:, :-1] - log_weights[:, 1:])
        # the proposal of node_t: from the highest closing level where the left half won
        left_won = closing & ~right_wins
        source = torch.where(left_won, level, -1).amax(-1)  # -1: the leaf itself
        from_stack = Proposal(*(_gather_level(x, source.clamp(min=0)) for x in stack.proposal))
        proposal = where_rows(source >= 0, from_stack, leaf_proposal)
        valid = ~divergent & ~any_failed
        node_weight = _gather_level(log_weights, closes)
        node_rho = _gather_level(rhos, closes)
        below = (closes - 1).clamp(min=0)
        node_p_begin = torch.where(
            (closes > 0).unsqueeze(-1), _gather_level(stack.p_begin, below), leaf.momentum
        )
        node_v_begin = torch.where(
            (closes > 0).unsqueeze(-1), _gather_level(stack.v_begin, below), velocity
        )
        node = Subtree(
            node_weight, node_rho, node_p_begin, node_v_begin, leaf.momentum, velocity, proposal
        )
        complete = valid & (closes == traj.depth)
        # A completed left half waits on the stack at its level. Other chains write the
        # same slot too: for them it is above every level the current subtree reads
        # before writing it again, or their transition is over (idle chains' counters
        # run on, hence the clamp).
        _put_level(stack, closes.clamp(max=levels - 1), node)
        used = traj.uniforms_used + merges

        # ---- top level: a completed doubling merges into the trajectory
        top_u = _gather_level(u, merges)
        take = (node_weight > traj.log_weight) | (top_u < torch.exp(node_weight - traj.log_weight))
        sample = where_rows(complete & take, proposal, traj.sample)
        log_weight = torch.where(
            complete, torch.logaddexp(traj.log_weight, node_weight), traj.log_weight
        )
        rho_total = traj.rho + node_rho
        other_v = metric.velocity(traj.other.momentum)
        persists = _no_u_turns(
            torch.stack((other_v, other_v, traj.near_v)),
            torch.stack((velocity, node_v_begin, velocity)),
            torch.stack((rho_total, traj.rho + node_p_begin, node_rho + traj.near_p)),
        )
        depth = traj.depth + complete.to(traj.depth.dtype)
        finished = ~valid | (complete & (~persists | (depth >= traj.max_depth)))
        used = used + complete.to(used.dtype)
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
            max_error=torch.maximum(
                traj.max_error, torch.nan_to_num(error.abs(), nan=torch.inf, posinf=torch.inf)
            ),
            uniforms_used=used,
        ), finished


def _begin_doubling(
    traj: Trajectory, params: Params, tree_keys: torch.Tensor, transition: torch.Tensor
) -> Trajectory:
    """Draw each chain's direction (forward when u > 1/2) and make that end the edge."""
    index = transition * _TREE_DRAWS + traj.uniforms_used
    forward = uniform_from(tree_keys, index) > 0.5
    swap = forward != traj.edge_forward
    edge = where_rows(swap, traj.other, traj.edge)
    other = where_rows(swap, traj.edge, traj.other)
    return traj._replace(
        edge=edge,
        other=other,
        edge_forward=forward,
        near_p=edge.momentum,
        near_v=params.metric.velocity(edge.momentum),
        leaf=torch.zeros_like(traj.leaf),
        uniforms_used=traj.uniforms_used + 1,
    )


def _no_u_turns(v_minus: torch.Tensor, v_plus: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    """All of several :func:`hmc.metric.no_u_turn` criteria stacked on a leading axis:
    ``(K, C, ..., D)`` velocities and momentum sums give ``(C, ...)`` bool."""
    return no_u_turn(v_minus, v_plus, rho).all(0)


def _gather_level(x: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
    """``x[c, level[c]]`` for a ``(C, L, ...)`` tensor."""
    return x[_rows(x.shape[0], x.device), level]


_ROWS: dict[tuple[int, torch.device], torch.Tensor] = {}


def _rows(chains: int, device: torch.device) -> torch.Tensor:
    """``arange(chains)`` on ``device``, made once."""
    rows = _ROWS.get((chains, device))
    if rows is None:
        rows = _ROWS[(chains, device)] = torch.arange(chains, device=device)
    return rows


def _put_level(stack: Subtree, level: torch.Tensor, node: Subtree) -> None:
    """Write ``node`` into slot ``level[c]`` of every chain's stack, in place."""
    rows = _rows(level.shape[0], level.device)
    for slot, value in zip(_fields(stack), _fields(node), strict=True):
        slot.index_put_((rows, level), value)


def _fields(record: tuple) -> list[torch.Tensor]:
    """The tensors of a nested record, in order."""
    out = []
    for x in record:
        out.extend(_fields(x) if isinstance(x, tuple) else [x])
    return out
