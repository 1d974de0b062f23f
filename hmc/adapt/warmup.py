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

The arrays are those of the run's engine (:mod:`hmc.arrays`). The rare update at a
window end runs on tensors (a NumPy engine's arrays are viewed as tensors there, without
copies). The step-size heuristic is passed in (``search``), so this package runs no
leapfrog step and knows nothing of kernels or the energy module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from hmc.adapt.schedule import WarmupSchedule
from hmc.adapt.step_size import (
    DualAveragingState,
    dual_averaging_final,
    dual_averaging_init,
    dual_averaging_update,
)
from hmc.adapt.welford import WelfordState, welford_covariance, welford_init, welford_update
from hmc.arrays import as_arrays, as_tensors, namespace
from hmc.metric import Metric, metric_from_inverse
from hmc.state import Params, State, take_rows, where_rows

__all__ = ["StepSizeSearch", "WarmupState", "warmup_init", "warmup_update"]

#: ``search(state, step_size, metric, keys, counter) -> (step_size, counter)``: Stan's
#: step-size heuristic for the chains of ``state`` (``(C,)`` tensors; ``counter`` numbers
#: each chain's draws of its search stream), see :mod:`hmc.step_size_search`
type StepSizeSearch = Callable[
    [State, torch.Tensor, Metric, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]
]


class WarmupState(NamedTuple):
    """Per-chain adaptation state: dual averaging, (co)variance estimate, and the
    counters of the step-size search's random stream ``(C,)``."""

    dual_averaging: DualAveragingState
    welford: WelfordState
    search_counter: torch.Tensor


def warmup_init(
    state: State, params: Params, search: StepSizeSearch, keys: torch.Tensor, dense: bool
) -> tuple[WarmupState, Params]:
    """Run the step-size heuristic from the initial states and start dual averaging.

    As in Stan's services (``mu`` is set from the ``stepsize`` argument before
    ``init_stepsize`` runs), the first dual averaging shrinks towards ``log(10 eps)`` of
    the initial step size ``params.step_size``, not of the heuristic's result; after each
    metric update it shrinks towards the heuristic's result.
    """
    counter = torch.zeros_like(keys)
    step_size, counter = search(state, params.step_size, params.metric, keys, counter)
    da = dual_averaging_init(step_size, shrink_towards=params.step_size)
    adaptation = WarmupState(da, welford_init(state.position, dense), counter)
    return adaptation, Params(step_size, params.metric)


def warmup_update(
    adaptation: WarmupState,
    params: Params,
    schedule: WarmupSchedule,
    done: torch.Tensor,
    iteration: torch.Tensor,
    accept_stat: torch.Tensor,
    state: State,
    search: StepSizeSearch,
    keys: torch.Tensor,
    target_accept: float,
    adapt_metric: bool,
    window_ends: bool = True,
) -> tuple[WarmupState, Params]:
    """Adapt the chains in ``done`` ``(C,)`` after their warmup iteration ``iteration`` ``(C,)``.

    ``window_ends=False`` says, from the caller's host counters, that no chain in ``done``
    ends a slow window: the metric update (which must find those chains, a device read)
    is then skipped. The metric is tensors whatever the engine.

    ``accept_stat`` ``(C,)`` and ``state`` are the finished transitions' statistic and new
    states. Returns the new adaptation state and kernel parameters.
    """
    if isinstance(done, np.ndarray) and window_ends:  # rare: run it on tensor views
        adaptation, params = warmup_update(
            *map(as_tensors, (adaptation, params, schedule, done, iteration, accept_stat, state)),
            search,
            keys,
            target_accept,
            adapt_metric,
            window_ends,
        )
        return as_arrays(adaptation), Params(params.step_size.numpy(), params.metric)
    xp = namespace(done)
    last = schedule.num_warmup - 1
    t = iteration.clip(0, last)
    da = dual_averaging_update(adaptation.dual_averaging, accept_stat, done, target=target_accept)
    step_size = xp.where(done, xp.exp(da.log_step_size), params.step_size)
    metric, welford, counter = params.metric, adaptation.welford, adaptation.search_counter
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
            new_eps, new_counter = search(
                take_rows(state, ends),
                step_size.index_select(0, ends),
                take_rows(metric, ends),
                keys.index_select(0, ends),
                counter.index_select(0, ends),
            )
            step_size = step_size.index_copy(0, ends, new_eps)
            counter = counter.index_copy(0, ends, new_counter)
            restarted = dual_averaging_init(step_size)
            is_end = torch.zeros_like(done).index_fill(0, ends, True)
            da = where_rows(is_end, restarted, da)
    finishing = done & (iteration == last)
    step_size = xp.where(finishing, dual_averaging_final(da), step_size)
    return WarmupState(da, welford, counter), Params(step_size, metric)
