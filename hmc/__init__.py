"""hmc: Hamiltonian Monte Carlo for PyTorch log densities.

``hmc.sample`` runs static HMC or Stan's NUTS with Stan's warmup on many chains at once and
returns an ArviZ ``DataTree``. The pieces it is built from (the energy module, the memo
cache, states, metrics, the leapfrog integrator, kernels, adaptation) are public too, with
named constrained models (``Model``, ``Param``), built-in posteriordb models (``models``)
gradient reuse through a shared inner function (``shared_inner_grads``) and Pyro models
(``from_pyro``; Pyro itself is imported only when it is called).
"""

from hmc import models
from hmc.adapt.low_rank import LowRank
from hmc.autodiff import shared_inner_grads, tempered_value_and_grad
from hmc.integrators import leapfrog
from hmc.kernels import HMC, MAMS, NUTS, ChEES, Params
from hmc.memo import MemoCache
from hmc.metric import DenseMetric, DiagonalMetric, LowRankMetric, metric_from_inverse
from hmc.nested_rhat import nested_rhat
from hmc.parameters import Model, Param
from hmc.potential import Potential
from hmc.pyro import from_pyro
from hmc.sampler import resume, sample
from hmc.state import State

__version__ = "0.1.0"

__all__ = [
    "HMC",
    "MAMS",
    "NUTS",
    "ChEES",
    "DenseMetric",
    "DiagonalMetric",
    "LowRank",
    "LowRankMetric",
    "MemoCache",
    "Model",
    "Param",
    "Params",
    "Potential",
    "State",
    "__version__",
    "from_pyro",
    "leapfrog",
    "metric_from_inverse",
    "models",
    "nested_rhat",
    "resume",
    "sample",
    "shared_inner_grads",
    "tempered_value_and_grad",
]
