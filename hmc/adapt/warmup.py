"""Stan's warmup for many chains at once, each on its own schedule, as an adapter.

:class:`StanWarmup` holds the settings (the schedule, dual averaging's target, whether
the metric adapts, the step-size heuristic) and three calls over an explicit
:class:`WarmupState`: ``init`` from the initial states, ``update`` after warmup
transitions, ``final`` when chains leave warmup. The driver calls them; nothing else
reads or changes the adaptation.

After every warmup transition of chain ``c`` (its own iteration ``t_c``):

1. dual averaging learns from the transition's acceptance statistic;
2. inside a slow window, the new position joins the chain's (co)variance estimate;
3. at a window end, the chain's inverse metric becomes the regularised estimate, the
   step-size heuristic runs from the current position, and dual averaging restarts around
   the step size it finds;
4. after the last warmup iteration (:meth:`StanWarmup.final`) the step size becomes
   ``exp(x_bar)``.

Every chain has the same windows, so at each slow window's end the driver has the chains
wait for each other (:meth:`StanWarmup.restart_stops`), and :meth:`StanWarmup.restart`
restarts the chains whose mean log density over the window is stranded far below the
others' (the pooled warmup's criterion, :func:`hmc.adapt.stranded.stranded_from_moments`:
a start where the step size a chain adapts to cannot move it) from healthy chains' states,
step sizes, metrics and dual averaging, so that the rest of warmup goes on from there and
parts them. Stan has no such restart. When no chain is stranded, a stop changes only
which chains' energies are evaluated together in the next calls: where a row's log
density does not depend on the rows evaluated with it, the draws are bit for bit those of
a run without the stops; where it does in its last bits (a vmapped ``log_prob``, a batched
matrix product), the chains go on from the same states but part from such a run as after
any change of rounding (as at a checkpoint or a store's chunk end). In a chain-parallel
run each process restarts among its own chains.

Before the first window ends, dual averaging shrinks towards ten times the initial step
size (Stan sets ``mu`` from its ``stepsize`` argument before the heuristic runs).

Because every step takes a mask of the chains that just finished a transition, chains can
be at different iterations (as they are under asynchronous NUTS).

The arrays are those of the run's engine (:mod:`hmc.arrays`), and dual averaging and the
variance estimates always compute in it, so a chain's step size does not depend on which
other chains finish a transition with it (NumPy's and torch's powers differ in their last
bits). The rare work at a window end (the metric, the heuristic) runs on tensors (a NumPy
engine's arrays are viewed as tensors there, without copies). The step-size heuristic is
passed in (``search``), so this package runs no leapfrog step and knows nothing of kernels
or the energy module.
"""

from __future__ import annotations

from collections.abc import Callable
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
from hmc.adapt.schedule import WarmupSchedule
from hmc.adapt.step_size import (
    DualAveragingState,
    dual_averaging_final,
    dual_averaging_init,
    dual_averaging_update,
)
from hmc.adapt.stranded import restart_sources, stranded_from_moments
from hmc.adapt.welford import WelfordState, welford_covariance, welford_init, welford_update
from hmc.arrays import as_arrays, as_tensors, map_record, namespace
from hmc.metric import Metric, metric_from_inverse
from hmc.state import Params, Proposal, State, put_rows, take_rows, where_rows

__all__ = ["StanWarmup", "StepSizeSearch", "WarmupState"]

#: ``search(state, step_size, metric, keys, counter) -> (step_size, counter)``: Stan's
#: step-size heuristic for the chains of ``state`` (``(C,)`` tensors; ``counter`` numbers
#: each chain's draws of its search stream), see :mod:`hmc.step_size_search`
type StepSizeSearch = Callable[
    [State, torch.Tensor, Metric, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]
]


class WarmupState(NamedTuple):
    """Per-chain adaptation state: dual averaging, (co)variance estimate (for the low-rank
    metric a diagonal one, whose count numbers the window's draws), the counters of the
    step-size search's random stream ``(C,)``, the moments of each chain's log density
    over its current slow window (a :class:`WelfordState` of ``(C, 1)`` values, for
    :meth:`StanWarmup.restart`), the chains restarted from another ``(C,)``, and for the
    low-rank metric each chain's draws and gradients of its current window (None
    otherwise)."""

    dual_averaging: DualAveragingState
    welford: WelfordState
    search_counter: torch.Tensor
    log_density: WelfordState
    restarted: torch.Tensor
    window: WindowDraws | None = None


@dataclass(frozen=True)
class StanWarmup:
    """Stan's windowed adaptation of the step size and the (diagonal or dense) metric.

    Parameters
    ----------
    schedule : the windows (:func:`hmc.adapt.build_schedule`), masks in the run's arrays.
    search : the step-size heuristic, with the energy module bound.
    target_accept : dual averaging's target acceptance statistic.
    adapt_metric : whether the metric is estimated in the slow windows.
    dense : whether the estimate is a full covariance.
    low_rank : for the low-rank metric, its options: each chain's window keeps its draws
        and gradients, and at the window's end its metric becomes
        :func:`hmc.adapt.low_rank.low_rank_metric` of them.
    """

    schedule: WarmupSchedule
    search: StepSizeSearch
    target_accept: float = 0.8
    adapt_metric: bool = True
    dense: bool = False
    low_rank: LowRank | None = None
    #: each chain adapts on its own: the driver waits for the others only at
    #: :meth:`restart_stops`
    lockstep = False

    def init(self, state: State, params: Params, keys: torch.Tensor) -> tuple[WarmupState, Params]:
        """Run the step-size heuristic from the initial states ``(C, D)`` (tensors) and
        start dual averaging.

        As in Stan's services (``mu`` is set from the ``stepsize`` argument before
        ``init_stepsize`` runs), the first dual averaging shrinks towards ``log(10 eps)``
        of the initial step size ``params.step_size``, not of the heuristic's result;
        after each metric update it shrinks towards the heuristic's result.
        """
        counter = torch.zeros_like(keys)
        step_size, counter = self.search(state, params.step_size, params.metric, keys, counter)
        da = dual_averaging_init(step_size, shrink_towards=params.step_size)
        window = None
        if self.low_rank is not None and self.adapt_metric and self.schedule.adapts_metric:
            window = window_init(state.position, window_length(self.schedule.windows))
        adaptation = WarmupState(
            da,
            welford_init(state.position, self.dense),
            counter,
            welford_init(state.potential[:, None], False),
            torch.zeros_like(keys, dtype=torch.bool),
            window,
        )
        return adaptation, Params(step_size, params.metric)

    def update(
        self,
        adaptation: WarmupState,
        params: Params,
        done: torch.Tensor,
        iteration: torch.Tensor,
        accept_stat: torch.Tensor,
        state: State,
        keys: torch.Tensor,
        window_ends: bool = True,
        proposal: Proposal | None = None,
    ) -> tuple[WarmupState, Params]:
        """Adapt the chains in ``done`` ``(C,)`` after their warmup iteration
        ``iteration`` ``(C,)``: ``accept_stat`` ``(C,)`` and ``state`` are the finished
        transitions' statistic and new states (arrays of the run's engine; the metric is
        tensors whatever the engine).

        ``window_ends=False`` says, from the caller's host counters, that no chain in
        ``done`` ends a slow window: the metric update (which must find those chains, a
        device read) is then skipped. ``proposal`` (the trajectories, for adapters that
        pool them) is not used. Returns the new adaptation state and parameters.
        """
        schedule = self.schedule
        xp = namespace(done)
        t = iteration.clip(0, schedule.num_warmup - 1)
        da = dual_averaging_update(
            adaptation.dual_averaging, accept_stat, done, target=self.target_accept
        )
        step_size = xp.where(done, xp.exp(da.log_step_size), params.step_size)
        adaptation = adaptation._replace(dual_averaging=da)
        if not (self.adapt_metric and schedule.adapts_metric):
            return adaptation, Params(step_size, params.metric)
        in_window = schedule.in_window[t] & done
        welford = adaptation.welford
        if adaptation.window is not None:  # the draw's slot: its number in the window
            slots = welford.count.astype(np.int64) if xp is np else welford.count.long()
            slots = slots.clip(0, adaptation.window.kept.shape[1] - 1)
            window_add(adaptation.window, state.position, state.grad, in_window, slots)
        adaptation = adaptation._replace(
            welford=welford_update(welford, state.position, in_window),
            log_density=welford_update(
                adaptation.log_density, -state.potential[:, None], in_window
            ),
        )
        if not window_ends:
            return adaptation, Params(step_size, params.metric)
        ending = schedule.window_end[t] & done
        ends = np.flatnonzero(ending) if xp is np else ending.nonzero().flatten()
        if len(ends) == 0:
            return adaptation, Params(step_size, params.metric)
        if xp is np:  # rare: on tensor views of the arrays, then back
            adaptation, step_size, metric = self._end_windows(
                torch.from_numpy(ends), as_tensors(adaptation), params.metric,
                torch.from_numpy(step_size), as_tensors(state), keys,
            )  # fmt: skip
            return as_arrays(adaptation), Params(step_size.numpy(), metric)
        adaptation, step_size, metric = self._end_windows(
            ends, adaptation, params.metric, step_size, state, keys
        )
        return adaptation, Params(step_size, metric)

    def _end_windows(
        self,
        ends: torch.Tensor,
        adaptation: WarmupState,
        metric: Metric,
        step_size: torch.Tensor,
        state: State,
        keys: torch.Tensor,
    ) -> tuple[WarmupState, torch.Tensor, Metric]:
        """The chains ``ends`` (indices) end a slow window: their inverse metric becomes the
        window's regularised estimate, a new window starts, the step-size heuristic runs
        from their positions and dual averaging restarts around what it finds. Tensors;
        returns the adaptation, the step sizes ``(C,)`` and the metric."""
        welford, counter = adaptation.welford, adaptation.search_counter
        window = adaptation.window
        if window is not None:
            estimate = low_rank_metric(*take_rows(window, ends), self.low_rank)
            metric = put_rows(metric, ends, map_record(lambda x: x.to(metric[0].dtype), estimate))
            window.kept.index_fill_(0, ends, False)  # in place: a NumPy engine's array too
        else:
            estimate = welford_covariance(take_rows(welford, ends))
            metric = metric_from_inverse(metric.inverse.index_copy(0, ends, estimate))
        cleared = welford_init(state.position, welford.m2.dim() == 3)
        welford = WelfordState(
            *(
                x.index_copy(0, ends, y.index_select(0, ends))
                for x, y in zip(welford, cleared, strict=True)
            )
        )
        new_eps, new_counter = self.search(
            take_rows(state, ends),
            step_size.index_select(0, ends),
            take_rows(metric, ends),
            keys.index_select(0, ends),
            counter.index_select(0, ends),
        )
        step_size = step_size.index_copy(0, ends, new_eps)
        counter = counter.index_copy(0, ends, new_counter)
        is_end = torch.zeros_like(step_size, dtype=torch.bool).index_fill(0, ends, True)
        da = where_rows(is_end, dual_averaging_init(step_size), adaptation.dual_averaging)
        adaptation = adaptation._replace(
            dual_averaging=da, welford=welford, search_counter=counter, window=window
        )
        return adaptation, step_size, metric

    def restart_stops(self) -> list[int]:
        """The iteration counts at which every chain waits for the others so that
        :meth:`restart` can run: the end of each slow window (none when nothing is
        adapted)."""
        if not self.adapt_metric:
            return []
        return [last + 1 for _, last in self.schedule.windows]

    def restart(
        self, adaptation: WarmupState, params: Params, state: State
    ) -> tuple[WarmupState, Params, State]:
        """At a slow window's end, which every chain has just passed (their states
        ``state``, arrays of the run's engine): the chains whose log density over the
        window is stranded far below the others' take a healthy chain's state, step size,
        metric, dual averaging and (co)variance estimate; each keeps its own random
        streams. The window's log-density moments start afresh. Returns the adaptation,
        the parameters and the states: ``state`` itself when no chain restarts."""
        on_numpy = isinstance(state.position, np.ndarray)
        tensors = as_tensors(adaptation)
        moments = tensors.log_density
        spread = (moments.m2[:, 0] / (moments.count - 1)).sqrt()
        stranded = stranded_from_moments(moments.mean[:, 0], spread)
        cleared = welford_init(moments.mean, False)
        sources = restart_sources(stranded)
        if sources is None:
            tensors = tensors._replace(log_density=cleared)
            return (as_arrays(tensors) if on_numpy else tensors), params, state
        tensors = tensors._replace(
            dual_averaging=take_rows(tensors.dual_averaging, sources),
            welford=take_rows(tensors.welford, sources),
            log_density=cleared,
            restarted=tensors.restarted | stranded,
            window=None if tensors.window is None else take_rows(tensors.window, sources),
        )
        step_size = torch.as_tensor(params.step_size).index_select(0, sources)
        params = params._replace(step_size=step_size, metric=take_rows(params.metric, sources))
        state = take_rows(as_tensors(state), sources)
        if on_numpy:
            params = params._replace(step_size=step_size.numpy())
            return as_arrays(tensors), params, as_arrays(state)
        return tensors, params, state

    def final(self, adaptation: WarmupState, params: Params, leaving: torch.Tensor) -> Params:
        """The parameters for sampling of the chains ``leaving`` warmup ``(C,)``: their
        step size becomes dual averaging's ``exp(x_bar)``; other chains keep theirs."""
        xp = namespace(leaving)
        step_size = dual_averaging_final(adaptation.dual_averaging)
        return Params(xp.where(leaving, step_size, params.step_size), params.metric)
