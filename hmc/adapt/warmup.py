"""Stan's warmup for many chains at once, each on its own schedule.

After every warmup transition of chain ``c`` (its own iteration ``t_c``):

1. dual averaging learns from the transition's acceptance statistic;
2. inside a slow window, the new position joins the chain's (co)variance estimate;
3. at a window end, the chain's inverse metric becomes the regularised estimate, the
   step-size heuristic runs from the current position, and dual averaging restarts around
   the step size it finds;
4. after the last warmup iteration the step size becomes ``exp(x_bar)``.

Before the first window ends, dual averaging shrinks towards ten times the initial step
size (Stan sets ``mu`` from its ``stepsize`` argument before the heuristic runs).

Because every step takes a mask of the chains that just finished a transition, chains can
be at different iterations (as they are under asynchronous NUTS).

``warmup_update`` also runs on NumPy arrays (state, mask, statistics, step sizes and the
schedule's masks) when no chain ends a window: the driver's host loop for CPU kernels
keeps its adaptation state in NumPy, where a handful of updates per transition cost far
less than as tensor operations, and passes tensors sharing that memory at a window end.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from hmc.adapt.schedule import WarmupSchedule
from hmc.adapt.step_size import (
    DualAveragingState,
    dual_averaging_final,
    dual_averaging_init,
    dual_averaging_update,
    find_reasonable_step_size,
)
from hmc.adapt.welford import WelfordState, welford_covariance, welford_init, welford_update
from hmc.arrays import namespace
from hmc.kernels.base import Params
from hmc.metric import metric_from_inverse
from hmc.potential import Potential
from hmc.state import State, take_rows, where_rows

__all__ = ["WarmupState", "warmup_init", "warmup_update"]


class WarmupState(NamedTuple):
    """Per-chain adaptation state: dual averaging, (co)variance estimate, and the
    counters of the step-size search's random stream ``(C,)``."""

    dual_averaging: DualAveragingState
    welford: WelfordState
    search_counter: torch.Tensor


def warmup_init(
    state: State, params: Params, potential: Potential, keys: torch.Tensor, dense: bool
) -> tuple[WarmupState, Params]:
    """Run the step-size heuristic from the initial states and start dual averaging.

    As in Stan's services (``mu`` is set from the ``stepsize`` argument before
    ``init_stepsize`` runs), the first dual averaging shrinks towards ``log(10 eps)`` of
    the initial step size ``params.step_size``, not of the heuristic's result; after each
    metric update it shrinks towards the heuristic's result.
    """
    counter = torch.zeros_like(keys)
    step_size, counter = find_reasonable_step_size(
        state, params.step_size, params.metric, potential, keys, counter
    )
    da = dual_averaging_init(step_size, shrink_towards=params.step_size)
    warm = WarmupState(da, welford_init(state.position, dense), counter)
    return warm, Params(step_size, params.metric)


def warmup_update(
    warm: WarmupState,
    params: Params,
    schedule: WarmupSchedule,
    done: torch.Tensor,
    iteration: torch.Tensor,
    accept_stat: torch.Tensor,
    state: State,
    potential: Potential,
    keys: torch.Tensor,
    target_accept: float,
    adapt_metric: bool,
    window_ends: bool = True,
) -> tuple[WarmupState, Params]:
    """Adapt the chains in ``done`` ``(C,)`` after their warmup iteration ``iteration`` ``(C,)``.

    ``window_ends=False`` says, from the caller's host counters, that no chain in ``done``
    ends a slow window: the metric update (which must find those chains, a device read)
    is then skipped. Only then may the arrays be NumPy arrays (the metric stays tensors).

    ``accept_stat`` ``(C,)`` and ``state`` are the finished transitions' statistic and new
    states. Returns the new adaptation state and kernel parameters.
    """
    xp = namespace(done)
    last = schedule.num_warmup - 1
    t = iteration.clip(0, last)
    da = dual_averaging_update(warm.dual_averaging, accept_stat, done, target=target_accept)
    step_size = xp.where(done, xp.exp(da.log_step_size), params.step_size)
    metric, welford, search = params.metric, warm.welford, warm.search_counter
    if adapt_metric and schedule.adapts_metric:
        in_window = schedule.in_window[t] & done
        welford = welford_update(welford, state.position, in_window)
        ends = (schedule.window_end[t] & done).nonzero().flatten() if window_ends else t[:0]
        if len(ends) > 0:
            welford_ends = take_rows(welford, ends)
            inverse = params.metric.inverse.index_copy(0, ends, welford_covariance(welford_ends))
            metric = metric_from_inverse(inverse)
            cleared = welford_init(state.position, welford.m2.dim() == 3)
            welford = WelfordState(
                *(
                    x.index_copy(0, ends, y.index_select(0, ends))
                    for x, y in zip(welford, cleared, strict=True)
                )
            )
            new_eps, new_counter = find_reasonable_step_size(
                take_rows(state, ends),
                step_size.index_select(0, ends),
                take_rows(metric, ends),
                potential,
                keys.index_select(0, ends),
                search.index_select(0, ends),
            )
            step_size = step_size.index_copy(0, ends, new_eps)
            search = search.index_copy(0, ends, new_counter)
            restarted = dual_averaging_init(step_size)
            is_end = torch.zeros_like(done).index_fill(0, ends, True)
            da = where_rows(is_end, restarted, da)
    finishing = done & (iteration == last)
    step_size = xp.where(finishing, dual_averaging_final(da), step_size)
    return WarmupState(da, welford, search), Params(step_size, metric)
