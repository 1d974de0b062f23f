"""Checkpoints: everything a run needs to continue, written atomically, read safely.

``hmc.sample(..., checkpoint=PATH, checkpoint_every=N)`` writes ``PATH`` when every chain
has completed a multiple of ``N`` iterations, when every chain has finished its warmup,
and at the end of the run.
At those points the loop lets each chain finish its transition in flight and waits for the
others (a chain's draws depend only on the seed, its index and its own history, so the
wait changes no draw). A checkpoint holds, as plain tensors, numbers and strings:

- the run's settings (to refuse a checkpoint of another run);
- the iteration every chain has completed, and each chain's position, potential and
  gradient there (the random streams are positioned by that iteration: nothing else of
  them needs saving);
- the step sizes, inverse metrics (a low-rank metric's fields, with its matrices'
  diagonals as the inverse metric) and ChEES's trajectory lengths, and the whole
  adaptation state, Stan's per-chain warmup or the pooled one (dual averaging, the running
  (co)variance estimates or pooled moments, the step-size search's counters, the pooled
  warmup's recent log densities, trajectory-length optimiser and restarted chains), with
  the warmup iterations its early stop skipped;
- the draws and statistics recorded so far (none with ``store=PATH``: the file holds
  them), the divergences counted, the gradient evaluations and the time spent.

A checkpoint is written to a temporary file beside ``PATH``, flushed to disk and renamed,
so a run killed while writing leaves the previous checkpoint whole. It is read with
``torch.load(weights_only=True)``, which unpickles no arbitrary object; a file that is
truncated, corrupted or not a checkpoint gives an error naming it. The payload is stored
as the bytes of its own ``torch.save`` with their SHA-256 (:data:`FORMAT`): torch's zip
reader checks no checksum, so without it a few flipped bytes could resume to wrong draws.
Files of the earlier layouts (:data:`LAYOUTS`, no checksum) still read.

Running ``hmc.sample`` again with the same arguments and ``checkpoint=PATH`` continues
from ``PATH`` when it exists (``hmc.resume(PATH, log_prob)`` does the same, taking the
settings from the file); a finished run's checkpoint gives its result at once. The result
equals an uninterrupted run with the same checkpoints, bit for bit on the same machine.
After Ctrl-C or a kill, the run continues from its last checkpoint. (Waiting at a
checkpoint changes which chains share a batched evaluation of the density, so a density
whose batched arithmetic rounds a row differently in another batch gives draws that
differ from a run without checkpoints in the last bits, and then further.)
"""

from __future__ import annotations

import hashlib
import io
import os
import typing
from typing import Any, NamedTuple

import numpy as np
import torch

from hmc.adapt.ensemble import EnsembleState
from hmc.adapt.step_size import DualAveragingState
from hmc.adapt.trajectory_length import EnsembleLengthState, StanLengthState
from hmc.adapt.warmup import WarmupState
from hmc.adapt.welford import WelfordState, welford_init
from hmc.atomic import write_atomically
from hmc.metric import LowRankMetric, Metric, inverse_diagonal, metric_from_inverse
from hmc.state import State

__all__ = [
    "FORMAT",
    "LAYOUT",
    "LAYOUTS",
    "Snapshot",
    "raw_payload",
    "read_checkpoint",
    "saved_metric",
    "write_checkpoint",
]

#: the mark of a checkpoint file, and its layout's version (version 1, written before the
#: pooled warmup could be saved, held Stan's warmup state as lists; it is still read)
#: the file: the payload's bytes and their SHA-256
FORMAT = ("hmc-checkpoint", 3)
#: the layout of the payload written now, and those of earlier files (payload alone)
LAYOUT = ("hmc-checkpoint", 2)
LAYOUTS = (("hmc-checkpoint", 1), LAYOUT)
#: the adaptation states a checkpoint can hold, by name
ADAPTATIONS = {
    cls.__name__: cls for cls in (WarmupState, EnsembleState, StanLengthState, EnsembleLengthState)
}


class Snapshot(NamedTuple):
    """The loop's side of a checkpoint, at an iteration every chain has completed.

    iteration : the iteration count of every chain.
    state : each chain's position ``(C, D)``, potential ``(C,)`` and gradient there.
    step_size : ``(C,)``; metric : the chains' metric (:mod:`hmc.metric`).
    adaptation : the warmup's state, or None when nothing adapts.
    positions, stats : the recorder's buffers; divergences : counted so far.
    warmup_seconds : the time until every chain left warmup (None before); useful, slots :
        the utilization sums; seconds : the loop's time so far.
    trajectory_length : ChEES's ``(C,)``, or None.
    skipped : the warmup iterations ``[a, b)`` the pooled warmup's early stop skipped, or
        None.
    """

    iteration: int
    state: State
    step_size: Any
    metric: Metric
    adaptation: WarmupState | None
    positions: Any
    stats: dict[str, Any]
    divergences: int
    warmup_seconds: float | None
    useful: float
    slots: float
    seconds: float
    trajectory_length: Any = None
    skipped: tuple[int, int] | None = None


def write_checkpoint(path: str | os.PathLike, snapshot: Snapshot, extra: dict[str, Any]) -> None:
    """Write ``snapshot`` and ``extra`` (settings, counters: plain values) to ``path``
    atomically."""
    tensor = _tensor
    adaptation, metric = snapshot.adaptation, snapshot.metric
    low_rank = isinstance(metric, LowRankMetric)
    payload = {
        "format": list(LAYOUT),
        **extra,
        "iteration": snapshot.iteration,
        "state": [tensor(x) for x in snapshot.state],
        "step_size": tensor(snapshot.step_size),
        "inverse_metric": tensor(inverse_diagonal(metric) if low_rank else metric.inverse),
        "low_rank_metric": [tensor(x) for x in metric] if low_rank else None,
        "adaptation": None
        if adaptation is None
        else {"kind": type(adaptation).__name__, "fields": _plain(adaptation)},
        "trajectory_length": None
        if snapshot.trajectory_length is None
        else tensor(snapshot.trajectory_length),
        "skipped": None if snapshot.skipped is None else list(snapshot.skipped),
        "positions": tensor(snapshot.positions),
        "stats": {name: tensor(x) for name, x in snapshot.stats.items()},
        "divergences": int(snapshot.divergences),
        "warmup_seconds": snapshot.warmup_seconds,
        "useful": float(snapshot.useful),
        "slots": float(snapshot.slots),
        "seconds": float(snapshot.seconds),
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getvalue()
    sealed = {
        "format": list(FORMAT),
        "sha256": hashlib.sha256(data).hexdigest(),
        "payload": torch.frombuffer(bytearray(data), dtype=torch.uint8),
    }
    write_atomically(path, lambda temporary: torch.save(sealed, temporary))


def saved_metric(saved: dict[str, Any]) -> Metric:
    """The metric record of a read checkpoint (:func:`read_checkpoint`)."""
    low_rank = saved.get("low_rank_metric")
    if low_rank is not None:
        return LowRankMetric(*low_rank)
    return metric_from_inverse(saved["inverse_metric"])


def raw_payload(path: str | os.PathLike) -> dict[str, Any]:
    """The payload of the checkpoint at ``path`` as written (plain values and tensors),
    its checksum verified; raises ``ValueError`` naming ``path`` when it cannot be read,
    fails its checksum or is not an hmc checkpoint."""
    contents = _load(path, path)
    if not isinstance(contents, dict) or tuple(contents.get("format", ())) not in (
        FORMAT,
        *LAYOUTS,
    ):
        raise ValueError(f"{str(path)!r} is not an hmc checkpoint (format {FORMAT})")
    if tuple(contents["format"]) != FORMAT:  # an earlier layout, without checksum
        return contents
    try:
        data = contents["payload"].numpy().tobytes()
        digest = contents["sha256"]
    except (KeyError, AttributeError) as error:
        raise ValueError(
            f"checkpoint {str(path)!r} is incomplete or damaged ({type(error).__name__}: "
            f"{error}): it has the marker of an hmc checkpoint but not its contents"
        ) from None
    if hashlib.sha256(data).hexdigest() != digest:
        raise ValueError(
            f"checkpoint {str(path)!r} is corrupted: its contents do not match their "
            "checksum; resume from another copy or start the run afresh"
        )
    return _load(io.BytesIO(data), path)


def _load(source: Any, path: str | os.PathLike) -> Any:
    """``torch.load`` of ``source`` (the file at ``path``, or its payload's bytes), with
    no arbitrary object unpickled; raises ``ValueError`` naming ``path``."""
    try:
        return torch.load(source, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as error:  # truncated, corrupted, or a pickle of other objects
        raise ValueError(
            f"checkpoint {str(path)!r} cannot be read ({type(error).__name__}: "
            f"{(str(error).splitlines() or [''])[0][:200]}); it is truncated, corrupted or "
            "not an hmc checkpoint"
        ) from None


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The payload of the checkpoint at ``path``, its records rebuilt (tensors on the
    CPU); raises ``ValueError`` naming ``path`` when it is not a whole checkpoint."""
    payload = raw_payload(path)
    if not isinstance(payload, dict) or tuple(payload.get("format", ())) not in LAYOUTS:
        raise ValueError(f"{str(path)!r} is not an hmc checkpoint (format {FORMAT})")
    try:
        return _rebuilt(payload)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(
            f"checkpoint {str(path)!r} is incomplete or damaged ({type(error).__name__}: "
            f"{error}): it has the marker of an hmc checkpoint but not its contents"
        ) from None


def _rebuilt(payload: dict[str, Any]) -> dict[str, Any]:
    """A read checkpoint's payload with its records rebuilt; raises KeyError or
    TypeError where a part is missing or malformed."""
    payload["state"] = State(*payload["state"])
    adaptation = payload["adaptation"]
    if adaptation is not None and "kind" not in adaptation:  # version 1
        adaptation = {
            "kind": WarmupState.__name__,
            "fields": {
                "dual_averaging": dict(
                    zip(DualAveragingState._fields, adaptation["dual_averaging"], strict=True)
                ),
                "welford": dict(zip(WelfordState._fields, adaptation["welford"], strict=True)),
                "search_counter": adaptation["search_counter"],
            },
        }
    if adaptation is not None:
        fields = adaptation["fields"]
        if adaptation["kind"] == WarmupState.__name__ and "log_density" not in fields:
            # written before Stan's warmup restarted stranded chains: the window's log
            # density counts from the resume on
            chains = fields["welford"]["mean"].shape[0]
            fields = {
                **fields,
                "log_density": _plain(welford_init(fields["welford"]["mean"][:, :1], False)),
                "restarted": torch.zeros(chains, dtype=torch.bool),
            }
        payload["adaptation"] = _record(ADAPTATIONS[adaptation["kind"]], fields)
    skipped = payload.get("skipped")
    payload["skipped"] = None if skipped is None else tuple(skipped)
    payload.setdefault("trajectory_length", None)
    return payload


def _plain(record: Any) -> Any:
    """A record (nested NamedTuples of arrays, or None) as nested dicts of CPU tensors."""
    if record is None:
        return None
    if isinstance(record, tuple) and hasattr(record, "_fields"):
        return {name: _plain(value) for name, value in zip(record._fields, record, strict=True)}
    return _tensor(record)


def _record(cls: type, fields: dict[str, Any]) -> Any:
    """The record of type ``cls`` written by :func:`_plain`, its nested records' types
    read from ``cls``'s annotations."""
    hints = typing.get_type_hints(cls)
    values = []
    for name in cls._fields:
        # a field added since the file was written takes its default
        value = fields[name] if name in fields else cls._field_defaults[name]
        nested = _record_type(hints[name])
        values.append(_record(nested, value) if nested and value is not None else value)
    return cls(*values)


def _record_type(hint: Any) -> type | None:
    """The NamedTuple class in an annotation (``X`` or ``X | None``), or None."""
    for option in typing.get_args(hint) or (hint,):
        if isinstance(option, type) and issubclass(option, tuple) and hasattr(option, "_fields"):
            return option
    return None


def _tensor(x: Any) -> torch.Tensor:
    """A CPU tensor of ``x`` (a NumPy array or a tensor), sharing nothing with the run."""
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x.copy())
    return x.detach().to("cpu", copy=True)
