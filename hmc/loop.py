"""The sampling loop: every chain on its own iteration counter.

Each kernel call advances the chains (one transition of every chain for static HMC, one
leapfrog step of every busy chain for NUTS). A chain that completes a transition is
recorded, adapted during its own warmup and moves on to its next iteration, whatever the
other chains are doing; the loop ends when every chain has run ``warmup + draws``
iterations. The loop keeps its counters on the host: when the kernel knows on the host
which chains finished (the NumPy engine, static HMC) it reads nothing from the device;
otherwise (NUTS with the torch engine) it reads its counters from the device in one go per
call, together with the kernel's ``readout``, never per leapfrog step.

Stan's per-chain warmup (:class:`hmc.adapt.StanWarmup`) has every chain wait for the
others at the end of each slow window, where chains stranded far below the others restart
from healthy ones (:meth:`hmc.adapt.StanWarmup.restart`).

An adapter that pools the chains (:class:`hmc.adapt.EnsembleWarmup`, ``lockstep``) has
every chain wait for the others after each warmup iteration; its ``pool`` then adapts from
all of them, may restart chains, and may skip the rest of the slow windows (every chain's
counter jumps to the terminal buffer).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from hmc.adapt.ensemble import EnsembleState, EnsembleWarmup
from hmc.adapt.trajectory_length import StanLengthWarmup
from hmc.adapt.warmup import StanWarmup, WarmupState
from hmc.checkpoint import Snapshot
from hmc.kernels.base import Kernel, Phase, Step
from hmc.potential import Potential
from hmc.progress import Display
from hmc.recorder import Recorder
from hmc.state import Params, State, where_rows

__all__ = ["Run", "Timing", "run_chains"]


class Run(NamedTuple):
    """What the loop runs: the kernel, the energy module, the chain keys ``(C,)``, the
    numbers of warmup and kept iterations, the warmup's adapter (its schedule's masks in
    the engine's arrays), the checkpoints: ``checkpoint(snapshot)`` called every
    ``checkpoint_every`` iterations and at the end of warmup (None: no checkpoints), and
    ``interrupted()``, read between kernel calls: whether Ctrl-C or SIGTERM came
    (:func:`hmc.interrupts.interrupt_requests`), and the iteration at which every chain
    having arrived, ``compile="auto"`` is settled (:meth:`hmc.Potential.decide_compile`;
    None: nothing to decide)."""

    kernel: Kernel
    potential: Potential
    keys: torch.Tensor
    warmup: int
    draws: int
    adapter: StanWarmup | EnsembleWarmup
    checkpoint: Callable[[Snapshot], None] | None = None
    checkpoint_every: int = 0
    interrupted: Callable[[], bool] = lambda: False
    decide_compile_at: int | None = None


class Timing(NamedTuple):
    """Seconds until every chain left its warmup, the fraction of chain-slots that did
    leapfrog work while every chain was sampling, and the warmup iterations ``[a, b)``
    that no chain ran (the pooled warmup's early stop; None when every one ran)."""

    warmup_seconds: float
    utilization: float
    skipped: tuple[int, int] | None = None


class _Counts(NamedTuple):
    """What the loop knows after a kernel call: whether any chain finished a transition
    (any in its warmup, any at the end of a slow window), the transitions done so far (all
    chains, and the fewest of one chain), the chains still in warmup, the chains that had
    transitions left at its start, and the iteration every chain finished at when they all
    finished at one (static HMC; None otherwise)."""

    any_done: bool
    any_adapting: bool
    any_window_end: bool
    total_done: int
    least: int
    warming: int
    alive: int
    common_iteration: int | None = None


def run_chains(
    run: Run,
    state: State,
    params: Params,
    adaptation: WarmupState | EnsembleState | None,
    recorder: Recorder,
    progress: Display | None = None,
    resume: Snapshot | None = None,
) -> tuple[Params, WarmupState | EnsembleState | None, Timing, np.ndarray]:
    """Run every chain from ``state`` through warmup and sampling, recording each
    transition in ``recorder``. ``state``, the step sizes and ``adaptation`` are arrays of the
    run's engine (the metric is tensors); ``adaptation`` is None when nothing adapts.

    ``run.interrupted()`` (Ctrl-C or SIGTERM) ends the loop early, keeping what was
    recorded; with checkpoints, the chains first run to one iteration past the furthest
    one's (or to the next stop), where a checkpoint is written. A ``KeyboardInterrupt``
    ends it at once. ``resume``, a checkpoint's snapshot,
    continues a run from there (``state``, ``params``, ``adaptation`` and ``recorder``
    already restored). Returns the final kernel parameters and adaptation state, the
    timing and the iterations each chain completed ``(C,)`` (NumPy; ``warmup + draws``
    each unless interrupted).

    With checkpoints, every chain stops at each checkpoint's iteration until all have
    reached it; the snapshot is written and the kernel starts afresh from there (each
    chain's draws depend only on its own history, so this changes no draw). The last
    checkpoint is written at the end of the run. A pooling adapter's warmup iterations are
    such stops too (see the module docstring), and so are a streaming recorder's chunk
    ends, where the chunk is flushed to its store."""
    kernel, warmup, adapter = run.kernel, run.warmup, run.adapter
    total = warmup + run.draws
    chains = state.potential.shape[0]
    first = resume.iteration if resume is not None else 0
    kernel_state = kernel.init(state, first)
    host_iteration = np.full(chains, first, dtype=np.int64)  # while the kernel reports on the host
    if isinstance(state.potential, np.ndarray):
        iteration = host_iteration
    else:
        iteration = torch.full((chains,), first, dtype=torch.int64, device=state.potential.device)
    every = run.checkpoint_every if run.checkpoint else 0
    saves = set(_stops(first, warmup, total, every)) if run.checkpoint else set()
    lockstep = adaptation is not None and adapter.lockstep
    pooled_stops = set(range(first + 1, warmup + 1)) if lockstep else set()
    restart_stops = set()  # the ends of Stan's slow windows, for stranded chains
    if adaptation is not None and isinstance(adapter, StanWarmup | StanLengthWarmup) and chains > 1:
        restart_stops = {s for s in adapter.restart_stops() if s > first}
    warmup_stops = bool(pooled_stops or restart_stops)
    flushes = set(recorder.ends(first, total))  # a streaming recorder's chunks
    stops = sorted(saves | pooled_stops | restart_stops | flushes | {total})
    stop = stops.pop(0)  # chains wait for each other there: a checkpoint, a pooled
    # adaptation, a restart of stranded chains, a chunk of draws to store, or the end
    skipped = None if resume is None else resume.skipped
    draining = False  # interrupted: running to a common iteration for a checkpoint
    phase = Phase(sampling=iteration >= warmup, left=stop - iteration)
    warming = chains if first < warmup else 0
    counts = _Counts(False, False, False, first * chains, first, warming, chains)
    latest = state  # each chain's last state, kept for the checkpoints
    decide_at = run.decide_compile_at if resume is None else None
    if resume is None:
        warmup_seconds, started, useful, slots = None, time.perf_counter(), 0.0, 0.0
    else:
        warmup_seconds, useful, slots = resume.warmup_seconds, resume.useful, resume.slots
        started = time.perf_counter() - resume.seconds
    try:
        while counts.least < total:
            was_warming = counts.warming
            kernel_state, step = kernel.step(kernel_state, params, run.potential, run.keys, phase)
            if step.finished is not None:
                counts = _host_counts(run, step.finished, host_iteration, counts)
            else:
                counts, values = _device_counts(run, step, iteration, kernel_state.readout)
                if values:
                    kernel_state = kernel.with_readout(kernel_state, values)
            if counts.any_done:
                recorder.write(
                    step.done,
                    iteration,
                    step.state,
                    step.info,
                    params.step_size,
                    counts.common_iteration,
                )
                if counts.any_adapting and adaptation is not None:
                    adaptation, params = adapter.update(
                        adaptation,
                        params,
                        step.done & (iteration < warmup),
                        iteration,
                        step.info.acceptance_rate,
                        step.state,
                        run.keys,
                        counts.any_window_end,
                        step.proposal,
                    )
                    if counts.warming < was_warming:  # some chains left their warmup
                        leaving = step.done & (iteration == warmup - 1)
                        params = adapter.final(adaptation, params, leaving)
                if run.checkpoint is not None or flushes or (warmup_stops and was_warming):
                    latest = where_rows(step.done, step.state, latest)
                iteration = iteration + step.done
                phase = Phase(sampling=iteration >= warmup, left=stop - iteration)
                if isinstance(iteration, np.ndarray):
                    host_iteration = iteration
                elif step.finished is not None:
                    host_iteration = _advanced(host_iteration, step.finished)
            if decide_at is not None and counts.least >= decide_at:
                run.potential.decide_compile(counts.total_done, chains * total - counts.total_done)
                decide_at = None
            if counts.warming == 0 and warmup_seconds is None:
                warmup_seconds = time.perf_counter() - started
            if was_warming == 0:  # every chain was sampling during this call
                useful = useful + step.work.sum()
                slots += counts.alive
            if progress is not None and counts.any_done:
                progress.update(iteration, counts.total_done, recorder, params.step_size)
            if not draining and run.interrupted():
                if run.checkpoint is None:
                    break
                draining = True  # to a common iteration, for a checkpoint there
                furthest = int(iteration.max()) + 1  # (a chain's transition in flight)
                stop = min(stop, furthest)
                saves.add(stop)
                phase = Phase(sampling=iteration >= warmup, left=stop - iteration)
            if counts.least != stop:
                continue
            # every chain is at the stop
            restart, moved = stop, False
            if stop in pooled_stops:
                pooled = adapter.pool(adaptation, params, latest, stop - 1, run.keys)
                moved = pooled.state is not latest  # chains restarted from others
                adaptation, params, latest = pooled.adaptation, pooled.params, pooled.state
                if pooled.skip_to is not None:
                    skipped, restart = (stop, pooled.skip_to), pooled.skip_to
                    iteration = iteration * 0 + restart
                    host_iteration = np.full(chains, restart, dtype=np.int64)
                    stops = [s for s in stops if s > restart]
                    counts = counts._replace(least=restart)
            if stop in restart_stops:
                adaptation, params, restarted = adapter.restart(adaptation, params, latest)
                moved, latest = restarted is not latest, restarted
            recorder.flush(stop, restart)
            if stop in saves:
                held_positions, held_stats = recorder.held()
                run.checkpoint(
                    Snapshot(
                        restart,  # after an early stop, where the chains go on
                        latest,
                        params.step_size,
                        params.metric,
                        adaptation,
                        held_positions,
                        held_stats,
                        int(recorder.divergences),
                        warmup_seconds,
                        float(useful),
                        slots,
                        time.perf_counter() - started,
                        params.trajectory_length,
                        skipped,
                    )
                )
            if stop == total or draining:
                break
            if stop in saves or moved or restart != stop or kernel.spans_calls:
                kernel_state = kernel.init(latest, restart)  # else it goes on as it is
            stop = stops.pop(0)
            phase = Phase(sampling=iteration >= warmup, left=stop - iteration)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the draws so far are kept
        pass
    if progress is not None:
        progress.update(iteration, counts.total_done, recorder, params.step_size, force=True)
    timing = Timing(warmup_seconds or 0.0, float(useful) / slots if slots else 1.0, skipped)
    completed = iteration if isinstance(iteration, np.ndarray) else iteration.numpy(force=True)
    return params, adaptation, timing, completed


def _stops(first: int, warmup: int, total: int, every: int) -> list[int]:
    """The iterations after ``first`` where every chain waits for the others: each
    multiple of ``every`` (none when 0) and the end of warmup, then the run's end."""
    stops = set(range(every, total, every)) if every else set()
    if every and 0 < warmup < total:
        stops.add(warmup)
    return [*sorted(s for s in stops if s > first), total]


def _advanced(iteration: np.ndarray, finished: np.ndarray) -> np.ndarray:
    """``iteration`` ``(C,)`` with the chains ``finished`` moved on by one."""
    iteration = iteration.copy()
    iteration[finished] += 1
    return iteration


def _host_counts(run: Run, finished: np.ndarray, iteration: np.ndarray, before: _Counts) -> _Counts:
    """The loop's counters after a call whose finished chains the kernel reported on the
    host (``iteration`` ``(C,)`` before they move on)."""
    total = run.warmup + run.draws
    alive = int(np.count_nonzero(iteration < total)) if before.any_done else before.alive
    if not finished.size:
        return before._replace(
            any_done=False,
            any_adapting=False,
            any_window_end=False,
            alive=alive,
            common_iteration=None,
        )
    at = iteration[finished].tolist()
    advanced = _advanced(iteration, finished)
    first, last = min(at), max(at)
    adapting = first < run.warmup
    common = first if first == last and len(at) == iteration.shape[0] else None
    return _Counts(
        any_done=True,
        any_adapting=adapting,
        any_window_end=adapting and any(map(run.adapter.schedule.ends_window, set(at))),
        total_done=before.total_done + finished.size,
        least=int(advanced.min()),
        warming=int(np.count_nonzero(advanced < run.warmup)),
        alive=alive,
        common_iteration=common,
    )


def _device_counts(
    run: Run, step: Step, iteration: torch.Tensor, kernel_readout: torch.Tensor
) -> tuple[_Counts, list[int]]:
    """The loop's counters after a call with the torch engine, and the kernel's readout,
    read from the device in one go."""
    total, warmup = run.warmup + run.draws, run.warmup
    done = step.done
    advanced = iteration + done
    window_end = run.adapter.schedule.window_end  # (warmup,)
    if window_end.numel():
        ends = done & window_end[iteration.clamp(0, window_end.numel() - 1)]
        ends = ends & (iteration < warmup)
    else:
        ends = done & False
    counters = torch.stack(
        (
            done.any(),
            (done & (iteration < warmup)).any(),
            ends.any(),
            advanced.sum(),
            advanced.min(),
            (advanced < warmup).sum(),
            (iteration < total).sum(),
        )
    )
    values = torch.cat((counters, kernel_readout.to(counters))).tolist()
    any_done, any_adapting, any_end, total_done, least, warming, alive = map(int, values[:7])
    counts = _Counts(
        any_done=bool(any_done),
        any_adapting=bool(any_adapting),
        any_window_end=bool(any_end),
        total_done=total_done,
        least=least,
        warming=warming,
        alive=alive,
    )
    return counts, values[7:]
