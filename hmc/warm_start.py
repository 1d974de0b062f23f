"""A warm start: the step sizes and inverse metrics a previous run adapted.

``hmc.sample(..., adapted_from=previous)`` takes them from the ``adaptation`` group of a
previous run's DataTree, or from a checkpoint file written at or after the end of that
run's warmup (:mod:`hmc.checkpoint`). With the same number of chains each chain takes its own; with
another number every chain takes the median step size and the mean inverse metric over
the previous chains. A diagonal metric asked for from a dense one keeps its diagonal; a
dense one from a diagonal one is that diagonal. A low-rank metric
(:class:`hmc.metric.LowRankMetric`) is read whole where the previous run adapted one; a
diagonal or dense one asked for from it is its matrix's diagonal or the matrix, and it from
a diagonal or dense one is their nearest (:func:`hmc.adapt.low_rank.low_rank_from_dense`);
with another number of chains every chain takes the low-rank metric of the previous chain
with the median step size. With ``warmup=0`` they are used as they are; with warmup,
adaptation starts from them (as Stan's ``stepsize`` and ``inv_metric`` arguments do).
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np
import torch

from hmc.adapt.low_rank import LowRank, low_rank_from_dense
from hmc.checkpoint import read_checkpoint
from hmc.metric import (
    LowRankMetric,
    Metric,
    inverse_diagonal,
    metric_from_inverse,
)

__all__ = ["Adapted", "adapted_parameters", "read_adaptation"]

#: the adaptation group's variables of a low-rank metric, in the order of its fields
LOW_RANK_VARIABLES = ("metric_scale", "metric_eigenvectors", "metric_eigenvalues")


class Adapted(NamedTuple):
    """What a previous run adapted: step sizes ``(C,)``, inverse metrics ``(C, D)`` or
    ``(C, D, D)`` (for a low-rank metric, its matrices' diagonals), and the low-rank
    metric's fields (float64 NumPy arrays) or None."""

    step_size: np.ndarray
    inverse: np.ndarray
    low_rank: LowRankMetric | None = None


def read_adaptation(adapted_from: Any) -> Adapted:
    """The step sizes and metrics of a previous run's DataTree or checkpoint file; raises
    naming ``adapted_from`` when it is neither, or a checkpoint written before its run's
    warmup ended."""
    if isinstance(adapted_from, str | os.PathLike):
        return _checkpoint_adaptation(adapted_from)
    try:
        group = adapted_from["adaptation"]
        step_size = np.asarray(group["step_size"].values, dtype=np.float64)
        inverse = np.asarray(group["inverse_metric"].values, dtype=np.float64)
        low_rank = None
        if LOW_RANK_VARIABLES[0] in group:
            low_rank = LowRankMetric(
                *(np.asarray(group[name].values, dtype=np.float64) for name in LOW_RANK_VARIABLES)
            )
    except (KeyError, TypeError, AttributeError) as error:
        raise TypeError(
            "adapted_from must be the DataTree of a previous hmc.sample run (with its "
            f"'adaptation' group) or the path of its checkpoint, got "
            f"{type(adapted_from).__name__} ({error})"
        ) from None
    return _checked(step_size, inverse, low_rank)


def _checkpoint_adaptation(path: str | os.PathLike) -> Adapted:
    """The adapted step sizes and inverse metrics in the checkpoint at ``path``."""
    saved = read_checkpoint(path)
    warmup = saved["settings"]["warmup"]
    if saved["iteration"] < warmup:
        raise ValueError(
            f"adapted_from checkpoint {str(path)!r} was written during warmup (iteration "
            f"{saved['iteration']} of {warmup}): its step sizes and metric are not adapted "
            "yet; continue that run with hmc.resume"
        )
    step_size = saved["step_size"].numpy().astype(np.float64)
    low_rank = saved.get("low_rank_metric")
    if low_rank is not None:
        low_rank = LowRankMetric(*(x.numpy().astype(np.float64) for x in low_rank))
    return _checked(step_size, saved["inverse_metric"].numpy().astype(np.float64), low_rank)


def _checked(
    step_size: np.ndarray, inverse: np.ndarray, low_rank: LowRankMetric | None = None
) -> Adapted:
    if not (np.isfinite(step_size).all() and (step_size > 0).all()):
        raise ValueError("adapted_from has step sizes that are not positive and finite")
    positive = _positive_definite(inverse)
    if low_rank is not None:
        positive = positive and all(np.isfinite(x).all() for x in low_rank)
        positive = positive and bool((low_rank.scale > 0).all() and (low_rank.values > 0).all())
    if not positive:
        raise ValueError(
            "adapted_from has an inverse metric that is not finite and positive (definite): "
            "every transition would diverge"
        )
    return Adapted(step_size, inverse, low_rank)


def _positive_definite(inverse: np.ndarray) -> bool:
    """Whether every chain's inverse metric, diagonal ``(C, D)`` or dense ``(C, D, D)``,
    is finite and positive (definite)."""
    if not np.isfinite(inverse).all():
        return False
    if inverse.ndim == 2:
        return bool((inverse > 0).all())
    return bool((np.linalg.eigvalsh(0.5 * (inverse + np.swapaxes(inverse, -1, -2))) > 0).all())


def adapted_parameters(
    adapted: Adapted,
    chains: int,
    dim: int,
    metric: str,
    low_rank: LowRank | None,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, Metric]:
    """Step sizes ``(chains,)`` and the metric of kind ``metric`` (``"diag"``,
    ``"identity"``, ``"dense"`` or ``"low-rank"`` with options ``low_rank``) from what
    :func:`read_adaptation` read; raises naming ``adapted_from`` when it has another
    dimension."""
    step_size, inverse, previous = adapted
    if inverse.shape[1] != dim:
        raise ValueError(
            f"adapted_from was adapted in dimension {inverse.shape[1]}; this run has "
            f"dimension {dim}"
        )
    as_tensor = lambda x: torch.tensor(np.ascontiguousarray(x), dtype=dtype, device=device)  # noqa: E731
    if metric == "low-rank":
        if previous is None:
            dense = inverse if inverse.ndim == 3 else np.stack([np.diag(row) for row in inverse])
            previous = low_rank_from_dense(torch.from_numpy(dense), low_rank)
        previous = LowRankMetric(*map(torch.as_tensor, previous))
        if previous.values.shape[1] != low_rank.rank(dim):  # another rank: through its matrix
            previous = low_rank_from_dense(_dense(previous), low_rank)
        if step_size.shape[0] != chains:
            median = int(np.argsort(step_size)[(step_size.shape[0] - 1) // 2])
            step_size = np.full(chains, step_size[median])
            previous = LowRankMetric(*(x[median].expand(chains, *x.shape[1:]) for x in previous))
        return as_tensor(step_size), LowRankMetric(*map(as_tensor, previous))
    if previous is not None:
        previous = LowRankMetric(*map(torch.as_tensor, previous))
        inverse = (_dense(previous) if metric == "dense" else inverse_diagonal(previous)).numpy()
    dense = metric == "dense"
    if inverse.ndim == 3 and not dense:
        inverse = np.diagonal(inverse, axis1=1, axis2=2)
    elif inverse.ndim == 2 and dense:
        inverse = np.stack([np.diag(row) for row in inverse])
    if step_size.shape[0] != chains:
        step_size = np.full(chains, np.median(step_size))
        inverse = np.broadcast_to(inverse.mean(0), (chains, *inverse.shape[1:]))
    return as_tensor(step_size), metric_from_inverse(as_tensor(inverse))


def _dense(metric: LowRankMetric) -> torch.Tensor:
    """The inverse metrics ``(C, D, D)`` of a low-rank record."""
    scale, vectors, values = metric
    eye = torch.eye(scale.shape[1], dtype=scale.dtype)
    whitened = eye + (vectors * (values - 1.0)[:, None, :]) @ vectors.mT
    return scale[:, :, None] * whitened * scale[:, None, :]
