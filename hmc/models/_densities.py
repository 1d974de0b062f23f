"""Elementwise log densities: normalised ones for likelihoods (so that pointwise
log-likelihoods are exact), and prior kernels up to an additive constant."""

from __future__ import annotations

import math

import torch

__all__ = ["half_cauchy_kernel", "normal_logpdf", "poisson_logpmf", "student_t3_kernel"]

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def normal_logpdf(
    x: torch.Tensor, loc: torch.Tensor | float, scale: torch.Tensor | float
) -> torch.Tensor:
    """``log Normal(x | loc, scale)`` elementwise (broadcast shape of the arguments)."""
    z = (x - loc) / scale
    log_scale = torch.log(scale) if isinstance(scale, torch.Tensor) else math.log(scale)
    return -0.5 * z * z - log_scale - _LOG_SQRT_2PI


def poisson_logpmf(k: torch.Tensor, log_rate: torch.Tensor) -> torch.Tensor:
    """``log Poisson(k | exp(log_rate))`` elementwise."""
    return k * log_rate - torch.exp(log_rate) - torch.lgamma(k + 1)


def half_cauchy_kernel(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``log half-Cauchy(x | 0, scale)`` up to a constant: ``-log(1 + (x / scale)^2)``."""
    return -torch.log1p((x / scale) ** 2)


def student_t3_kernel(x: torch.Tensor, loc: float, scale: float) -> torch.Tensor:
    """``log Student-t(x | 3, loc, scale)`` up to a constant:
    ``-2 log(1 + ((x - loc) / scale)^2 / 3)``."""
    return -2 * torch.log1p(((x - loc) / scale) ** 2 / 3)
