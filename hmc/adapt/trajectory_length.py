"""MAMS's trajectory length in warmup: the stages of BlackJAX's adjusted MCLMC tuning on
the package's windows.

:class:`StanLengthWarmup` and :class:`EnsembleLengthWarmup` wrap Stan's per-chain warmup
(:class:`hmc.adapt.StanWarmup`) and the pooled one (:class:`hmc.adapt.EnsembleWarmup`):
those adapt the step size by dual averaging (to MAMS's target acceptance) and the
diagonal or dense metric in their windows, as for the other kernels; the wrappers set
the trajectory length ``L`` (:class:`~hmc.state.Params` ``trajectory_length``) of each
chain after every warmup iteration ``t``:

1. until the first slow window ends, ``L`` is :data:`INITIAL_STEPS` steps of the current
   step size (BlackJAX's first stage keeps ``L / eps`` fixed while the step size moves);
2. at a window end, when the new metric whitens the target, ``L = sqrt(D)``, the
   radius of a standard Gaussian (BlackJAX's ``L`` after diagonal preconditioning),
   except where a stage ends there;
3. over the *stage*, ``L`` is held and each chain records its positions (at most
   :data:`MAX_COORDINATES` coordinates, evenly spaced); at the stage's end the
   integrated autocorrelation time ``tau = N / ESS`` of those draws (the mean of the
   coordinates' ESS, :func:`hmc.diagnostics.ess`) sets ``L = LENGTH_FACTOR * L * tau``,
   at most :data:`MAX_GROWTH` times the old ``L``: the time over which a chain
   decorrelates, as BlackJAX's third stage sets it.

The stage is the last :data:`MAX_STAGE` iterations of the last slow window for Stan's
warmup (each chain from its own draws). The pooled warmup has several, each pooling the
ESS over all chains: every slow window after the first (so that the length grows, at most
doubling each time, through as many windows as the chains need to settle) and the first
half of the terminal buffer (which runs even when the pooled warmup stops its windows
early); ``L`` is then set to ``sqrt(D)`` at the first window's end only. After the last
stage only the step size moves (dual averaging's terminal buffer). Without slow windows
(a warmup under 20 iterations) there is no stage, and ``L`` stays at
:data:`INITIAL_STEPS` steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from hmc.adapt.ensemble import EnsembleState, EnsembleWarmup, Pooled
from hmc.adapt.schedule import WarmupSchedule
from hmc.adapt.warmup import StanWarmup, WarmupState
from hmc.arrays import namespace
from hmc.diagnostics import MIN_DRAWS, ess
from hmc.state import Params, Proposal, State

__all__ = [
    "INITIAL_STEPS",
    "LENGTH_FACTOR",
    "MAX_COORDINATES",
    "MAX_GROWTH",
    "MAX_STAGE",
    "EnsembleLengthState",
    "EnsembleLengthWarmup",
    "StanLengthState",
    "StanLengthWarmup",
    "autocorrelation_length",
    "traced_coordinates",
]

#: steps per trajectory before the first metric (BlackJAX: L = sqrt(D), eps = 0.2 sqrt(D))
INITIAL_STEPS = 5.0
#: the new length over the old times the autocorrelation time (BlackJAX's third stage)
LENGTH_FACTOR = 0.5
#: ... and the most the length may grow at the stage
MAX_GROWTH = 2.0
#: the most coordinates each chain records over the stage
MAX_COORDINATES = 64
#: the most iterations of Stan's last slow window that make the stage
MAX_STAGE = 200


def traced_coordinates(dim: int) -> np.ndarray:
    """The coordinates recorded over the stage: all of them up to
    :data:`MAX_COORDINATES`, else that many evenly spaced."""
    if dim <= MAX_COORDINATES:
        return np.arange(dim)
    return np.unique(np.linspace(0, dim - 1, MAX_COORDINATES).round().astype(np.int64))


def autocorrelation_length(trace: np.ndarray, length: np.ndarray, pooled: bool) -> np.ndarray:
    """The new trajectory lengths from the draws ``trace`` ``(C, N, K)`` made with the
    lengths ``length`` (``(C,)``, or one for all chains when ``pooled``):
    ``LENGTH_FACTOR * L * tau``, at most ``MAX_GROWTH * L``, with ``tau = N / mean_k
    ESS_k`` each chain's own, or, ``pooled``, all chains' together (``C N / mean_k
    ESS_k``); a length whose ESS is not finite stays."""
    chains, draws, coordinates = trace.shape
    groups = [trace] if pooled else [trace[c : c + 1] for c in range(chains)]
    tau = np.array(
        [
            group.shape[0]
            * draws
            / np.mean([ess(group[..., k], "mean") for k in range(coordinates)])
            for group in groups
        ]
    )
    new = np.minimum(LENGTH_FACTOR * length * tau, MAX_GROWTH * length)
    return np.where(np.isfinite(new) & (new > 0), new, length)


class StanLengthState(NamedTuple):
    """Stan's warmup state ``inner`` and the positions each chain recorded over the stage
    ``trace`` ``(C, N, K)`` (arrays of the run's engine)."""

    inner: WarmupState
    trace: torch.Tensor

    @property
    def restarted(self) -> torch.Tensor:
        """``(C,)`` the chains Stan's warmup restarted from another chain."""
        return self.inner.restarted


class EnsembleLengthState(NamedTuple):
    """The pooled warmup's state ``inner`` and the positions every chain recorded over
    the stage ``trace`` ``(C, N, K)`` (tensors)."""

    inner: EnsembleState
    trace: torch.Tensor

    @property
    def restarted(self) -> torch.Tensor:
        """``(C,)`` the chains the pooled warmup restarted from another chain."""
        return self.inner.restarted


def _pooled_stages(schedule: WarmupSchedule) -> list[tuple[int, int]]:
    """The pooled warmup's stages: every slow window after the first, then the first
    half of the terminal buffer (see the module)."""
    terminal = _stage(schedule, pooled=True)
    return schedule.windows[1:] + ([] if terminal is None else [terminal])


def _stage(schedule: WarmupSchedule, pooled: bool) -> tuple[int, int] | None:
    """The first and last iterations of the stage (see the module), or None."""
    if not schedule.windows:
        return None
    first, last = schedule.windows[-1]
    if pooled:
        terminal = schedule.num_warmup - 1 - last
        if terminal // 2 < 2 * MIN_DRAWS:  # too few draws for an ESS of split chains
            return None
        return last + 1, last + terminal // 2
    return max(first, last - MAX_STAGE + 1), last


def _initial(
    params: Params, schedule: WarmupSchedule, trace_shape: tuple[int, int, int]
) -> tuple[Params, torch.Tensor]:
    """The parameters with :data:`INITIAL_STEPS` steps per trajectory (the kernel's own
    length without warmup: only the step-size heuristic ran), and an empty trace."""
    step_size = params.step_size
    trace = step_size.new_zeros(trace_shape)
    if schedule.num_warmup == 0:
        return params, trace
    return params._replace(trajectory_length=INITIAL_STEPS * step_size), trace


@dataclass(frozen=True)
class StanLengthWarmup:
    """Stan's per-chain warmup with MAMS's trajectory length (see the module)."""

    inner: StanWarmup
    lockstep = False

    @property
    def schedule(self) -> WarmupSchedule:
        return self.inner.schedule

    def restart_stops(self) -> list[int]:
        """Those of Stan's warmup (:meth:`hmc.adapt.StanWarmup.restart_stops`)."""
        return self.inner.restart_stops()

    def restart(
        self, adaptation: StanLengthState, params: Params, state: State
    ) -> tuple[StanLengthState, Params, State]:
        """Stan's restart of stranded chains (:meth:`hmc.adapt.StanWarmup.restart`); a
        restarted chain keeps its trajectory length and its stage's positions."""
        inner, params, state = self.inner.restart(adaptation.inner, params, state)
        return adaptation._replace(inner=inner), params, state

    def init(
        self, state: State, params: Params, keys: torch.Tensor
    ) -> tuple[StanLengthState, Params]:
        """Stan's initial step sizes, :data:`INITIAL_STEPS` steps per trajectory."""
        adaptation, params = self.inner.init(state, params, keys)
        stage = _stage(self.schedule, pooled=False)
        chains, dim = state.position.shape
        size = 0 if stage is None else stage[1] - stage[0] + 1
        params, trace = _initial(
            params, self.schedule, (chains, size, traced_coordinates(dim).size)
        )
        return StanLengthState(adaptation, trace), params

    def update(
        self,
        adaptation: StanLengthState,
        params: Params,
        done,
        iteration,
        accept_stat,
        state: State,
        keys: torch.Tensor,
        window_ends: bool = True,
        proposal: Proposal | None = None,
    ) -> tuple[StanLengthState, Params]:
        """Stan's update of the chains ``done`` ``(C,)`` after their iteration
        ``iteration`` ``(C,)``, then their trajectory lengths (see the module)."""
        length = params.trajectory_length
        inner, params = self.inner.update(
            adaptation.inner, params._replace(trajectory_length=None), done, iteration,
            accept_stat, state, keys, window_ends, proposal,
        )  # fmt: skip
        xp = namespace(done)
        schedule, trace = self.schedule, adaptation.trace
        t = iteration.clip(0, schedule.num_warmup - 1)
        stage = _stage(schedule, pooled=False)
        first_end = schedule.windows[0][1] if schedule.windows else schedule.num_warmup
        before = done & (t < (first_end if stage is None else min(first_end, stage[0])))
        length = xp.where(before, INITIAL_STEPS * params.step_size, length)
        if stage is not None:
            in_stage = done & (t >= stage[0]) & (t <= stage[1])
            column = (t - stage[0]).clip(0, trace.shape[1] - 1)
            rows = (
                np.arange(trace.shape[0])
                if xp is np
                else torch.arange(trace.shape[0], device=trace.device)
            )
            coordinates = traced_coordinates(state.position.shape[1])
            recorded = trace[rows, column]
            trace[rows, column] = xp.where(
                in_stage[:, None], state.position[:, coordinates], recorded
            )
        if window_ends and schedule.windows:
            ends = done & schedule.window_end[t]
            whitened = ends if stage is None else ends & (t != stage[1])
            length = xp.where(whitened, math.sqrt(state.position.shape[1]), length)
            if stage is not None:
                length = self._stage_end(ends & (t == stage[1]), trace, length)
        return StanLengthState(inner, trace), params._replace(trajectory_length=length)

    @staticmethod
    def _stage_end(ending, trace, length):
        """The lengths ``(C,)`` with those of the chains ``ending`` the stage set from
        their traces (host work, once per chain)."""
        xp = namespace(length)
        if not bool(ending.any()):
            return length
        host = np.asarray(trace if xp is np else trace.numpy(force=True))
        old = np.asarray(length if xp is np else length.numpy(force=True))
        new = autocorrelation_length(host, old, pooled=False)
        new = new if xp is np else torch.as_tensor(new).to(length)
        return xp.where(ending, new, length)

    def final(self, adaptation: StanLengthState, params: Params, leaving) -> Params:
        """Stan's sampling step sizes; the lengths as learnt."""
        length = params.trajectory_length
        params = self.inner.final(
            adaptation.inner, params._replace(trajectory_length=None), leaving
        )
        return params._replace(trajectory_length=length)


@dataclass(frozen=True)
class EnsembleLengthWarmup:
    """The pooled warmup with MAMS's trajectory length, one for all chains (see the
    module)."""

    inner: EnsembleWarmup
    lockstep = True

    @property
    def schedule(self) -> WarmupSchedule:
        return self.inner.schedule

    def init(
        self, state: State, params: Params, keys: torch.Tensor
    ) -> tuple[EnsembleLengthState, Params]:
        """The pooled initial step size, :data:`INITIAL_STEPS` steps per trajectory."""
        adaptation, params = self.inner.init(state, params, keys)
        stages = _pooled_stages(self.schedule)
        chains, dim = state.position.shape
        size = max((last - first + 1 for first, last in stages), default=0)
        params, trace = _initial(
            params, self.schedule, (chains, size, traced_coordinates(dim).size)
        )
        return EnsembleLengthState(adaptation, trace), params

    def update(
        self,
        adaptation: EnsembleLengthState,
        params: Params,
        done,
        iteration,
        accept_stat,
        state: State,
        keys: torch.Tensor,
        window_ends: bool = True,
        proposal: Proposal | None = None,
    ) -> tuple[EnsembleLengthState, Params]:
        """The pooled warmup keeps the acceptance statistics; nothing changes here."""
        inner, _ = self.inner.update(
            adaptation.inner, params, done, iteration, accept_stat, state, keys, window_ends
        )
        return adaptation._replace(inner=inner), params

    def final(self, adaptation: EnsembleLengthState, params: Params, leaving) -> Params:
        """The parameters as they are: the last :meth:`pool` sets them."""
        return params

    def pool(
        self,
        adaptation: EnsembleLengthState,
        params: Params,
        state: State,
        iteration: int,
        keys: torch.Tensor,
    ) -> Pooled:
        """The pooled adaptation after every chain finished ``iteration``, then the
        common trajectory length (see the module)."""
        length = params.trajectory_length
        pooled = self.inner.pool(
            adaptation.inner, params._replace(trajectory_length=None), state, iteration, keys
        )
        params, schedule = pooled.params, self.schedule
        trace = torch.as_tensor(adaptation.trace)  # tensors whatever the engine
        xp = namespace(params.step_size)
        stage = next((s for s in _pooled_stages(schedule) if s[0] <= iteration <= s[1]), None)
        dim = state.position.shape[1]
        if schedule.windows and iteration < schedule.windows[0][1]:
            length = INITIAL_STEPS * params.step_size
        elif iteration == schedule.windows[0][1] and self.inner.adapt_metric:
            length = xp.full_like(params.step_size, math.sqrt(dim))
        if stage is not None:
            position = torch.as_tensor(pooled.state.position)
            trace = trace.clone()
            trace[:, iteration - stage[0]] = position[:, traced_coordinates(dim)]
            if iteration == stage[1]:
                everyone = self.inner._gather_chains(trace.flatten(1))[0].reshape(
                    -1, *trace.shape[1:]
                )
                old = np.asarray(length)[:1]
                new = autocorrelation_length(everyone.numpy(force=True), old, pooled=True)[:1]
                length = xp.full_like(params.step_size, float(new[0]))
        adaptation = EnsembleLengthState(pooled.adaptation, trace)
        return pooled._replace(
            adaptation=adaptation, params=params._replace(trajectory_length=length)
        )
