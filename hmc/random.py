"""Counter-based random streams, one per chain.

A chain's random numbers depend only on ``(seed, chain index, stream, counter)``: never on
how many other chains run beside it, on which device, or in which order chains finish their
transitions. Every value is a pure function of those integers (SplitMix64 finalisers over a
Weyl sequence, computed with wrapping ``int64`` arithmetic), so a batch of chains draws all
its numbers in a handful of vectorised tensor operations, with no per-chain generator calls
and no host round trip.

Streams separate the purposes of the draws (momentum, acceptance, tree building, ...), so
that adding a draw of one kind never shifts the numbers of another.
"""

from __future__ import annotations

import math
from enum import IntEnum

import torch

__all__ = [
    "Stream",
    "chain_keys",
    "normal",
    "stream_keys",
    "uniform",
    "uniform_at",
    "uniform_at_scalar",
]

_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64
_MIX1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MIX2 = -7723592293110705685  # 0x94D049BB133111EB


class Stream(IntEnum):
    """Independent purposes a chain draws random numbers for."""

    INIT = 1
    MOMENTUM = 2
    ACCEPT = 3
    TREE = 4
    STEPS = 5
    STEP_SIZE_SEARCH = 6


def _wrap(value: int) -> int:
    """A Python integer reduced to the signed 64-bit range (two's complement)."""
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of an int64 tensor (torch's ``>>`` is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser: a bijection of 64-bit integers with full avalanche."""
    x = (x ^ _shift_right(x, 30)) * _MIX1
    x = (x ^ _shift_right(x, 27)) * _MIX2
    return x ^ _shift_right(x, 31)


def chain_keys(seed: int, chains: torch.Tensor) -> torch.Tensor:
    """Per-chain keys: ``(C,)`` int64 from a seed and chain indices ``(C,)``."""
    seed_key = _mix(torch.tensor(_wrap(seed), dtype=torch.int64) + _GOLDEN)
    return _mix(seed_key.to(chains.device) ^ _mix(chains.to(torch.int64) * _GOLDEN + 1))


def stream_keys(keys: torch.Tensor, stream: Stream) -> torch.Tensor:
    """Chain keys ``(C,)`` mixed with the stream, so that streams never overlap (made once
    by callers that draw from one stream many times, see :func:`uniform_at`)."""
    return _mix(keys ^ _wrap(int(stream) * _GOLDEN))


def _bits(keys: torch.Tensor, stream: Stream, counter: torch.Tensor, n: int) -> torch.Tensor:
    """``(C, ..., n)`` raw 64-bit values for chain keys ``(C,)`` and counters ``(C, ...)``.

    Value ``j`` of draw ``counter`` is ``mix(key_s + (counter * n_max + j) * golden)`` with
    ``key_s`` the chain key mixed with the stream, i.e. SplitMix64's output sequence.
    """
    key = stream_keys(keys, stream)
    shape = (-1,) + (1,) * (counter.dim() - 1)
    index = counter.unsqueeze(-1) * (1 << 20) + torch.arange(n, device=counter.device)
    return _mix(key.view(shape).unsqueeze(-1) + index * _GOLDEN)


def uniform(
    keys: torch.Tensor,
    stream: Stream,
    counter: torch.Tensor,
    n: int,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Uniform numbers in the open interval (0, 1).

    Parameters
    ----------
    keys : ``(C,)`` int64 chain keys from :func:`chain_keys`.
    stream : the purpose of the draw.
    counter : ``(C,)`` or ``(C, K)`` int64 draw counters; each counter names one draw of
        ``n`` values (at most 2**20 values per draw).
    n : values per draw.

    Returns
    -------
    ``counter.shape + (n,)`` tensor of uniforms in the open interval (0, 1), with 52
    random bits in float64 (23 in float32).
    """
    return _to_unit_interval(_bits(keys, stream, counter, n), dtype)


def normal(
    keys: torch.Tensor,
    stream: Stream,
    counter: torch.Tensor,
    n: int,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Standard normal numbers (Box-Muller over pairs of 52-bit uniforms).

    Same arguments as :func:`uniform`; returns ``counter.shape + (n,)``.
    """
    pairs = (n + 1) // 2
    u = uniform(keys, stream, counter, 2 * pairs, torch.float64)
    radius = torch.sqrt(-2.0 * torch.log(u[..., :pairs]))
    angle = (2.0 * math.pi) * u[..., pairs:]
    z = torch.cat((radius * torch.cos(angle), radius * torch.sin(angle)), dim=-1)
    return z[..., :n].to(dtype)


def uniform_at(
    stream_key: torch.Tensor, index: torch.Tensor, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """One uniform in (0, 1) per entry of ``index`` ``(C, ...)`` (any int64 values): value
    number ``index`` of each chain's stream, whose ``(C,)`` keys come from
    :func:`stream_keys` (mixed once by callers that draw from one stream many times)."""
    key = stream_key.view((-1,) + (1,) * (index.dim() - 1))
    return _to_unit_interval(_mix(key + index * _GOLDEN), dtype)


_MASK = (1 << 64) - 1


def uniform_at_scalar(stream_key: int, index: int) -> float:
    """:func:`uniform_at` for one chain in plain Python integers: value number ``index``
    of the stream whose key (an element of :func:`stream_keys`, as a Python int) is
    ``stream_key``. Bit-identical to the float64 tensor version."""
    x = (stream_key + index * _GOLDEN) & _MASK
    x = ((x ^ (x >> 30)) * _MIX1) & _MASK
    x = ((x ^ (x >> 27)) * _MIX2) & _MASK
    return (((x ^ (x >> 31)) >> 12) + 0.5) * 2.0**-52


def _to_unit_interval(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Uniforms strictly inside (0, 1) from random 64-bit integers.

    The top ``m`` bits, with ``m`` one less than the precision of ``dtype`` (52 for
    float64, 23 for float32), give ``(k + 1/2) / 2**m``: exactly representable in
    ``dtype``, so nothing rounds to 0 or 1.
    """
    mantissa = {torch.float64: 52, torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}[dtype]
    top = _shift_right(bits, 64 - mantissa)
    return ((top.to(torch.float64) + 0.5) * 2.0**-mantissa).to(dtype)
