"""Transition kernels: static HMC and NUTS, functions of explicit state."""

from hmc.kernels.base import Kernel, Params
from hmc.kernels.hmc import HMC, HMCInfo
from hmc.kernels.nuts import NUTS, NUTSInfo

__all__ = ["HMC", "NUTS", "HMCInfo", "Kernel", "NUTSInfo", "Params"]
