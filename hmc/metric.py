"""Euclidean metrics: momentum draws, kinetic energy, velocity, and the U-turn test.

The inverse metric (the inverse mass matrix, an estimate of the posterior covariance) is
per chain: ``(C, D)`` for a diagonal metric, ``(C, D, D)`` for a dense one. Kinetic energy
is ``K(p) = p^T M^-1 p / 2``, so the velocity is ``dK/dp = M^-1 p`` and momenta are drawn
from ``N(0, M)``. The identity metric is the diagonal metric with unit entries. A metric's
fields are tensors, or NumPy arrays for the NumPy engine (``hmc.arrays.as_arrays``); its
methods take and return arrays of the same kind.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

__all__ = [
    "DenseMetric",
    "DiagonalMetric",
    "Metric",
    "all_no_u_turn",
    "dot",
    "kinetic_energy_and_velocity",
    "metric_from_inverse",
    "no_u_turn",
]


class DiagonalMetric(NamedTuple):
    """Diagonal inverse metric ``inverse`` ``(C, D)`` and its square root ``(C, D)``."""

    inverse: torch.Tensor
    sqrt_inverse: torch.Tensor

    def velocity(self, p: torch.Tensor) -> torch.Tensor:
        """``M^-1 p`` for momenta ``(C, D)``."""
        return self.inverse * p

    def kinetic_energy(self, p: torch.Tensor) -> torch.Tensor:
        """``(C,)`` kinetic energies of momenta ``(C, D)``."""
        return kinetic_energy_and_velocity(self, p)[0]

    def momentum(self, noise: torch.Tensor) -> torch.Tensor:
        """Momenta ``~ N(0, M)`` from standard normal ``noise`` ``(C, D)``."""
        return noise / self.sqrt_inverse


class DenseMetric(NamedTuple):
    """Dense inverse metric ``inverse`` ``(C, D, D)`` and its lower Cholesky factor."""

    inverse: torch.Tensor
    cholesky: torch.Tensor

    def velocity(self, p: torch.Tensor) -> torch.Tensor:
        return (self.inverse @ p[..., None])[..., 0]

    def kinetic_energy(self, p: torch.Tensor) -> torch.Tensor:
        return kinetic_energy_and_velocity(self, p)[0]

    def momentum(self, noise: torch.Tensor) -> torch.Tensor:
        # inverse = L L^T, so M = L^-T L^-1 and p = L^-T z has covariance M.
        if isinstance(noise, np.ndarray):  # NumPy has no triangular solve: torch's, on
            # tensors that share the arrays' memory
            tensors = DenseMetric(*map(torch.from_numpy, self))
            return tensors.momentum(torch.from_numpy(noise)).numpy()
        solved = torch.linalg.solve_triangular(self.cholesky.mT, noise.unsqueeze(-1), upper=True)
        return solved.squeeze(-1)


Metric = DiagonalMetric | DenseMetric


def kinetic_energy_and_velocity(
    metric: Metric, p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``K(p) = p^T M^-1 p / 2`` ``(C,)`` and the velocity ``M^-1 p`` ``(C, D)`` of momenta
    ``p`` ``(C, D)`` (tensors or NumPy arrays), with one product by ``M^-1``."""
    velocity = metric.velocity(p)
    return 0.5 * dot(p, velocity), velocity


def metric_from_inverse(inverse: torch.Tensor) -> Metric:
    """A diagonal metric from ``(C, D)`` or a dense one from ``(C, D, D)``."""
    if inverse.dim() == 2:
        return DiagonalMetric(inverse, inverse.sqrt())
    if inverse.dim() == 3:
        return DenseMetric(inverse, torch.linalg.cholesky(inverse))
    raise ValueError(f"inverse metric must be (C, D) or (C, D, D), got {tuple(inverse.shape)}")


#: rows up to this long are contracted against a column of ones on the CPU, longer ones
#: pairwise (the faster of the two on each side, benchmarks/RESULTS.md section 2)
_SHORT_ROWS = 32


def dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Dot products over the last axis: ``(..., D)`` tensors or arrays (their leading
    axes broadcast against each other) give ``(...)``.

    On the CPU, torch reduces a short last axis slowly: ``(a * b).sum(-1)`` over
    ``(3, 1024, 10, 2)`` takes about ten times as long as a matrix product doing the same
    sums. CPU tensors are therefore contracted with a matrix product. Other devices,
    NumPy arrays and graphs being compiled use the plain sum: inductor fuses it into the
    generated code, where a matrix product would be a call out of it.
    """
    if isinstance(a, np.ndarray):
        return np.add.reduce(a * b, -1)
    if a.device.type != "cpu" or torch.compiler.is_compiling():
        return (a * b).sum(-1)
    if a.shape[-1] <= _SHORT_ROWS:
        product = a * b
        return (product @ product.new_ones(product.shape[-1], 1)).squeeze(-1)
    return (a.unsqueeze(-2) @ b.unsqueeze(-1)).squeeze(-1).squeeze(-1)


def no_u_turn(
    velocity_minus: torch.Tensor, velocity_plus: torch.Tensor, rho: torch.Tensor
) -> torch.Tensor:
    """Stan's criterion: keep going while both end velocities point along the summed momentum.

    velocity_minus, velocity_plus : ``(C, D)`` ``M^-1 p`` at the backward and forward ends;
    rho : ``(C, D)`` sum of the momenta of the (sub)trajectory, ends included.
    Returns ``(C,)`` bool, True where the trajectory has not turned (strict ``> 0``).
    """
    return (dot(velocity_plus, rho) > 0) & (dot(velocity_minus, rho) > 0)


def all_no_u_turn(*criteria: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Whether several :func:`no_u_turn` criteria all hold, each a ``(velocity_minus,
    velocity_plus, rho)`` triple: tensors of one shape ``(C, ..., D)``, evaluated together
    (``(C, ...)`` bool), or one chain's NumPy rows ``(D,)``, evaluated in turn until one
    fails (a Python bool)."""
    if isinstance(criteria[0][0], np.ndarray):
        for v_minus, v_plus, rho in criteria:
            # ndarray.dot: the same product as ``@``, in half the call overhead
            if not (v_plus.dot(rho) > 0 and v_minus.dot(rho) > 0):
                return False
        return True
    v_minus, v_plus, rho = (torch.stack(x) for x in zip(*criteria, strict=True))
    return no_u_turn(v_minus, v_plus, rho).all(0)
