"""Warmup adaptation, kept outside the kernels: step size, metric, and Stan's schedule."""

from hmc.adapt.schedule import WarmupSchedule, build_schedule
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
    "StanWarmup",
    "WarmupSchedule",
    "WarmupState",
    "WelfordState",
    "build_schedule",
    "dual_averaging_final",
    "dual_averaging_init",
    "dual_averaging_update",
    "welford_covariance",
    "welford_init",
    "welford_update",
]
