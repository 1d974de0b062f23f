"""The driver: ``hmc.sample`` validates its arguments, finds initial points, runs warmup
and sampling for all chains at once, and returns an ArviZ ``DataTree``.

Each chain iterates on its own counter: a chain that finishes a transition is recorded,
adapted (during its own warmup) and moved on, whatever the other chains are doing. The loop
reads a few counters from the device once per kernel call, never per leapfrog step; a
kernel that moves all chains in lockstep (static HMC), or that reports on the host which
chains finished (NUTS with its trees on the host), runs from host counters alone.
"""

from __future__ import annotations

import importlib.metadata
import math
import numbers
import os
import secrets
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

from hmc._torch_compat import distribution_validation_off as _distribution_validation_off
from hmc.adapt.schedule import build_schedule
from hmc.adapt.warmup import warmup_init, warmup_update
from hmc.arrays import as_arrays, as_tensors, engine_for
from hmc.kernels.base import Kernel, Params
from hmc.kernels.hmc import HMC
from hmc.kernels.nuts import NUTS
from hmc.metric import metric_from_inverse
from hmc.potential import Potential
from hmc.random import Stream, chain_keys, uniform
from hmc.state import State
from hmc.target import FlatTarget, Target
from hmc.to_arviz import to_datatree

__all__ = ["sample"]

METRICS = ("identity", "diag", "dense")
MAX_INIT_TRIES = 100
#: Random starts are uniform(-R, R) on the unconstrained scale (Stan's default R = 2).
DEFAULT_INIT_RADIUS = 2.0


KERNELS: dict[str, Callable[[], Kernel]] = {"hmc": HMC, "nuts": NUTS}


def sample(
    log_prob: Callable[[torch.Tensor], torch.Tensor] | Target,
    init: Any = None,
    *,
    dim: int | None = None,
    chains: int = 4,
    warmup: int = 1000,
    draws: int = 1000,
    kernel: str | Kernel = "nuts",
    metric: str = "diag",
    target_accept: float = 0.8,
    step_size: float | None = None,
    seed: int | None = None,
    dtype: torch.dtype = torch.float64,
    device: str | torch.device | None = None,
    save_warmup: bool = False,
    progress: bool | None = None,
    batched: bool = False,
    engine: str = "auto",
):
    """Draw from a log density with HMC or NUTS; return an ArviZ ``DataTree``.

    Parameters
    ----------
    log_prob : callable or hmc.Model
        ``log_prob(q)`` for one position ``(D,)`` returning a 0-d tensor (batched over
        chains with ``torch.func.vmap``), or ``(C, D) -> (C,)`` with ``batched=True``; or an
        :class:`hmc.Model` with named, constrained parameters.
    init : tensor, dict or number, optional
        ``(D,)`` (every chain) or ``(chains, D)`` starts; for a model, a dict of constrained
        values. Without it each chain draws uniform(-2, 2) starts on the unconstrained
        scale, retrying up to 100 times until the value and gradient are finite. A number
        ``R >= 0`` draws them from uniform(-R, R) instead (CmdStan's ``init=R``; ``0``
        starts every chain at zero): a smaller radius keeps chains out of far regions
        where a density is numerically flat or explodes.
    dim : int, optional
        The dimension D, required for a plain callable without ``init``.
    chains, warmup, draws : int
        Number of chains; warmup (adaptation) and kept iterations per chain.
    kernel : "nuts", "hmc", or a kernel instance (:class:`hmc.NUTS`, :class:`hmc.HMC`)
    metric : "diag" (default), "dense" or "identity" (not adapted)
    target_accept : float
        Dual averaging's target acceptance statistic (Stan's delta, 0.8).
    step_size : float, optional
        Initial step size (default 1, then Stan's heuristic). With ``warmup=0`` it is used
        as is; without it and without warmup, the heuristic alone sets it.
    seed : int, optional
        Chain ``c`` draws its random numbers from ``(seed, c)`` only: the same seed and
        settings give bit-identical output on the CPU. Random when not given (and then
        stored in the output's attrs).
    dtype, device : where the chains live (float64 on the CPU by default).
    save_warmup : bool
        Also return the ``warmup_posterior`` and ``warmup_sample_stats`` groups.
    progress : bool, optional
        Show a progress bar; by default when standard error is a terminal and the ``CI``
        environment variable is not set.
    batched : bool
        ``log_prob`` takes ``(C, D)`` and returns ``(C,)``.
    engine : "auto", "numpy" or "torch"
        Where the sampler's own arithmetic runs (:mod:`hmc.arrays`): ``"auto"`` picks
        NumPy on the CPU and torch on other devices, once per run, whatever the number of
        chains (recorded in the attrs). ``log_prob`` receives tensors either way. The two
        engines run the same transitions from the same random numbers and differ only in
        rounding.

    Returns
    -------
    xarray.DataTree
        ``posterior`` (variable ``x`` with dims ``(chain, draw, x_dim_0)`` for a callable,
        the model's names otherwise), ``sample_stats`` (``lp``, ``acceptance_rate``,
        ``step_size``, ``n_steps``, ``diverging``, ``energy``, ``energy_error``,
        ``max_energy_error``, and for NUTS ``tree_depth``, ``reached_max_treedepth``),
        ``adaptation`` (the adapted step size and inverse metric per chain) and attrs
        (``inference_library``, version, ``sampling_time``, ``n_gradient_evaluations``...).

    Examples
    --------
    >>> import torch, hmc
    >>> dt = hmc.sample(lambda q: -0.5 * (q**2).sum(), dim=2, chains=2, draws=200,
    ...                 warmup=200, seed=1, progress=False)
    >>> dict(dt["posterior"].sizes)
    {'chain': 2, 'draw': 200, 'x_dim_0': 2}
    """
    settings = _validate(
        chains=chains,
        warmup=warmup,
        draws=draws,
        kernel=kernel,
        metric=metric,
        target_accept=target_accept,
        step_size=step_size,
        seed=seed,
        dtype=dtype,
        save_warmup=save_warmup,
        progress=progress,
        dim=dim,
    )
    seed = settings.seed
    device = torch.device(device) if device is not None else torch.device("cpu")
    engine = engine_for(device, engine)
    target = _as_target(log_prob, dim, batched)
    potential = Potential(target.log_prob, batched=target.batched)
    keys = chain_keys(seed, torch.arange(chains, device=device))

    started = time.perf_counter()
    radius = _init_radius(init)
    position = target.initial_positions(init, chains, dtype, device) if radius is None else None
    radius = DEFAULT_INIT_RADIUS if radius is None else radius
    state = _initial_state(target, potential, position, keys, chains, dtype, device, radius)
    dim = state.position.shape[1]
    _check_dense_memory(metric, chains, dim, dtype, device)

    unit = torch.ones(chains, dim, dtype=dtype, device=device)
    params = Params(
        torch.full((chains,), step_size or 1.0, dtype=dtype, device=device),
        metric_from_inverse(torch.diag_embed(unit) if metric == "dense" else unit),
    )
    recorder = _Recorder(chains, warmup, draws, dim, save_warmup, settings.kernel, state)
    tuning_started = time.perf_counter()
    if warmup > 0 or step_size is None:
        warm, params = warmup_init(state, params, potential, keys, dense=metric == "dense")
    else:
        warm = None
    schedule = build_schedule(warmup, device=device)
    run = _Loop(
        kernel=settings.kernel,
        potential=potential,
        keys=keys,
        warmup=warmup,
        draws=draws,
        schedule=schedule,
        host_schedule=as_arrays(schedule) if engine == "numpy" else None,
        target_accept=target_accept,
        adapt_metric=metric != "identity",
        progress=settings.progress,
        engine=engine,
    )
    # Once for the run, not per evaluation: distribution argument checks off, and no NumPy
    # warnings when the host kernels' arithmetic overflows on a divergent trajectory (an
    # infinite energy there is a rejection or a divergence, as on tensors).
    with _distribution_validation_off(), np.errstate(over="ignore", invalid="ignore"):
        params, timing = run(state, params, warm, recorder)
    finished = time.perf_counter()

    draws_array = recorder.positions[:, recorder.kept - draws : recorder.kept].numpy(force=True)
    attrs = {
        "inference_library": "hmc",
        "inference_library_version": _version(),
        "sampling_time": finished - tuning_started - timing["warmup"],
        "warmup_time": timing["warmup"],
        "total_time": finished - started,
        "tuning_steps": warmup,
        "n_gradient_evaluations": potential.evaluations,
        "seed": seed,
        "kernel": type(settings.kernel).__name__,
        "kernel_settings": str(settings.kernel),
        "metric": metric,
        "chain_utilization": timing["utilization"],
        "torch_version": str(torch.__version__),
        "device": str(device),
        "engine": engine,
    }
    dims, coords = target.dims_and_coords()
    warmup_groups = {}
    if save_warmup:
        warm_draws = recorder.positions[:, :warmup].numpy(force=True)
        warmup_groups = {
            "warmup_posterior": target.posterior(warm_draws),
            "warmup_sample_stats": recorder.stats(slice(0, warmup)),
        }
    tree = to_datatree(
        target.posterior(draws_array),
        recorder.stats(slice(recorder.kept - draws, recorder.kept)),
        extra_groups=target.extra_groups(draws_array),
        dims=dims,
        coords=coords,
        attrs=attrs,
        **warmup_groups,
    )
    _attach_adaptation(tree, params)
    return tree


# ---------------------------------------------------------------------- the loop
class _Loop(NamedTuple):
    kernel: Kernel
    potential: Potential
    keys: torch.Tensor
    warmup: int
    draws: int
    schedule: Any
    host_schedule: Any  # the schedule with NumPy masks (CPU runs), for the host loop
    target_accept: float
    adapt_metric: bool
    progress: bool
    engine: str

    def __call__(self, state: State, params: Params, warm, recorder: _Recorder):
        chains = state.position.shape[0]
        total = self.warmup + self.draws
        kernel_state = self.kernel.init(
            as_arrays(state) if self.engine == "numpy" else state, total
        )
        bar = _progress_bar(chains * total, self.progress)
        run = self._lockstep if getattr(self.kernel, "synchronous", False) else self._async
        params, timing = run(kernel_state, params, warm, recorder, bar)
        if bar is not None:
            bar.close()
        return params, timing

    def _async(self, kernel_state, params: Params, warm, recorder: _Recorder, bar):
        """Chains on their own iterations: one host read of a few counters per call; none
        when the kernel reports on the host which chains finished (``host_done``), and the
        loop then keeps its counters, masks, step sizes and adaptation state in NumPy."""
        chains = recorder.rows.shape[0]
        total = self.warmup + self.draws
        host = getattr(kernel_state, "host_done", None) is not None
        if host:
            iteration = np.zeros(chains, dtype=np.int64)
            params, warm = _numpy_step_sizes(params), as_arrays(warm)
        else:
            iteration = torch.zeros(chains, dtype=torch.int64, device=recorder.rows.device)
        warmup_seconds, started = 0.0, time.perf_counter()
        useful = slots = 0
        counts = _Counts(False, False, False, 0, 0, chains if self.warmup > 0 else 0, 0, chains)
        sampling = iteration >= self.warmup
        while True:
            was_warming, done_so_far = counts.warming, counts.total_done
            kernel_state, done = self.kernel.advance(
                kernel_state, params, self.potential, self.keys, sampling
            )
            if host:
                counts = self._host_counts(kernel_state, done, iteration, counts, total)
            else:
                kernel_state, counts = self._read_counts(kernel_state, done, iteration, total)
            if counts.any_done:
                new_state, info = self.kernel.report(kernel_state)
                if host:
                    finished = kernel_state.host_done
                    recorder.write_rows(
                        finished, iteration[finished], new_state, info, params.step_size
                    )
                else:
                    recorder.write(done, iteration, new_state, info, params.step_size)
                if counts.any_adapting and warm is not None:
                    adapting = done & (iteration < self.warmup)
                    warm, params = self._adapt(
                        warm, params, adapting, iteration, info, new_state, counts.any_window_end
                    )
                iteration = iteration + done
                sampling = iteration >= self.warmup
            if counts.warming == 0 and warmup_seconds == 0.0:
                warmup_seconds = time.perf_counter() - started
            if was_warming == 0:  # every chain was sampling during this call
                useful += counts.busy
                slots += counts.alive
            if bar is not None and counts.any_done:
                _show(bar, counts.total_done - done_so_far, recorder)
            if counts.least >= total:
                break
        if host:
            params = _tensor_step_sizes(params)
        utilization = useful / slots if slots else 1.0
        return params, {"warmup": warmup_seconds, "utilization": utilization}

    def _read_counts(
        self, kernel_state, done: torch.Tensor, iteration: torch.Tensor, total: int
    ) -> tuple[Any, _Counts]:
        """The loop's counters after a call, read from the device in one go (with the
        kernel's own flags, handed back to it)."""
        advanced = iteration + done.to(iteration.dtype)
        kernel_flags = getattr(kernel_state, "flags", iteration[:0])
        window_end = self.schedule.window_end  # (warmup,)
        if window_end.numel():
            ends = done & window_end[iteration.clamp(0, window_end.numel() - 1)]
            ends = ends & (iteration < self.warmup)
        else:
            ends = done & False
        values = torch.cat(
            (
                torch.stack(
                    (
                        done.any(),
                        (done & (iteration < self.warmup)).any(),
                        ends.any(),
                        advanced.sum(),
                        advanced.min(),
                        (advanced < self.warmup).sum(),
                        getattr(kernel_state, "busy", iteration < total).sum(),
                        (iteration < total).sum(),
                    )
                ),
                kernel_flags.to(torch.int64),
            )
        ).tolist()
        if kernel_flags.numel():
            kernel_state = self.kernel.with_host_flags(kernel_state, values[8:])
        return kernel_state, _Counts(*values[:8])

    def _host_counts(
        self,
        kernel_state,
        done: np.ndarray,
        iteration: np.ndarray,
        before: _Counts,
        total: int,
    ) -> _Counts:
        """The loop's counters after a call of a kernel that reports its finished chains
        on the host (``done`` ``(C,)`` and ``iteration`` ``(C,)`` NumPy, before the
        chains that finished move on)."""
        finished = kernel_state.host_done
        if not (finished or before.any_done) and kernel_state.host_busy == before.busy:
            return before  # nothing moved on since the last call
        # the chains not yet through: unchanged unless a chain finished in the last call
        alive = int(np.count_nonzero(iteration < total)) if before.any_done else before.alive
        if not finished:
            return _Counts(
                False,
                False,
                False,
                before.total_done,
                before.least,
                before.warming,
                kernel_state.host_busy,
                alive,
            )
        at = iteration[finished].tolist()
        advanced = iteration + done
        return _Counts(
            any_done=True,
            any_adapting=min(at) < self.warmup,
            any_window_end=any(self.schedule.ends_window(i) for i in at),
            total_done=before.total_done + len(finished),
            least=int(advanced.min()),
            warming=int(np.count_nonzero(advanced < self.warmup)),
            busy=kernel_state.host_busy,
            alive=alive,
        )

    def _lockstep(self, kernel_state, params: Params, warm, recorder: _Recorder, bar):
        """Kernels whose every call is one iteration of every chain (static HMC): the
        counters live on the host, and nothing is read from the device. A kernel that
        keeps its chains on the host (``on_host``) gets NumPy masks and step sizes, and
        the adaptation state is kept in NumPy, as in :meth:`_async`."""
        chains = recorder.rows.shape[0]
        device = recorder.rows.device
        host = getattr(kernel_state, "on_host", False)
        if host:
            params, warm = _numpy_step_sizes(params), as_arrays(warm)
            warming = np.zeros(chains, dtype=bool)  # the sampling masks
        else:
            warming = torch.zeros(chains, dtype=torch.bool, device=device)
        sampling = ~warming
        warmup_seconds, started = 0.0, time.perf_counter()
        useful = 0.0  # becomes a tensor (no device read) or a NumPy float, as busy is
        for t in range(self.warmup + self.draws):
            if t == self.warmup:
                warmup_seconds = time.perf_counter() - started
            kernel_state, done = self.kernel.advance(
                kernel_state,
                params,
                self.potential,
                self.keys,
                warming if t < self.warmup else sampling,
            )
            new_state, info = self.kernel.report(kernel_state)
            recorder.write_slot(t, new_state, info, params.step_size)
            if t >= self.warmup:
                useful = useful + kernel_state.busy.sum()
            elif warm is not None:
                iteration = np.full(chains, t) if host else torch.full((chains,), t, device=device)
                window_end = self.schedule.ends_window(t)
                warm, params = self._adapt(
                    warm, params, done, iteration, info, new_state, window_end
                )
            if bar is not None:
                _show(bar, chains, recorder)
        if host:
            params = _tensor_step_sizes(params)
        utilization = float(useful) / (chains * self.draws)
        return params, {"warmup": warmup_seconds, "utilization": utilization}

    def _adapt(
        self, warm, params: Params, done, iteration, info, new_state: State, window_ends: bool
    ):
        """Warmup's update for the chains ``done`` ``(C,)`` after their ``iteration``
        (``window_ends``: whether any of them ends a slow window, from host counters).
        The host loop's NumPy state is updated in NumPy, except at a window end: that
        update runs on tensors sharing the arrays' memory."""
        on_host = isinstance(done, np.ndarray)
        if on_host and window_ends:
            warm, params = self._adapt(
                as_tensors(warm),
                _tensor_step_sizes(params),
                torch.from_numpy(done),
                torch.from_numpy(iteration),
                as_tensors(info),
                as_tensors(new_state),
                window_ends,
            )
            return as_arrays(warm), _numpy_step_sizes(params)
        return warmup_update(
            warm,
            params,
            self.host_schedule if on_host else self.schedule,
            done,
            iteration,
            info.acceptance_rate,
            new_state,
            self.potential,
            self.keys,
            self.target_accept,
            self.adapt_metric,
            window_ends,
        )


class _Counts(NamedTuple):
    """What the loop needs to know after each kernel call: whether any chain finished a
    transition (and any in its warmup, and any at the end of a slow window), the
    transitions done so far (all chains, and the fewest of one chain), the chains still in
    warmup, the chains that did leapfrog work in the call and the chains that had
    transitions left at its start."""

    any_done: bool
    any_adapting: bool
    any_window_end: bool
    total_done: int
    least: int
    warming: int
    busy: int
    alive: int


def _numpy_step_sizes(params: Params) -> Params:
    """``params`` for the host loop: NumPy step sizes sharing the CPU tensor's memory (the
    metric stays tensors; the host kernels convert it when it changes)."""
    return Params(params.step_size.numpy(), params.metric)


def _tensor_step_sizes(params: Params) -> Params:
    """The inverse of :func:`_numpy_step_sizes`."""
    return Params(torch.from_numpy(params.step_size), params.metric)


def _show(bar, new_draws: int, recorder: _Recorder) -> None:
    bar.update(new_draws)
    bar.set_postfix(divergences=int(recorder.divergences), refresh=False)


class _Recorder:
    """Device buffers for positions and statistics, written per chain at its iteration.

    Each buffer has one spare column past the ``kept`` draws: a write for every chain
    sends the chains with nothing to record there, so it is one scatter per buffer.
    """

    def __init__(
        self,
        chains: int,
        warmup: int,
        draws: int,
        dim: int,
        save_warmup: bool,
        kernel: Kernel,
        state: State,
    ) -> None:
        self.offset = 0 if save_warmup else warmup
        self.kept = warmup + draws - self.offset
        like = state.position
        self.rows = torch.arange(chains, device=like.device)
        self.width = width = self.kept + 1  # the spare column
        self.positions = torch.zeros(chains, width, dim, dtype=like.dtype, device=like.device)
        self.buffers: dict[str, torch.Tensor] = {
            "lp": torch.zeros(chains, width, dtype=like.dtype, device=like.device),
            "step_size": torch.zeros(chains, width, dtype=like.dtype, device=like.device),
        }
        self.names = tuple(kernel.stat_names)
        # for the progress bar: a tensor once device writes add to it (no device read), a
        # host int while NumPy writes do (an in-place tensor add per iteration otherwise)
        self.divergences: int | torch.Tensor = 0
        # on the CPU, NumPy views of the buffers: each write is then a NumPy assignment,
        # not a tensor operation
        self.views: dict[str, np.ndarray] | None = None
        if like.device.type == "cpu":
            self.views = {"x": self.positions.numpy()}
            self.views.update((name, b.numpy()) for name, b in self.buffers.items())

    def write(
        self,
        done: torch.Tensor,
        iteration: torch.Tensor,
        state: State,
        info: NamedTuple,
        step_size: torch.Tensor,
    ) -> None:
        """Record the chains ``done`` ``(C,)`` at their ``iteration`` ``(C,)``."""
        slot = iteration - self.offset
        keep = done & (slot >= 0) & (slot < self.kept)
        slot = torch.where(keep, slot, self.kept)  # the others write the spare column
        rows = self.rows
        self.positions[rows, slot] = state.position
        for name, value in self._values(state, info, step_size).items():
            self._buffer(name, value)[rows, slot] = value
        self.divergences = self.divergences + (info.diverging & keep).sum()

    def write_rows(
        self,
        rows: list[int],
        iterations: np.ndarray,
        state: State,
        info: NamedTuple,
        step_size: torch.Tensor,
    ) -> None:
        """Record the chains ``rows`` at their ``iterations`` (host values, CPU buffers;
        the state, statistics and step sizes as NumPy arrays or CPU tensors): NumPy writes
        into the buffers' memory, no tensor operation per statistic."""
        rows = np.asarray(rows)  # converted once, not by every index below
        slots = iterations - self.offset
        keep = (slots >= 0) & (slots < self.kept)
        if not keep.all():
            rows, slots = rows[keep], slots[keep]
        if not rows.size:
            return
        self.views["x"][rows, slots] = np.asarray(state.position)[rows]
        for name, value in self._values(state, info, step_size).items():
            value = np.asarray(value)
            self._buffer(name, value)
            self.views[name][rows, slots] = value[rows]
        self.divergences += int(np.count_nonzero(np.asarray(info.diverging)[rows]))

    def write_slot(
        self, iteration: int, state: State, info: NamedTuple, step_size: torch.Tensor
    ) -> None:
        """Record every chain at the same ``iteration``."""
        slot = iteration - self.offset
        if not 0 <= slot < self.kept:
            return
        values = self._values(state, info, step_size)
        if self.views is None:
            self.positions[:, slot] = state.position
            for name, value in values.items():
                self._buffer(name, value)[:, slot] = value
            self.divergences = self.divergences + info.diverging.sum()
            return
        views = self.views
        views["x"][:, slot] = np.asarray(state.position)
        for name, value in values.items():
            if name not in views:
                self._buffer(name, np.asarray(value))
            views[name][:, slot] = value
        self.divergences += int(np.count_nonzero(np.asarray(info.diverging)))

    @staticmethod
    def _values(state: State, info: NamedTuple, step_size: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every statistic of a transition by name, ``(C,)`` each."""
        return {"lp": -state.potential, "step_size": step_size, **info._asdict()}

    def _buffer(self, name: str, like: torch.Tensor | np.ndarray) -> torch.Tensor:
        """The buffer of statistic ``name`` (made on first use, with its NumPy view)."""
        buffer = self.buffers.get(name)
        if buffer is None:
            chains = self.rows.shape[0]
            if isinstance(like, np.ndarray):
                buffer = torch.from_numpy(np.zeros((chains, self.width), dtype=like.dtype))
            else:
                buffer = torch.zeros(chains, self.width, dtype=like.dtype, device=like.device)
            self.buffers[name] = buffer
            if self.views is not None:
                self.views[name] = buffer.numpy()
        return buffer

    def stats(self, window: slice) -> dict[str, np.ndarray]:
        return {name: buf[:, window].numpy(force=True) for name, buf in self.buffers.items()}


# ---------------------------------------------------------------------- set-up
class _Settings(NamedTuple):
    kernel: Kernel
    seed: int
    progress: bool


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _validate(**kw: Any) -> _Settings:
    for name, minimum in (("chains", 1), ("warmup", 0), ("draws", 1)):
        value = kw[name]
        if not _is_int(value) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    kernel = kw["kernel"]
    if isinstance(kernel, str):
        if kernel.lower() not in KERNELS:
            raise ValueError(f"kernel must be one of {sorted(KERNELS)} or a kernel, got {kernel!r}")
        kernel = KERNELS[kernel.lower()]()
    elif isinstance(kernel, type) or not (hasattr(kernel, "advance") and hasattr(kernel, "init")):
        raise TypeError(
            f"kernel must be a name or a kernel instance (hmc.HMC, hmc.NUTS), got {kernel!r}"
        )
    if kw["metric"] not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {kw['metric']!r}")
    target_accept = kw["target_accept"]
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
    elif not _is_int(seed) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if kw["dim"] is not None and (not _is_int(kw["dim"]) or kw["dim"] < 1):
        raise ValueError(f"dim must be a positive integer, got {kw['dim']!r}")
    if not isinstance(kw["save_warmup"], bool):
        raise TypeError(f"save_warmup must be True or False, got {kw['save_warmup']!r}")
    progress = kw["progress"]
    if progress is None:
        progress = sys.stderr.isatty() and not os.environ.get("CI")
    return _Settings(kernel, int(seed), bool(progress))


def _as_target(log_prob: Any, dim: int | None, batched: bool) -> Target:
    if isinstance(log_prob, Target) and not callable(log_prob):
        return log_prob
    if hasattr(log_prob, "log_prob") and hasattr(log_prob, "posterior"):
        return log_prob
    if not callable(log_prob):
        raise TypeError(
            f"log_prob must be a callable or an hmc.Model, got {type(log_prob).__name__}"
        )
    return FlatTarget(log_prob, dim, batched)


def _init_radius(init: Any) -> float | None:
    """The radius of random starts when ``init`` is a number, None otherwise."""
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


def _initial_state(
    target: Target,
    potential: Potential,
    position: torch.Tensor | None,
    keys: torch.Tensor,
    chains: int,
    dtype: torch.dtype,
    device: torch.device,
    radius: float,
) -> State:
    """Evaluate user starts, or draw uniform(-radius, radius) starts until finite (100
    tries)."""
    if position is not None:
        potential.check(position)
        U, grad = potential.value_and_grad(position)
        bad = (~torch.isfinite(U)).nonzero().flatten().tolist()
        if bad:
            reason = potential.explain(position[bad[0]])
            raise ValueError(
                f"init for chains {bad} has zero density or a non-finite gradient "
                f"(chain {bad[0]}: {reason})"
            )
        return State(position, U, grad)
    if target.dim is None:
        raise ValueError("dim is required when no init is given (the number of parameters)")
    dim = target.dim
    position = torch.zeros(chains, dim, dtype=dtype, device=device)
    U = torch.full((chains,), torch.inf, dtype=dtype, device=device)
    grad = torch.zeros(chains, dim, dtype=dtype, device=device)
    pending = torch.arange(chains, device=device)
    for attempt in range(MAX_INIT_TRIES):
        counter = torch.full((pending.numel(),), attempt, dtype=torch.int64, device=device)
        trial = radius * (2 * uniform(keys[pending], Stream.INIT, counter, dim, dtype) - 1)
        if attempt == 0:
            potential.check(trial)
        U_new, g_new = potential.value_and_grad(trial)
        position = position.index_copy(0, pending, trial)
        U = U.index_copy(0, pending, U_new)
        grad = grad.index_copy(0, pending, g_new)
        pending = pending[~torch.isfinite(U_new)]
        if pending.numel() == 0:
            return State(position, U, grad)
    chain = int(pending[0])
    raise ValueError(
        f"could not find a finite starting point for chains {pending.tolist()} after "
        f"{MAX_INIT_TRIES} uniform({-radius:g}, {radius:g}) draws (last try, chain {chain}: "
        f"{potential.explain(position[chain])}); pass init= (starting values, or a smaller "
        "radius for the random starts)"
    )


def _check_dense_memory(
    metric: str, chains: int, dim: int, dtype: torch.dtype, device: torch.device
) -> None:
    if metric != "dense":
        return
    itemsize = torch.empty((), dtype=dtype).element_size()
    needed = 4 * chains * dim * dim * itemsize  # metric, Cholesky, estimate, workspace
    if device.type == "cuda":
        available = torch.cuda.mem_get_info(device)[0]
    else:
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if needed > available // 2:
        raise ValueError(
            f"metric='dense' needs about {needed / 2**30:.1f} GiB for {chains} chains of "
            f"dimension {dim} ({chains} x {dim} x {dim} matrices, several copies), more than "
            f"half the {available / 2**30:.1f} GiB available; use metric='diag'"
        )


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="draws", desc="sampling", mininterval=0.25, smoothing=0.1)


def _attach_adaptation(tree, params: Params) -> None:
    import xarray

    inverse = params.metric.inverse.numpy(force=True)
    names = ("chain", "dim_0") if inverse.ndim == 2 else ("chain", "dim_0", "dim_1")
    tree["adaptation"] = xarray.DataTree(
        xarray.Dataset(
            {
                "step_size": (("chain",), params.step_size.numpy(force=True)),
                "inverse_metric": (names, inverse),
            },
            coords={"chain": np.arange(inverse.shape[0])},
        )
    )


def _version() -> str:
    try:
        return importlib.metadata.version("hmc")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        return "0.1.0"
