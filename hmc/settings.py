"""The settings of a run: ``hmc.sample``'s arguments checked before any work starts.

Every check names the argument and what was expected. The kernel given by name is made
here, the seed drawn when none is given, and the progress bar's default decided.
"""

from __future__ import annotations

import math
import numbers
import os
import secrets
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

from hmc.adapt.low_rank import LowRank
from hmc.arrays import engine_for
from hmc.atomic import check_writable_file
from hmc.kernels.base import Kernel
from hmc.kernels.chees import ChEES
from hmc.kernels.hmc import HMC
from hmc.kernels.mams import MAMS
from hmc.kernels.nuts import NUTS
from hmc.potential import compile_choice
from hmc.progress import DisplayFactory
from hmc.store import chunk_iterations
from hmc.target import FlatTarget, Target

__all__ = [
    "ADAPTATIONS",
    "AUTO_DECISION_ITERATIONS",
    "DEFAULT_CHECKPOINT_EVERY",
    "KERNELS",
    "MAX_WARMUP",
    "METRICS",
    "Settings",
    "as_target",
    "check_memory",
    "compile_decision_at",
    "init_radius",
    "validate",
]

METRICS = ("identity", "diag", "dense", "low-rank")
#: warmup adaptations: each chain on its own (Stan's) or all chains pooled
#: (:mod:`hmc.adapt.ensemble`)
ADAPTATIONS = ("stan", "ensemble")
#: ChEES's default target for the harmonic mean of the acceptance probabilities (the
#: optimum for HMC on Gaussians, Beskos et al. 2013); NUTS and HMC target 0.8 (Stan)
CHEES_TARGET_ACCEPT = 0.651
#: MAMS's default target for the mean acceptance probability (BlackJAX's adjusted MCLMC)
MAMS_TARGET_ACCEPT = 0.9
#: ``hmc.sample(compile="auto")`` decides whether to compile once a tenth of the run's
#: iterations are done, and at least this many (:func:`compile_decision_at`)
AUTO_DECISION_ITERATIONS = 20
#: the longest warmup: its schedule holds a few bytes per iteration in memory
MAX_WARMUP = 10**9
#: iterations between checkpoints when ``checkpoint=`` is given alone
DEFAULT_CHECKPOINT_EVERY = 100
KERNELS: dict[str, Callable[[], Kernel]] = {
    "hmc": HMC,
    "nuts": NUTS,
    "chees": ChEES,
    "mams": MAMS,
}


class Settings(NamedTuple):
    """The kernel to run, the metric's name (lower case), the seed (drawn when none was
    given), whether to show progress (True: the bar; or the display's factory,
    :data:`hmc.progress.DisplayFactory`), the chains' device, the run's engine
    (:func:`hmc.arrays.engine_for`), whether to compile the energy (True, False, or
    ``"auto"``: decided during the run, :func:`compile_decision_at`), the warmup adaptation's
    name (by default ``"ensemble"`` for ChEES), the number of warmup iterations and the
    target acceptance statistic (by default Stan's 0.8, or :data:`CHEES_TARGET_ACCEPT`
    for ChEES), and for ``metric="low-rank"`` its options (:class:`hmc.LowRank`; None
    for the other metrics)."""

    kernel: Kernel
    metric: str
    seed: int
    progress: bool | DisplayFactory
    device: torch.device
    engine: str
    compile: bool | str
    adapt: str
    warmup: int
    target_accept: float
    low_rank: LowRank | None = None


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def validate(**kw: Any) -> Settings:
    """Check ``hmc.sample``'s arguments (by name); raise naming the first bad one."""
    for name, minimum in (("chains", 1), ("warmup", 0), ("draws", 1)):
        value = kw[name]
        if not _is_int(value) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if kw["warmup"] > MAX_WARMUP and (not kw["save_warmup"] or kw["store"] is not None):
        # (kept warmup draws held in memory are refused by check_memory, naming them)
        raise ValueError(
            f"warmup must be at most {MAX_WARMUP:.0e} iterations (its schedule keeps a few "
            f"bytes per iteration), got {kw['warmup']!r}"
        )
    kernel = kw["kernel"]
    if isinstance(kernel, str):
        if kernel.lower() not in KERNELS:
            raise ValueError(f"kernel must be one of {sorted(KERNELS)} or a kernel, got {kernel!r}")
        kernel = KERNELS[kernel.lower()]()
    elif isinstance(kernel, type) or not (hasattr(kernel, "step") and hasattr(kernel, "init")):
        raise TypeError(
            "kernel must be a name or a kernel instance (hmc.HMC, hmc.NUTS, hmc.ChEES, hmc.MAMS), "
            f"got {kernel!r}"
        )
    adapt = _adaptation(kw["adapt"], kernel)
    warmup = kw["warmup"]
    metric, low_rank = _metric(kw["metric"])
    target_accept = kw["target_accept"]
    if target_accept is None:
        target_accept = (
            CHEES_TARGET_ACCEPT
            if isinstance(kernel, ChEES)
            else MAMS_TARGET_ACCEPT
            if isinstance(kernel, MAMS)
            else 0.8
        )
    if not isinstance(target_accept, int | float) or not 0 < target_accept < 1:
        raise ValueError(f"target_accept must be in (0, 1), got {target_accept!r}")
    step = kw["step_size"]
    if step is not None and (
        not isinstance(step, int | float) or isinstance(step, bool) or not 0 < step < math.inf
    ):
        raise ValueError(f"step_size must be a positive finite number, got {step!r}")
    if kw["dtype"] not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {kw['dtype']!r}")
    seed = kw["seed"]
    if seed is None:
        seed = secrets.randbits(63)
    elif not _is_int(seed) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    if kw["dim"] is not None and (not _is_int(kw["dim"]) or kw["dim"] < 1):
        raise ValueError(f"dim must be a positive integer, got {kw['dim']!r}")
    _check_checkpoint(kw["checkpoint"], kw["checkpoint_every"])
    _check_store(kw["store"])
    if (
        kw["store"] is not None
        and kw["checkpoint"] is not None
        and os.path.abspath(kw["store"]) == os.path.abspath(kw["checkpoint"])
    ):
        raise ValueError(
            f"store and checkpoint name the same file ({os.fspath(kw['store'])!r}): the "
            "checkpoint would overwrite the draws; give them different paths"
        )
    for name in ("save_warmup", "batched"):
        if not isinstance(kw[name], bool | np.bool_):
            raise TypeError(f"{name} must be True or False, got {kw[name]!r}")
    progress = kw["progress"]
    if progress is not None and not isinstance(progress, bool) and not callable(progress):
        raise TypeError(
            "progress must be True, False, None or a callable (chains, warmup, draws) -> "
            f"display (hmc.progress.ProgressLines), got {progress!r}"
        )
    compile = compile_choice(kw["compile"])
    if progress is None:
        progress = sys.stderr.isatty() and not os.environ.get("CI")
    device = _device(kw["device"])
    return Settings(
        kernel,
        metric,
        int(seed),
        progress if callable(progress) else bool(progress),
        device,
        engine_for(device, kw["engine"]),
        compile,
        adapt,
        warmup,
        float(target_accept),
        low_rank,
    )


def _metric(metric: Any) -> tuple[str, LowRank | None]:
    """The metric's name (lower case) and, for the low-rank metric, its options: a name
    in :data:`METRICS` or an :class:`hmc.LowRank`."""
    if isinstance(metric, LowRank):
        return "low-rank", metric
    if not isinstance(metric, str) or metric.lower() not in METRICS:
        raise ValueError(f"metric must be one of {METRICS} or an hmc.LowRank, got {metric!r}")
    metric = metric.lower()
    return metric, LowRank() if metric == "low-rank" else None


def compile_decision_at(adapt: str, warmup: int, draws: int) -> int:
    """The iteration at which ``compile="auto"`` decides, from the measured cost of the
    eager evaluations so far, whether compiling pays for the rest of the run
    (:meth:`hmc.Potential.decide_compile`): a tenth into the run, and at least
    :data:`AUTO_DECISION_ITERATIONS` in. The pooled warmup (``adapt="ensemble"``) stops
    once the chains have settled, typically after 120-200 of its ``warmup`` iterations, so
    its run decides at the end of warmup, when only the draws are left; until then the
    energy's own count may compile it (:data:`hmc.potential.AUTO_COMPILE_CALLS`)."""
    if adapt == "ensemble":
        return warmup
    total = warmup + draws
    return min(total, max(AUTO_DECISION_ITERATIONS, total // 10))


def _adaptation(adapt: Any, kernel: Kernel) -> str:
    """The warmup adaptation's name: ``adapt`` checked, or by default ``"ensemble"`` for
    ChEES (whose trajectory length is learnt across chains) and ``"stan"`` otherwise."""
    learns_length = isinstance(kernel, ChEES)
    if adapt is None:
        return "ensemble" if learns_length else "stan"
    if not isinstance(adapt, str) or adapt.lower() not in ADAPTATIONS:
        raise ValueError(f"adapt must be one of {ADAPTATIONS}, got {adapt!r}")
    adapt = adapt.lower()
    if learns_length and adapt != "ensemble":
        raise ValueError(
            "kernel ChEES learns its trajectory length across chains: use adapt='ensemble' "
            "(the default for it)"
        )
    return adapt


def _check_checkpoint(path: Any, every: Any) -> None:
    """A checkpoint's path must be a file name in a writable folder; its interval a
    positive integer, given only with a path."""
    if every is not None and (not _is_int(every) or every < 1):
        raise ValueError(f"checkpoint_every must be a positive integer, got {every!r}")
    if path is None:
        if every is not None:
            raise ValueError("checkpoint_every needs checkpoint=PATH, where to write them")
        return
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"checkpoint must be a file path, got {type(path).__name__}")
    check_writable_file(path, "checkpoint")


def _check_store(path: Any) -> None:
    """A store's path must be a file name in a writable folder."""
    if path is None:
        return
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"store must be a file path, got {type(path).__name__}")
    check_writable_file(path, "store")


def _device(device: Any) -> torch.device:
    """The chains' device (the CPU when None), checked to exist and to hold data."""
    if device is None:
        return torch.device("cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device must name a torch device, got {device!r} ({error})") from None
    if device.type == "meta":
        raise ValueError("device must hold data: 'meta' tensors have shapes only")
    if device.type != "cpu":
        module = getattr(torch, device.type, None)
        available = module is not None and module.is_available()
        if not available or (device.index is not None and device.index >= module.device_count()):
            raise ValueError(f"device {str(device)!r} is not available on this machine")
    return device


def as_target(log_prob: Any, dim: int | None, batched: bool) -> Target:
    model = isinstance(log_prob, Target) and not callable(log_prob)
    if model or (hasattr(log_prob, "log_prob") and hasattr(log_prob, "posterior")):
        if dim is not None and dim != log_prob.dim:
            raise ValueError(
                f"dim={dim} disagrees with the model's {log_prob.dim} unconstrained dimensions "
                "(a model knows its dimension: leave dim out)"
            )
        if batched:
            raise ValueError(
                "batched=True is for plain functions: an hmc.Model batches its log density itself"
            )
        return log_prob
    if not callable(log_prob):
        raise TypeError(
            f"log_prob must be a callable or an hmc.Model, got {type(log_prob).__name__}"
        )
    return FlatTarget(log_prob, dim, batched)


def init_radius(init: Any) -> float | None:
    """The radius of random starts when ``init`` is a number, None otherwise."""
    if isinstance(init, torch.Tensor | np.ndarray) and init.ndim == 0:
        init = init.item()  # a 0-d tensor or array: a number like any other
    if isinstance(init, bool):
        raise TypeError("init must be a tensor, a dict of values, or a radius (a number), got bool")
    if not isinstance(init, numbers.Real):
        return None
    radius = float(init)
    if not (math.isfinite(radius) and radius >= 0):
        raise ValueError(
            f"init as a number is the radius R of uniform(-R, R) starts and must be finite "
            f"and >= 0, got {init!r}"
        )
    return radius


def check_memory(
    metric: str,
    chains: int,
    dim: int,
    kept: int,
    dtype: torch.dtype,
    device: torch.device,
    stored: bool = False,
    window: int = 0,
) -> None:
    """Raise before any work when the run cannot fit in memory: the ``kept`` iterations'
    draws and statistics (held twice while the output is built; one chunk on a device
    other than the CPU, and in all when ``stored`` in a file, :mod:`hmc.store`), the
    chains' states and trees, a dense metric's matrices, and the low-rank metric's
    windows of ``window`` draws and gradients per chain, against half the memory of
    ``device`` (and of the host, for the draws of a run on another device)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    per_iteration = chains * (dim * itemsize + 12 * 8)  # positions and statistics
    all_draws = 0 if stored else 2 * (kept + 1) * per_iteration
    chunk = min(kept, chunk_iterations(chains, dim, itemsize)) + 1
    trees = chains * dim * itemsize * (7 * 30 + 20)  # NUTS's stack at the deepest cap
    matrices = 4 * chains * dim * dim * itemsize if metric == "dense" else 0  # metric,
    # Cholesky, estimate, workspace
    if metric == "low-rank":  # the windows' draws and gradients (the fit's copies in float64)
        matrices = 2 * chains * window * dim * (itemsize + 8)
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if device.type == "cuda":
        available = torch.cuda.mem_get_info(device)[0]
        draws = chunk * per_iteration
        if all_draws > host // 2:
            _too_many_draws(chains, dim, kept, all_draws, host, "host memory")
    else:
        available = host
        draws = all_draws or chunk * per_iteration
    if draws + trees + matrices <= available // 2:
        return
    gib = 2**30
    if matrices > available // 2 and metric == "low-rank":
        raise ValueError(
            f"metric='low-rank' keeps each window's draws and gradients: about "
            f"{matrices / gib:.1f} GiB for {chains} chains of dimension {dim} ({window} "
            f"draws a window), more than half the {available / gib:.1f} GiB available; use "
            "a shorter warmup, fewer chains or metric='diag'"
        )
    if matrices > available // 2:
        raise ValueError(
            f"metric='dense' needs about {matrices / gib:.1f} GiB for {chains} chains of "
            f"dimension {dim} ({chains} x {dim} x {dim} matrices, several copies), more than "
            f"half the {available / gib:.1f} GiB available; use metric='diag'"
        )
    _too_many_draws(chains, dim, kept, draws + trees + matrices, available, "available")


def _too_many_draws(chains: int, dim: int, kept: int, need: int, available: int, where: str):
    gib = 2**30
    raise ValueError(
        f"{chains} chains of dimension {dim} keeping {kept} iterations each need about "
        f"{need / gib:.1f} GiB (the draws are held twice while the output is built), more "
        f"than half the {available / gib:.1f} GiB {where}; pass store=PATH to stream the "
        "draws to a file, or run fewer chains or draws"
    )
