"""Warmup adaptation, kept outside the kernels: step size, metric, and the schedules of
Stan's per-chain warmup and of the pooled ensemble warmup."""

from hmc.adapt.ensemble import EnsembleState, EnsembleWarmup, ensemble_schedule
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
    "StanWarmup",
    "WarmupSchedule",
    "WarmupState",
    "WelfordState",
    "build_schedule",
    "dual_averaging_final",
    "dual_averaging_init",
    "dual_averaging_update",
    "ensemble_schedule",
    "schedule_from_windows",
    "welford_covariance",
    "welford_init",
    "welford_update",
]
