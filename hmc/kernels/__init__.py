"""Transition kernels: static HMC and NUTS, functions of explicit state."""

from hmc.kernels.base import Kernel, Params
from hmc.kernels.hmc import HMC, HMCInfo

__all__ = ["HMC", "HMCInfo", "Kernel", "Params"]
