"""Transition kernels: static HMC, ChEES-HMC, MAMS and NUTS, functions of explicit state."""

from hmc.kernels.base import Kernel, Params
from hmc.kernels.chees import ChEES
from hmc.kernels.hmc import HMC, HMCInfo
from hmc.kernels.mams import MAMS
from hmc.kernels.nuts import NUTS, NUTSInfo

__all__ = ["HMC", "MAMS", "NUTS", "ChEES", "HMCInfo", "Kernel", "NUTSInfo", "Params"]
