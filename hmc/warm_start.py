"""A warm start: the step sizes and inverse metrics a previous run adapted.

``hmc.sample(..., adapted_from=previous)`` takes them from the ``adaptation`` group of a
previous run's DataTree, or from a checkpoint file written at or after the end of that
run's warmup (:mod:`hmc.checkpoint`). With the same number of chains each chain takes its own; with
another number every chain takes the median step size and the mean inverse metric over
the previous chains. A diagonal metric asked for from a dense one keeps its diagonal; a
dense one from a diagonal one is that diagonal. With ``warmup=0`` they are used as they
are; with warmup, adaptation starts from them (as Stan's ``stepsize`` and ``inv_metric``
arguments do).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from hmc.checkpoint import read_checkpoint

__all__ = ["adapted_parameters", "read_adaptation"]


def read_adaptation(adapted_from: Any) -> tuple[np.ndarray, np.ndarray]:
    """The step sizes ``(C,)`` and inverse metrics ``(C, D)`` or ``(C, D, D)`` of a
    previous run's DataTree or checkpoint file; raises naming ``adapted_from`` when it is
    neither, or a checkpoint written before its run's warmup ended."""
    if isinstance(adapted_from, str | os.PathLike):
        return _checkpoint_adaptation(adapted_from)
    try:
        group = adapted_from["adaptation"]
        step_size = np.asarray(group["step_size"].values, dtype=np.float64)
        inverse = np.asarray(group["inverse_metric"].values, dtype=np.float64)
    except (KeyError, TypeError, AttributeError) as error:
        raise TypeError(
            "adapted_from must be the DataTree of a previous hmc.sample run (with its "
            f"'adaptation' group) or the path of its checkpoint, got "
            f"{type(adapted_from).__name__} ({error})"
        ) from None
    return _checked(step_size, inverse)


def _checkpoint_adaptation(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
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
    return _checked(step_size, saved["inverse_metric"].numpy().astype(np.float64))


def _checked(step_size: np.ndarray, inverse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if not (np.isfinite(step_size).all() and (step_size > 0).all()):
        raise ValueError("adapted_from has step sizes that are not positive and finite")
    if not _positive_definite(inverse):
        raise ValueError(
            "adapted_from has an inverse metric that is not finite and positive (definite): "
            "every transition would diverge"
        )
    return step_size, inverse


def _positive_definite(inverse: np.ndarray) -> bool:
    """Whether every chain's inverse metric, diagonal ``(C, D)`` or dense ``(C, D, D)``,
    is finite and positive (definite)."""
    if not np.isfinite(inverse).all():
        return False
    if inverse.ndim == 2:
        return bool((inverse > 0).all())
    return bool((np.linalg.eigvalsh(0.5 * (inverse + np.swapaxes(inverse, -1, -2))) > 0).all())


def adapted_parameters(
    adapted: tuple[np.ndarray, np.ndarray],
    chains: int,
    dim: int,
    dense: bool,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step sizes ``(chains,)`` and inverse metrics ``(chains, dim)`` (or ``(chains, dim,
    dim)`` when ``dense``) from what :func:`read_adaptation` read; raises naming
    ``adapted_from`` when it has another dimension."""
    step_size, inverse = adapted
    if inverse.shape[1] != dim:
        raise ValueError(
            f"adapted_from was adapted in dimension {inverse.shape[1]}; this run has "
            f"dimension {dim}"
        )
    if inverse.ndim == 3 and not dense:
        inverse = np.diagonal(inverse, axis1=1, axis2=2)
    elif inverse.ndim == 2 and dense:
        inverse = np.stack([np.diag(row) for row in inverse])
    if step_size.shape[0] != chains:
        step_size = np.full(chains, np.median(step_size))
        inverse = np.broadcast_to(inverse.mean(0), (chains, *inverse.shape[1:]))
    as_tensor = lambda x: torch.tensor(np.ascontiguousarray(x), dtype=dtype, device=device)  # noqa: E731
    return as_tensor(step_size), as_tensor(inverse)
