"""Warmup adaptation, kept outside the kernels: step size, metric (the low-rank one from
windows of draws and gradients, :mod:`hmc.adapt.low_rank`), and the schedules of Stan's
per-chain warmup and of the pooled ensemble warmup."""

from hmc.adapt.ensemble import EnsembleState, EnsembleWarmup, ensemble_schedule
from hmc.adapt.low_rank import LowRank, WindowDraws, low_rank_from_dense, low_rank_metric
from hmc.adapt.schedule import WarmupSchedule, build_schedule, schedule_from_windows
from hmc.adapt.step_size import (
    DualAveragingState,
    dual_averaging_final,
    dual_averaging_init,
    dual_averaging_update,
)
from hmc.adapt.warmup import StanWarmup, WarmupState
from hmc.adapt.welford import WelfordState, welford_covariance, welford_init, welford_update

__all__ = [
    "DualAveragingState",
    "EnsembleState",
    "EnsembleWarmup",
    "LowRank",
    "StanWarmup",
    "WarmupSchedule",
    "WarmupState",
    "WelfordState",
    "WindowDraws",
    "build_schedule",
    "dual_averaging_final",
    "dual_averaging_init",
    "dual_averaging_update",
    "ensemble_schedule",
    "low_rank_from_dense",
    "low_rank_metric",
    "schedule_from_windows",
    "welford_covariance",
    "welford_init",
    "welford_update",
]
