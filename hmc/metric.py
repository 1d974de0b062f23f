"""Euclidean metrics: momentum draws, kinetic energy, velocity, and the U-turn test.

The inverse metric (the inverse mass matrix, an estimate of the posterior covariance) is
per chain: ``(C, D)`` for a diagonal metric, ``(C, D, D)`` for a dense one, and for the
low-rank metric a diagonal scale ``(C, D)`` with ``k`` eigenpairs ``(C, D, k)``, ``(C, k)``
(:class:`LowRankMetric`, applied in ``O(D k)``). Kinetic energy
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
    "LowRankMetric",
    "Metric",
    "all_no_u_turn",
    "dot",
    "inverse_diagonal",
    "kinetic_energy_and_velocity",
    "metric_from_fields",
    "metric_from_inverse",
    "no_u_turn",
    "unit_metric",
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


class LowRankMetric(NamedTuple):
    """A diagonal times a low-rank correction: the inverse metric
    ``M^-1 = diag(scale) (I + U (diag(values) - I) U^T) diag(scale)``.

    Attributes
    ----------
    scale : torch.Tensor
        ``(C, D)`` positive, the whitening scale (its square is the diagonal part).
    vectors : torch.Tensor
        ``(C, D, k)`` ``U``, orthonormal columns in the whitened coordinates; a column of
        zeros (with value 1) is an unused slot, so every chain has ``k`` slots.
    values : torch.Tensor
        ``(C, k)`` positive eigenvalues of the whitened inverse metric.

    Notes
    -----
    It is applied through its factor ``F = diag(scale) (I + U (sqrt(values) - 1) U^T)``,
    ``M^-1 = F F^T``: the kinetic energy ``|F^T p|^2 / 2`` is never negative, whatever the
    rounding of ``U`` in float32 (:func:`hmc.adapt.low_rank.low_rank_metric` floors the
    values so that ``F`` stays invertible), and every operation costs ``O(D k)`` per chain.
    """

    scale: torch.Tensor
    vectors: torch.Tensor
    values: torch.Tensor

    def _correct(self, x: torch.Tensor, power: float) -> torch.Tensor:
        """``(I + U (values**power - 1) U^T) x`` for rows ``x`` ``(C, D)``."""
        coefficients = (x[:, None, :] @ self.vectors)[:, 0, :]  # U^T x, (C, k)
        weighted = (self.values**power - 1.0) * coefficients
        return x + (self.vectors @ weighted[:, :, None])[:, :, 0]

    def factor_transpose(self, p: torch.Tensor) -> torch.Tensor:
        """``F^T p`` for momenta ``(C, D)``: ``K(p) = |F^T p|^2 / 2``."""
        return self._correct(self.scale * p, 0.5)

    def factor(self, a: torch.Tensor) -> torch.Tensor:
        """``F a`` for rows ``(C, D)``."""
        return self.scale * self._correct(a, 0.5)

    def velocity(self, p: torch.Tensor) -> torch.Tensor:
        """``M^-1 p = F F^T p`` for momenta ``(C, D)``."""
        return self.factor(self.factor_transpose(p))

    def kinetic_energy(self, p: torch.Tensor) -> torch.Tensor:
        return kinetic_energy_and_velocity(self, p)[0]

    def momentum(self, noise: torch.Tensor) -> torch.Tensor:
        """Momenta ``F^-T z ~ N(0, M)`` from standard normal ``noise`` ``(C, D)``."""
        return self._correct(noise, -0.5) / self.scale


Metric = DiagonalMetric | DenseMetric | LowRankMetric


def kinetic_energy_and_velocity(
    metric: Metric, p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``K(p) = p^T M^-1 p / 2`` ``(C,)`` and the velocity ``M^-1 p`` ``(C, D)`` of momenta
    ``p`` ``(C, D)`` (tensors or NumPy arrays), with one product by ``M^-1`` (for the
    low-rank metric, ``K = |F^T p|^2 / 2`` and the velocity ``F (F^T p)``)."""
    if isinstance(metric, LowRankMetric):
        half = metric.factor_transpose(p)
        return 0.5 * dot(half, half), metric.factor(half)
    velocity = metric.velocity(p)
    return 0.5 * dot(p, velocity), velocity


def inverse_diagonal(metric: Metric) -> torch.Tensor:
    """The diagonal of each chain's inverse metric ``(C, D)`` (the variances it assumes):
    for the low-rank metric ``scale**2 (1 + sum_j U_ij**2 (values_j - 1))``."""
    if isinstance(metric, LowRankMetric):
        correction = (metric.vectors**2 @ (metric.values - 1.0)[:, :, None])[:, :, 0]
        return metric.scale**2 * (1.0 + correction)
    if isinstance(metric, DenseMetric):
        return metric.inverse.diagonal(dim1=-2, dim2=-1)
    return metric.inverse


def unit_metric(name: str, like: torch.Tensor, rank: int = 0) -> Metric:
    """The unit metric of kind ``name`` (``"identity"``, ``"diag"``, ``"dense"`` or
    ``"low-rank"`` with ``rank`` unused slots) for chains shaped like ``like`` ``(C, D)``."""
    unit = torch.ones_like(like)
    if name == "dense":
        return metric_from_inverse(torch.diag_embed(unit))
    if name == "low-rank":
        chains, dim = like.shape
        return LowRankMetric(
            unit, like.new_zeros((chains, dim, rank)), like.new_ones((chains, rank))
        )
    return metric_from_inverse(unit)


def metric_from_fields(*fields: torch.Tensor) -> Metric:
    """The metric record whose fields are ``fields`` (those of a record, in order): three
    make a :class:`LowRankMetric`, two a diagonal ``(C, D)`` or a dense ``(C, D, D)`` one."""
    if len(fields) == len(LowRankMetric._fields):
        return LowRankMetric(*fields)
    return (DiagonalMetric if fields[0].dim() == 2 else DenseMetric)(*fields)


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
