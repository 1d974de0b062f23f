"""Stan's NUTS rules, written once for both tree layouts.

The NumPy engine's per-chain trees (:mod:`hmc.kernels.nuts_host`) call these with Python
floats and NumPy rows ``(D,)``; the batched trees (:mod:`hmc.kernels.nuts`) with tensors
whose leading axes are chains (and tree levels). Each rule is written once: only the
elementary arithmetic (``math`` or ``torch``) follows the type of the arguments. The
tree's traversal, which differs between the layouts, is not here.
"""

from __future__ import annotations

import math

import torch

from hmc.metric import all_no_u_turn

__all__ = [
    "leaf_error",
    "merged_no_u_turn",
    "new_subtree_wins",
    "right_subtree_wins",
    "turns_forward",
]

type Number = float | torch.Tensor


def leaf_error(
    energy: Number, start_energy: Number, max_energy_error: float
) -> tuple[Number, Number, Number]:
    """A new leaf's energy error ``H - H0`` (NaN counts as ``+inf``), its acceptance
    statistic ``min(1, exp(H0 - H))``, and whether it makes the transition divergent
    (``H - H0 > max_energy_error``)."""
    error = energy - start_energy
    if isinstance(error, float):
        if error != error:
            error = math.inf
        accept = math.exp(-error) if error > 0.0 else 1.0
    else:
        error = torch.nan_to_num(error, nan=math.inf, posinf=math.inf)
        accept = torch.exp(torch.clamp(-error, max=0.0))
    return error, accept, error > max_energy_error


def turns_forward(u: Number) -> Number:
    """A doubling extends the trajectory forward in time when its uniform exceeds 1/2."""
    return u > 0.5


def right_subtree_wins(u: Number, right_log_weight: Number, merged_log_weight: Number) -> Number:
    """Inside a subtree (uniform progressive sampling): when two halves merge, the right
    half's proposal is kept with probability ``w(right) / w(merged)``."""
    return u < _exp(right_log_weight - merged_log_weight)


def new_subtree_wins(u: Number, new_log_weight: Number, old_log_weight: Number) -> Number:
    """At the top level (biased progressive sampling): when a doubling completes, the new
    subtree's proposal replaces the trajectory's with probability
    ``min(1, w(new) / w(old))``."""
    difference = new_log_weight - old_log_weight
    if isinstance(difference, float):  # exp would overflow where the new one wins anyway
        return difference > 0.0 or u < math.exp(difference)
    return (difference > 0) | (u < torch.exp(difference))


def merged_no_u_turn(
    rho: Number,
    left_rho: Number,
    left_begin_v: Number,
    left_end_p: Number,
    left_end_v: Number,
    right_rho: Number,
    right_begin_p: Number,
    right_begin_v: Number,
    right_end_v: Number,
) -> Number:
    """Stan's three checks when a left and a right (sub)trajectory merge: the merged one
    (momentum sum ``rho``, from the left's first velocity to the right's last) has not
    turned, nor has the left half extended by the right's first point, nor the right half
    extended by the left's last point. ``p`` are momenta, ``v`` velocities ``M^-1 p`` at
    the halves' first (``begin``) and last (``end``) leaves."""
    return all_no_u_turn(
        (left_begin_v, right_end_v, rho),
        (left_begin_v, right_begin_v, left_rho + right_begin_p),
        (left_end_v, right_end_v, right_rho + left_end_p),
    )


def _exp(x: Number) -> Number:
    return math.exp(x) if isinstance(x, float) else torch.exp(x)
