"""Ensemble warmup: every iteration of every chain pooled into one adaptation.

All chains run their warmup iterations in lockstep (the driver waits for every chain to
finish iteration ``t`` before any begins ``t + 1``) and share one step size, one metric
and, for :class:`hmc.ChEES`, one trajectory length. After each warmup iteration
(:meth:`EnsembleWarmup.pool`):

1. chains stranded far below the others' log density at this iteration
   (:func:`hmc.adapt.stranded.stranded_chains`: a start where the shared step size
   cannot move them) are left out of what follows until they join: their zero
   acceptance would drag the step size down, and their gradients, orders of magnitude
   larger than the others', would shrink the metric;
2. one dual-averaging update on the other chains' mean acceptance statistic (for ChEES,
   as in its paper, the harmonic mean of the chains that did not diverge, here times
   their share, so that divergences shrink the step size); one update per chain would
   inflate the gain about ``sqrt(C)`` and make the step size oscillate;
3. inside a slow window, their positions and gradients join pooled moments; at the
   window's end the inverse metric becomes the "Fisher" diagonal
   ``sqrt(Var x / Var grad log p)`` (exact for a Gaussian, whose gradient variance is the
   inverse of its variance), or the pooled covariance for ``metric="dense"``, regularised
   as Stan regularises (``n / (n + 5) * S + 1e-3 * 5 / (n + 5)``, ``n`` the pooled count),
   or for ``metric="low-rank"`` the low-rank metric of the window's draws and gradients
   of those chains (:mod:`hmc.adapt.low_rank`; the buffer holds ``C x W x D`` of each,
   ``W`` the longest window);
   chains whose log density stayed far below the others' over the window restart from
   healthy chains' states (so that they part from them before any draw is kept); Stan's
   step-size heuristic then runs on every chain and dual averaging restarts at the
   geometric mean of their step sizes;
4. at a window's end, when warmup has settled (:func:`settled`, over the chains not
   stranded: the new metric within :data:`EARLY_STOP_METRIC_CHANGE` of the previous
   window's in every coordinate, and the log density without a trend across the window,
   its bulk ESS above :data:`EARLY_STOP_ESS`), the later windows are skipped: warmup goes
   on with its terminal buffer, which only tunes the step size. R-hat over a window is no
   test here: over a few dozen autocorrelated draws per chain it stays well above 1 on
   chains that have converged (1.06-1.08 with 256 chains on a Gaussian);
5. for ChEES, the trajectory length takes one Adam step (``beta1 = 0``, ``beta2 = 0.95``,
   steps clipped to ``+-0.35`` in ``log T``) up the ChEES criterion's gradient, estimated
   from every chain's trajectory and weighted by its acceptance probability; at a
   window's end it is at least one step of the new step size;
6. after the last warmup iteration the step size becomes ``exp(x_bar)``, ``T`` the
   average of its log iterates, and chains stranded over the terminal buffer restart
   from healthy ones.

The schedule (:func:`ensemble_schedule`) is Stan's windowed one with short buffers and
windows: 20 iterations of fast buffer, windows of 20, 40, 80, then 160 each, and a
terminal buffer of 40 (fewer for a warmup under 200). Where the chains settle early,
the run is short (64 chains on Gaussians, eight schools and a logistic regression:
120-200 iterations); where they do not (chains far from the posterior after random
starts), warmup goes on, window after window, up to the iterations asked for (by
default 1000, as in Stan).

In a chain-parallel run (:mod:`hmc.distributed`) each rank runs its block of the chains;
every pooled quantity above is taken over all of them, gathered from the ranks once per
warmup iteration, and the step-size search runs on each rank's own chains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from hmc.adapt.low_rank import (
    LowRank,
    WindowDraws,
    low_rank_metric,
    window_add,
    window_init,
    window_length,
)
from hmc.adapt.schedule import WarmupSchedule, schedule_from_windows
from hmc.adapt.step_size import (
    DualAveragingState,
    dual_averaging_final,
    dual_averaging_init,
    dual_averaging_update,
)
from hmc.adapt.stranded import restart_stranded, stranded_chains
from hmc.adapt.warmup import StepSizeSearch
from hmc.arrays import as_tensors
from hmc.diagnostics import ess
from hmc.distributed import ChainSplit
from hmc.metric import LowRankMetric, Metric, inverse_diagonal, metric_from_inverse
from hmc.state import Params, Proposal, State

__all__ = [
    "EARLY_STOP_ESS",
    "EARLY_STOP_METRIC_CHANGE",
    "EnsembleState",
    "EnsembleWarmup",
    "Pooled",
    "PooledMoments",
    "TrajectoryState",
    "ensemble_schedule",
    "settled",
    "stranded_chains",
]

#: warmup has settled when no coordinate of the inverse metric moved by more than this
#: factor since the previous window ...
EARLY_STOP_METRIC_CHANGE = 1.25
#: ... the bulk ESS of the log density over the window is above this ...
EARLY_STOP_ESS = 400.0
#: ... and the means of its two halves differ by less than this many standard errors
EARLY_STOP_TREND = 3.0
#: ChEES's Adam: learning rate, second-moment decay, largest step in log T
ADAM_RATE, ADAM_BETA2, ADAM_CLIP = 0.05, 0.95, 0.35
#: ChEES's gradients are clipped to this many times their running root mean square
OUTLIER_RMS = 5.0
#: weight ``k ** -TRAJECTORY_DECAY`` of iterate ``k`` in the average of log T
TRAJECTORY_DECAY = 0.5


#: the ensemble schedule's first fast buffer and first window, and its terminal buffer, at
#: most: 200 iterations' schedule is 20 + windows of 20, 40, 80 + 40
FIRST_WINDOW, TERMINAL_BUFFER = 20, 40
#: the longest window: its draws from all chains make plenty for a metric, and a longer
#: warmup is for chains that have not settled, to be tested every so many iterations
LONGEST_WINDOW = 160


def ensemble_schedule(num_warmup: int, device: torch.device | str = "cpu") -> WarmupSchedule:
    """The ensemble warmup's windows for ``num_warmup`` iterations (see the module): a
    first fast buffer and first window of 10 % of the warmup and a terminal buffer of
    20 %, at most :data:`FIRST_WINDOW` and :data:`TERMINAL_BUFFER`; then windows that
    double up to :data:`LONGEST_WINDOW`, the last stretched to the terminal buffer when
    the next would overrun it (as Stan stretches its last). Under 20 iterations, no
    windows. A longer warmup only adds windows, for chains that have not settled by the
    early stop's test: 200 iterations give windows 20-39, 40-79, 80-159; 1000 go on with
    160-319, 320-479, ..., 800-959."""
    if num_warmup < 20:
        return schedule_from_windows(num_warmup, [], device)
    first = min(FIRST_WINDOW, math.ceil(0.1 * num_warmup))
    last = num_warmup - min(TERMINAL_BUFFER, math.ceil(0.2 * num_warmup)) - 1
    windows: list[tuple[int, int]] = []
    start, size = first, first
    while start <= last:
        following = min(2 * size, LONGEST_WINDOW)
        end = start + size - 1
        if end + following > last:
            end = last
        windows.append((start, end))
        start, size = end + 1, following
    return schedule_from_windows(num_warmup, windows, device)


class PooledMoments(NamedTuple):
    """Mean and summed squared deviations of vectors from all chains: ``count`` a 0-d
    tensor, ``mean`` ``(D,)``, ``m2`` ``(D,)`` (diagonal) or ``(D, D)`` (dense)."""

    count: torch.Tensor
    mean: torch.Tensor
    m2: torch.Tensor


def moments_init(like: torch.Tensor, dense: bool) -> PooledMoments:
    """Empty moments for vectors shaped like the rows of ``like`` ``(C, D)``."""
    dim = like.shape[1]
    zero = like.new_zeros(())
    return PooledMoments(zero, like.new_zeros(dim), like.new_zeros((dim, dim) if dense else dim))


def moments_add(moments: PooledMoments, x: torch.Tensor) -> PooledMoments:
    """``moments`` with the rows of ``x`` ``(C, D)`` added (Chan et al.'s pairwise merge)."""
    n = x.shape[0]
    batch_mean = x.mean(0)
    centred = x - batch_mean
    total = moments.count + n
    delta = batch_mean - moments.mean
    weight = moments.count * n / total
    if moments.m2.dim() == 2:
        batch_m2 = centred.T @ centred
        m2 = moments.m2 + batch_m2 + weight * torch.outer(delta, delta)
    else:
        m2 = moments.m2 + (centred * centred).sum(0) + weight * delta * delta
    return PooledMoments(total, moments.mean + delta * (n / total), m2)


def _regularised(estimate: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Stan's shrinkage of a (co)variance estimate from ``count`` draws."""
    shrink, jitter = count / (count + 5), 1e-3 * 5 / (count + 5)
    if estimate.dim() == 2:
        return shrink * estimate + jitter * torch.eye(estimate.shape[0]).to(estimate)
    return shrink * estimate + jitter


def pooled_inverse_metric(position: PooledMoments, gradient: PooledMoments) -> torch.Tensor:
    """The inverse metric from the pooled moments: ``sqrt(Var x / Var grad)`` per
    coordinate (``Var x`` where the gradient does not vary) ``(D,)``, or the covariance of
    the positions ``(D, D)`` when they are dense."""
    n = position.count
    variance = position.m2 / (n - 1).clamp(min=1)
    if variance.dim() == 2:
        return _regularised(0.5 * (variance + variance.T), n)
    gradient_variance = gradient.m2 / (n - 1).clamp(min=1)
    usable = (gradient_variance > 0) & torch.isfinite(gradient_variance)
    fisher = torch.sqrt(variance / torch.where(usable, gradient_variance, 1.0))
    return _regularised(torch.where(usable, fisher, variance), n)


class TrajectoryState(NamedTuple):
    """ChEES's trajectory length, 0-d tensors: the current ``log_length``, the average of
    its iterates ``log_length_average``, Adam's ``second_moment`` and ``steps`` taken."""

    log_length: torch.Tensor
    log_length_average: torch.Tensor
    second_moment: torch.Tensor
    steps: torch.Tensor


def chees_gradient(
    proposal: Proposal, accept: torch.Tensor, counted: torch.Tensor | None = None
) -> torch.Tensor:
    """The ChEES criterion's gradient with respect to ``log T`` (0-d), from every chain's
    trajectory (:class:`~hmc.kernels.base.Proposal`) and acceptance probability ``(C,)``,
    over the chains ``counted`` ``(C,)`` (all by default; the pooled warmup leaves out the
    stranded ones, whose distant starts would otherwise set the centre and the scale).

    Chain ``c`` ran for the time ``t_c = h T``, so ``d/dlog T = t_c d/dt``, and
    ``d/dt |x'(t) - mean'|^2 = 2 (x' - mean') . v'``: its term is
    ``t_c (|x' - mean'|^2 - |x - mean|^2) (x' - mean') . v'`` (the constant factor is
    immaterial to Adam), weighted by the acceptance probabilities, divided by the square of
    the chains' mean ``|x - mean|^2``: the criterion's scale falls by orders of magnitude
    while the chains converge, and Adam's running scale would lag behind it. Chains with a
    non-finite trajectory weigh nothing."""
    if counted is None:
        counted = torch.ones_like(accept, dtype=torch.bool)
    finite = torch.isfinite(proposal.end).all(1) & torch.isfinite(proposal.velocity).all(1)
    weight = torch.where(finite & counted, torch.nan_to_num(accept, nan=0.0), 0.0)
    total = weight.sum()
    if not total > 0:
        return accept.new_zeros(())
    end = torch.where(finite[:, None], proposal.end, 0.0)
    velocity = torch.where(finite[:, None], proposal.velocity, 0.0)
    end_centred = end - (weight[:, None] * end).sum(0) / total
    start = torch.where(counted[:, None], proposal.start, 0.0)
    start_centred = start - start.sum(0) / counted.sum()
    start_norm = (start_centred**2).sum(1)
    change = (end_centred**2).sum(1) - start_norm
    per_chain = proposal.time * change * (end_centred * velocity).sum(1)
    per_chain = torch.where((weight > 0) & torch.isfinite(per_chain), per_chain, 0.0)
    spread = (torch.where(counted, start_norm, 0.0).sum() / counted.sum()) ** 2  # |x|^4
    return (weight * per_chain).sum() / total / spread.clamp(min=torch.finfo(spread.dtype).tiny)


def adam_ascent(state: TrajectoryState, gradient: torch.Tensor) -> TrajectoryState:
    """One step of Adam without momentum up ``gradient`` in ``log T``: the gradient
    clipped to :data:`OUTLIER_RMS` times its running root mean square, the step to
    :data:`ADAM_CLIP` (no step for a gradient that is not finite)."""
    if not torch.isfinite(gradient):
        return state
    if state.steps > 0:  # an outlier (a trajectory thrown far by a too-large step size
        # while dual averaging explores) would freeze Adam's scale for hundreds of steps
        rms = torch.sqrt(state.second_moment / (1 - ADAM_BETA2**state.steps))
        gradient = gradient.clamp(-OUTLIER_RMS * rms, OUTLIER_RMS * rms)
    steps = state.steps + 1
    second = ADAM_BETA2 * state.second_moment + (1 - ADAM_BETA2) * gradient**2
    scale = torch.sqrt(second / (1 - ADAM_BETA2**steps)) + 1e-12
    move = (ADAM_RATE * gradient / scale).clamp(-ADAM_CLIP, ADAM_CLIP)
    log_length = state.log_length + move
    weight = steps ** (-TRAJECTORY_DECAY)
    average = (1 - weight) * state.log_length_average + weight * log_length
    return TrajectoryState(log_length, average, second, steps)


class EnsembleState(NamedTuple):
    """The pooled adaptation state.

    Attributes
    ----------
    dual_averaging : DualAveragingState
        One dual averaging, ``(1,)`` fields.
    accept : torch.Tensor
        ``(C,)`` each chain's acceptance statistic of its current iteration.
    position, gradient : PooledMoments
        Pooled moments of the current window.
    log_density : torch.Tensor
        ``(C, S)`` the chains' log densities since the last window end (or the start), at
        most the schedule's longest stretch between two metric updates, for the early
        stop and the stranded chains (in a chain-parallel run, every rank's chains).
    search_counter : torch.Tensor
        ``(C,)`` the counters of the step-size search's random streams.
    trajectory : TrajectoryState or None
        ChEES's trajectory length (None for other kernels).
    proposal : Proposal or None
        The chains' last trajectories (ChEES; None otherwise).
    restarted : torch.Tensor
        ``(C,)`` the chains restarted from another, at a window's end or the last
        warmup iteration (in a chain-parallel run, every rank's chains).
    inverse : torch.Tensor
        The last window's pooled inverse metric ``(D,)`` or ``(D, D)`` (the low-rank
        metric's matrix's diagonal ``(D,)``); empty ``(0,)`` before the first window ends.
    window : WindowDraws or None
        For the low-rank metric, every chain's draws and gradients of the current window
        (the stranded chains' slots not kept); None otherwise.
    """

    dual_averaging: DualAveragingState
    accept: torch.Tensor
    position: PooledMoments
    gradient: PooledMoments
    log_density: torch.Tensor
    search_counter: torch.Tensor
    trajectory: TrajectoryState | None
    proposal: Proposal | None
    restarted: torch.Tensor
    inverse: torch.Tensor
    window: WindowDraws | None = None


class Pooled(NamedTuple):
    """What :meth:`EnsembleWarmup.pool` returns: the adaptation state, the chains'
    parameters and states (the very object it was given unless chains restarted), and
    the warmup iteration every chain goes on with when the later windows are skipped
    (None otherwise)."""

    adaptation: EnsembleState
    params: Params
    state: State
    skip_to: int | None


@dataclass(frozen=True)
class EnsembleWarmup:
    """Warmup shared by all chains (see the module docstring).

    Parameters
    ----------
    schedule : the windows (:func:`ensemble_schedule`).
    search : the step-size heuristic, with the energy module bound.
    target_accept : dual averaging's target acceptance statistic.
    adapt_metric : whether the metric is estimated in the slow windows.
    dense : whether the estimate is the full covariance.
    low_rank : for the low-rank metric, its options: the window's draws and gradients of
        every chain not stranded make one :func:`hmc.adapt.low_rank.low_rank_metric`.
    trajectory : whether to learn ChEES's trajectory length.
    early_stop : whether a window whose chains agree ends the slow windows.
    restart_stranded : whether stranded chains restart from healthy ones at the end.
    max_steps : the longest trajectory ChEES learns, in steps of the step size.
    split : this process's block of a chain-parallel run's chains (None when it runs them
        all): every pooled quantity is taken over every rank's chains, gathered once per
        warmup iteration, and once more for the step-size search at a window's end.
    """

    schedule: WarmupSchedule
    search: StepSizeSearch
    target_accept: float = 0.8
    adapt_metric: bool = True
    dense: bool = False
    low_rank: LowRank | None = None
    trajectory: bool = False
    early_stop: bool = True
    restart_stranded: bool = True
    max_steps: int = 1024
    split: ChainSplit | None = None
    #: the driver runs warmup iterations in lockstep and calls :meth:`pool` after each
    lockstep = True

    def init(
        self, state: State, params: Params, keys: torch.Tensor
    ) -> tuple[EnsembleState, Params]:
        """Start from the initial states ``(C, D)`` (tensors): Stan's heuristic on every
        chain, one step size (their geometric mean), dual averaging shrinking towards ten
        times the initial step size, and for ChEES a trajectory of one step."""
        own = state.position.shape[0]
        counter = torch.zeros_like(keys)
        step_size, counter = self.search(state, params.step_size, params.metric, keys, counter)
        length = params.trajectory_length
        searched, initial, *lengths = self._gather_chains(
            step_size, params.step_size, *([] if length is None else [length])
        )
        common = searched.log().mean().exp().reshape(1)
        start = initial.log().mean().exp().reshape(1)
        da = dual_averaging_init(common, shrink_towards=start)
        trajectory = None
        if self.trajectory:
            log_length = common.log()[0] if length is None else lengths[0].log().mean()
            zero = log_length.new_zeros(())
            trajectory = TrajectoryState(log_length, log_length, zero, zero)
            length = log_length.exp().expand(own).clone()
        chains = searched.shape[0]
        adaptation = EnsembleState(
            da,
            state.potential.new_zeros(own),
            moments_init(state.position, self.dense),
            moments_init(state.position, False),
            state.potential.new_zeros((chains, 0)),
            counter,
            trajectory,
            None,
            torch.zeros(chains, dtype=torch.bool, device=keys.device),
            state.position.new_zeros(0),
        )
        if self.low_rank is not None and self.adapt_metric and self.schedule.adapts_metric:
            like = state.position.new_zeros((chains, state.position.shape[1]))
            window = window_init(like, window_length(self.schedule.windows))
            adaptation = adaptation._replace(window=window)
        return adaptation, Params(common.expand(own).clone(), params.metric, length)

    def update(
        self,
        adaptation: EnsembleState,
        params: Params,
        done: torch.Tensor,
        iteration: torch.Tensor,
        accept_stat: torch.Tensor,
        state: State,
        keys: torch.Tensor,
        window_ends: bool = True,
        proposal: Proposal | None = None,
    ) -> tuple[EnsembleState, Params]:
        """Keep the acceptance statistics ``(C,)`` (and trajectories) of the chains
        ``done`` ``(C,)``; the parameters change only in :meth:`pool`. The adaptation
        state is kept in tensors whatever the engine (NumPy arrays are viewed as such)."""
        adaptation, done, accept_stat = map(as_tensors, (adaptation, done, accept_stat))
        accept = torch.where(done, accept_stat.to(adaptation.accept), adaptation.accept)
        if proposal is not None:
            proposal = as_tensors(proposal)
        return adaptation._replace(accept=accept, proposal=proposal), params

    def final(self, adaptation: EnsembleState, params: Params, leaving: torch.Tensor) -> Params:
        """The parameters as they are: the last :meth:`pool` sets the sampling ones."""
        return params

    def pool(
        self,
        adaptation: EnsembleState,
        params: Params,
        state: State,
        iteration: int,
        keys: torch.Tensor,
    ) -> Pooled:
        """Adapt after every chain finished warmup iteration ``iteration`` (0-based), at
        ``state`` (``keys`` ``(C,)`` the chains' keys, for the step-size search; ``state``
        tensors, or NumPy arrays for the NumPy engine: they are viewed as
        tensors; the returned state is of the same kind)."""
        on_numpy = isinstance(state.position, np.ndarray)
        own_state, adaptation = as_tensors(state), as_tensors(adaptation)
        own = own_state.position.shape[0]  # this process's chains; `chains` all of them
        proposal = adaptation.proposal
        position, potential, grad, accept, *trajectories = self._gather_chains(
            *own_state, adaptation.accept, *(() if proposal is None else proposal)
        )
        tensors = State(position, potential, grad)
        proposal = None if proposal is None else Proposal(*trajectories)
        schedule = self.schedule
        # chains stranded far below the others now (a start where the shared step size
        # cannot move them) would drag the step size down and, with gradients many orders
        # larger than the others', shrink the metric: they are left out until they join
        chains = tensors.position.shape[0]
        healthy = ~stranded_chains(-tensors.potential[:, None])
        healthy_count = healthy.sum().clamp(min=1)
        accept = torch.nan_to_num(accept, nan=0.0).clamp(0.0, 1.0)
        accept = torch.where(healthy, accept, 0.0)
        if self.trajectory:  # ChEES: the harmonic mean of the chains that may move, times
            # their share (a divergence, acceptance 0, pulls the step size down but does
            # not wipe out the mean)
            moved = accept > 0
            count = moved.sum()
            harmonic = count / torch.where(moved, 1.0 / accept.clamp(min=1e-300), 0.0).sum()
            pooled_accept = torch.where(count > 0, harmonic * count / healthy_count, 0.0)
        else:
            pooled_accept = accept.sum() / healthy_count
        da = dual_averaging_update(
            adaptation.dual_averaging, pooled_accept.reshape(1), target=self.target_accept
        )
        step_size = da.log_step_size.exp()
        earlier = adaptation.log_density
        keep = min(earlier.shape[1], _segment_length(schedule) - 1)  # the last ones
        log_density = torch.cat(
            (earlier[:, earlier.shape[1] - keep :], -tensors.potential[:, None]), 1
        )
        adaptation = adaptation._replace(dual_averaging=da, log_density=log_density)
        trajectory = adaptation.trajectory
        if trajectory is not None and proposal is not None:
            gradient = chees_gradient(proposal, accept, healthy)
            trajectory = adam_ascent(trajectory, gradient)
        metric, skip_to, changed = params.metric, None, False
        windows = schedule.windows if self.adapt_metric else []
        current = [first for first, last in windows if first <= iteration <= last]
        in_window = bool(current)
        if in_window and adaptation.window is not None:
            slots = torch.full_like(healthy, iteration - current[0], dtype=torch.int64)
            window_add(adaptation.window, tensors.position, tensors.grad, healthy, slots)
        if in_window:
            adaptation = adaptation._replace(
                position=moments_add(adaptation.position, tensors.position[healthy]),
                gradient=moments_add(adaptation.gradient, -tensors.grad[healthy]),
            )
        ends_window = in_window and schedule.ends_window(iteration)
        final = iteration == schedule.num_warmup - 1
        stranded = stranded_chains(log_density) if ends_window or final else None
        if self.restart_stranded and chains > 1 and stranded is not None and stranded.any():
            # at a window's end, so that a restarted chain has the later iterations to part
            # from the one it restarted from before any draw is kept
            restarted_state = restart_stranded(tensors, stranded)
            if restarted_state is not tensors:
                changed, tensors = bool(self._own_rows(stranded).any()), restarted_state
                adaptation = adaptation._replace(restarted=adaptation.restarted | stranded)
        own_state = State(*map(self._own_rows, tensors)) if changed else own_state
        if ends_window:
            metric, inverse = self._window_metric(adaptation, own, params.metric[0].dtype)
            searched, counter = self.search(
                own_state, step_size.expand(own).clone(), metric, keys, adaptation.search_counter
            )
            common = self._gather_chains(searched)[0].log().mean().exp().reshape(1)
            da = dual_averaging_init(common)
            step_size = common
            last = iteration == windows[-1][1]
            joined = log_density[~stranded]  # the stranded ones restart
            if self.early_stop and not last and settled(joined, inverse, adaptation.inverse):
                skip_to = windows[-1][1] + 1
            adaptation = adaptation._replace(
                dual_averaging=da,
                position=moments_init(tensors.position, self.dense),
                gradient=moments_init(tensors.position, False),
                log_density=log_density[:, :0],
                search_counter=counter,
                inverse=inverse,
            )
        if final:
            step_size = dual_averaging_final(adaptation.dual_averaging)
            if self.split is not None:  # the ranks meet no more: each stops on its own
                self.split.vote.adjourn()
            if trajectory is not None:
                trajectory = trajectory._replace(log_length=trajectory.log_length_average)
        length = params.trajectory_length
        if trajectory is not None:  # at most max_steps steps; and at a window's end (a
            # new metric and step size) and at the last iteration at least one step: one
            # learnt under the first metric's step size would otherwise stay below one
            # step long after the step size grew (dual averaging's exploring iterates are
            # no floor: its first ones are ten times too large)
            log_step = step_size.log()[0]
            low = log_step if ends_window or final else -torch.inf
            high = log_step + math.log(self.max_steps)
            trajectory = trajectory._replace(
                log_length=trajectory.log_length.clamp(low, high),
                log_length_average=trajectory.log_length_average.clamp(low, high),
            )
            length = trajectory.log_length.exp().expand(own).clone()
        adaptation = adaptation._replace(trajectory=trajectory, proposal=None)
        new_params = Params(step_size.expand(own).clone(), metric, length)
        if on_numpy:
            new_params = new_params._replace(step_size=new_params.step_size.numpy())
            if length is not None:
                new_params = new_params._replace(trajectory_length=length.numpy())
        if changed:
            state = State(*(x.numpy() for x in own_state)) if on_numpy else own_state
        return Pooled(adaptation, new_params, state, skip_to)

    def _window_metric(
        self, adaptation: EnsembleState, own: int, dtype: torch.dtype
    ) -> tuple[Metric, torch.Tensor]:
        """The metric of the window that ends, for ``own`` chains in ``dtype``, and its
        inverse metric ``(D,)`` or ``(D, D)`` (the low-rank one's diagonal): from the
        pooled moments, or for the low-rank metric from the window's draws, whose buffer
        then starts the next window empty."""
        window = adaptation.window
        if window is None:
            inverse = pooled_inverse_metric(adaptation.position, adaptation.gradient)
            return metric_from_inverse(inverse[None].expand(own, *inverse.shape).clone()), inverse
        dim = window.position.shape[-1]
        pooled = (window.position, window.gradient, window.kept)
        estimate = low_rank_metric(*(x.reshape(1, -1, *x.shape[2:]) for x in pooled), self.low_rank)
        window.kept.fill_(False)
        metric = LowRankMetric(*(x.to(dtype).expand(own, *x.shape[1:]).clone() for x in estimate))
        return metric, inverse_diagonal(estimate)[0].to(dtype).reshape(dim)

    def _gather_chains(self, *rows: torch.Tensor) -> list[torch.Tensor]:
        """Every chain's ``rows`` (each ``(C, ...)``, the chains of this process; floating
        point), gathered from the ranks of a chain-parallel run in one collective (the
        very tensors in one process)."""
        if self.split is None:
            return list(rows)
        flat = [x.reshape(x.shape[0], -1).to(rows[0].dtype) for x in rows]
        widths = [x.shape[1] for x in flat]
        gathered = self.split.gather(torch.cat(flat, 1)).split(widths, 1)
        pairs = zip(gathered, rows, strict=True)
        return [g.reshape(-1, *x.shape[1:]).to(x.dtype) for g, x in pairs]

    def _own_rows(self, all_chains: torch.Tensor) -> torch.Tensor:
        """This process's rows of ``all_chains`` ``(chains, ...)``."""
        return all_chains if self.split is None else self.split.own_rows(all_chains)


def settled(log_density: torch.Tensor, inverse: torch.Tensor, previous: torch.Tensor) -> bool:
    """Whether warmup has settled at a window's end: the pooled inverse metric ``inverse``
    is within a factor :data:`EARLY_STOP_METRIC_CHANGE` of the ``previous`` window's in
    every coordinate (its diagonal when dense; never after the first window, ``previous``
    empty), and the chains' log densities over the window ``(C, N)`` have a bulk ESS above
    :data:`EARLY_STOP_ESS` and no trend: the means of the window's two halves differ by
    less than :data:`EARLY_STOP_TREND` standard errors."""
    if previous.numel() == 0:
        return False
    new, old = (x.diagonal() if x.dim() == 2 else x for x in (inverse, previous))
    if not bool((new / old).log().abs().max() < math.log(EARLY_STOP_METRIC_CHANGE)):
        return False
    values = log_density.numpy(force=True)
    half = values.shape[1] // 2
    if values.shape[0] < 2 or half < 2 or not np.isfinite(values).all():
        return False
    if not ess(values, method="bulk") > EARLY_STOP_ESS:
        return False
    halves = values[:, :half], values[:, half : 2 * half]
    ess_half = [ess(x, method="mean") for x in halves]
    errors = [x.std() / math.sqrt(max(e, 1.0)) for x, e in zip(halves, ess_half, strict=True)]
    difference = abs(halves[1].mean() - halves[0].mean())
    return bool(difference < EARLY_STOP_TREND * math.hypot(*errors))


def _segment_length(schedule: WarmupSchedule) -> int:
    """The most iterations of log densities the pooled warmup keeps: the longest slow
    window or terminal buffer (20 % of the warmup when no metric is adapted)."""
    if not schedule.windows:
        return max(1, math.ceil(0.2 * schedule.num_warmup))
    terminal = schedule.num_warmup - 1 - schedule.windows[-1][1]
    return max(terminal, *(last - first + 1 for first, last in schedule.windows))
