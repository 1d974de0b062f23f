"""``hmc.sample``: one call from a log density to an ArviZ ``DataTree``.

The parts live in their own modules: the checked settings (:mod:`hmc.settings`), the
initial points (:mod:`hmc.initial`), the loop over chains (:mod:`hmc.loop`), the
recorder (:mod:`hmc.recorder`) and the output (:mod:`hmc.to_arviz`). This module wires
them together.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from hmc import interrupts
from hmc._torch_compat import distribution_validation_off
from hmc.adapt.ensemble import EnsembleWarmup, ensemble_schedule
from hmc.adapt.low_rank import LowRank, window_length
from hmc.adapt.schedule import build_schedule
from hmc.adapt.trajectory_length import EnsembleLengthWarmup, StanLengthWarmup
from hmc.adapt.warmup import StanWarmup
from hmc.arrays import as_arrays, as_tensors, map_record
from hmc.checkpoint import Snapshot, read_checkpoint, saved_metric, write_checkpoint
from hmc.distributed import (
    ChainSplit,
    InterruptVote,
    ShardedPotential,
    chain_ranks,
    chain_share,
    check_same_iteration,
    common_seed,
    gather_chains,
    group_ranks,
    rank_file,
)
from hmc.initial import DEFAULT_INIT_RADIUS, initial_state
from hmc.interrupts import interrupt_requests, kept_draws
from hmc.kernels.base import Kernel
from hmc.kernels.mams import MAMS
from hmc.loop import Run, run_chains
from hmc.metric import inverse_diagonal, unit_metric
from hmc.potential import Potential
from hmc.progress import DisplayFactory, Progress
from hmc.random import chain_keys
from hmc.recorder import Recorder
from hmc.run_warnings import warn_about_run
from hmc.settings import (
    DEFAULT_CHECKPOINT_EVERY,
    KERNELS,
    as_target,
    check_memory,
    compile_decision_at,
    init_radius,
    validate,
)
from hmc.state import Params, take_rows
from hmc.step_size_search import find_reasonable_step_size
from hmc.store import HostStore, NetcdfStore, chunk_iterations
from hmc.target import Target
from hmc.threads import run_threads
from hmc.to_arviz import adaptation_group, check_output, run_attrs, to_datatree
from hmc.warm_start import adapted_parameters, read_adaptation

__all__ = ["sample"]


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
    adapt: str | None = None,
    target_accept: float | None = None,
    step_size: float | None = None,
    seed: int | None = None,
    dtype: torch.dtype = torch.float64,
    device: str | torch.device | None = None,
    save_warmup: bool = False,
    progress: bool | DisplayFactory | None = None,
    batched: bool = False,
    engine: str = "auto",
    compile: bool | str = "auto",
    adapted_from: Any = None,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    store: str | os.PathLike | None = None,
) -> Any:
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
        Number of chains; warmup (adaptation) and kept iterations per chain. Warmup
        defaults to 1000; with ``adapt="ensemble"`` it is the most that runs (the pooled
        warmup stops early once the chains settle, with 64 chains typically after
        120-200 iterations).
    kernel : "nuts", "hmc", "chees", "mams", or a kernel instance (:class:`hmc.NUTS`,
        :class:`hmc.HMC`, :class:`hmc.ChEES`, :class:`hmc.MAMS`)
    metric : "diag" (default), "dense", "low-rank", "identity" (not adapted), or hmc.LowRank
        ``"low-rank"`` (:mod:`hmc.adapt.low_rank`, nutpie's construction) is the "Fisher"
        diagonal ``sqrt(Var x / Var grad)`` corrected by at most 16 eigenvectors of the
        whitened draws' and gradients' geometric-mean covariance, fitted per chain in
        Stan's windows or pooled across chains; it costs ``O(D k)`` per leapfrog step and
        pays on correlated posteriors, where a diagonal metric forces small steps.
        :class:`hmc.LowRank` sets its rank, cutoff and ridge.
    adapt : "stan" or "ensemble", optional
        The warmup: ``"stan"`` (the default, except for ChEES) adapts each chain on its
        own with Stan's windows, and at each slow window's end restarts chains stranded
        far below the others from healthy ones (:mod:`hmc.adapt.warmup`); ``"ensemble"``
        pools all chains into one step size and one metric (the "Fisher" diagonal from
        draws and gradients) in short windows, stops once the chains settle, and
        restarts chains stranded far from the others (:mod:`hmc.adapt.ensemble`).
        Pooling pays with many chains.
    target_accept : float, optional
        Dual averaging's target acceptance statistic (Stan's delta, 0.8; for ChEES the
        harmonic mean of the chains' acceptance probabilities, 0.651; for MAMS 0.9).
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
    progress : bool or callable, optional
        Show the progress (:mod:`hmc.progress`: the run, and each chain's iterations,
        divergences, step size and steps per draw); by default when standard error is a
        terminal and the ``CI`` environment variable is not set. A callable ``(chains,
        warmup, draws)`` makes the display instead: ``hmc.progress.ProgressLines`` writes
        plain lines for a log (``functools.partial(ProgressLines, every=60)``: a line a
        minute).
    batched : bool
        ``log_prob`` takes ``(C, D)`` and returns ``(C,)``.
    compile : True, False or "auto"
        Evaluate through graphs built by ``torch.compile`` (:mod:`hmc.compiled`): the
        energy and its gradient for NUTS, the whole transition for static HMC and ChEES.
        ``True`` compiles at the first evaluation. ``"auto"`` (the default) runs eagerly
        and, a tenth into the run, compiles only where the measured cost of the eager
        evaluations says that compiling pays for the rest of the run (the pooled warmup:
        at the end of its warmup), recorded in the ``compile_decision`` attribute
        (:meth:`hmc.Potential.decide_compile`, :func:`hmc.settings.compile_decision_at`).
        The decision is timed, so a run near the threshold may go either way: pass True
        or False where runs must repeat bit for bit. Without a working compiler the run
        goes on eagerly after one warning.
    adapted_from : DataTree or path, optional
        A previous run (its DataTree, or a checkpoint it wrote at or after the end of its
        warmup) whose adapted step sizes and inverse metrics this run starts from
        (:mod:`hmc.warm_start`): with ``warmup=0`` they are used as they are.
    checkpoint : path, optional
        Write a checkpoint there every ``checkpoint_every`` iterations (default 100) and
        at the end of warmup; when the file exists, continue the run it holds (the same
        arguments are required; :func:`hmc.resume` reads them from the file). Under a
        ``torch.distributed`` process group each rank keeps its own, ``PATH.rank<r>``. See
        :mod:`hmc.checkpoint`.
    checkpoint_every : int, optional
        Iterations between checkpoints.
    store : path, optional
        Stream the draws to this netCDF file as they come, chunk by chunk (an existing
        file is replaced), and return the file opened lazily: memory holds one chunk
        however long the run (:mod:`hmc.store`). With ``checkpoint``, the file holds the
        draws and the checkpoint the rest; resuming cuts the file back to the
        checkpoint's draws.
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

        Ctrl-C or SIGTERM during sampling returns the draws every chain has completed,
        with ``attrs["interrupted"]`` set and a warning; during warmup it raises
        ``KeyboardInterrupt`` saying that no draws exist yet (:mod:`hmc.interrupts`).
        With ``checkpoint``, a checkpoint is written where the chains stand first.

    Examples
    --------
    >>> import torch, hmc
    >>> dt = hmc.sample(lambda q: -0.5 * (q**2).sum(), dim=2, chains=2, draws=200,
    ...                 warmup=200, seed=1, progress=False)
    >>> dict(dt["posterior"].sizes)
    {'chain': 2, 'draw': 200, 'x_dim_0': 2}
    """
    interrupts.stop_if_terminated()  # a SIGTERM during an earlier run whose draws came back
    settings = validate(
        chains=chains,
        warmup=warmup,
        draws=draws,
        kernel=kernel,
        metric=metric,
        adapt=adapt,
        target_accept=target_accept,
        step_size=step_size,
        seed=seed,
        dtype=dtype,
        save_warmup=save_warmup,
        progress=progress,
        dim=dim,
        device=device,
        engine=engine,
        compile=compile,
        batched=batched,
        checkpoint=checkpoint,
        checkpoint_every=checkpoint_every,
        store=store,
    )
    if checkpoint is not None and checkpoint_every is None:
        checkpoint_every = DEFAULT_CHECKPOINT_EVERY
    ranks, split = group_ranks(), chain_ranks(log_prob)  # (rank, world) under torch.distributed
    share = range(chains)  # the global indices of the chains this process runs
    if ranks is not None:  # every rank runs with rank 0's seed, and only rank 0 shows progress
        _check_process_group(store)
        settings = settings._replace(
            seed=common_seed(settings.seed), progress=settings.progress if ranks[0] == 0 else False
        )
    chain_split = None
    if split is not None:
        share = chain_share(chains, *split)
        chain_split = ChainSplit(share, chains, InterruptVote(meeting=settings.warmup > 0))
    all_chains, chains = chains, len(share)
    vote = _interrupt_vote(log_prob, chain_split, settings.adapt)  # None: the ranks never meet
    metric, warmup, target_accept = settings.metric, settings.warmup, settings.target_accept
    adapted = None if adapted_from is None else read_adaptation(adapted_from)
    device = settings.device
    saved = None
    checkpoint_file = None if checkpoint is None else rank_file(checkpoint)  # one per rank
    if checkpoint_file is not None and os.path.exists(checkpoint_file):
        saved = read_checkpoint(checkpoint_file)
        if seed is None:  # the checkpoint's run had its seed drawn: continue it
            settings = settings._replace(seed=saved["settings"]["seed"])
    if checkpoint is not None and vote is not None:  # ranks that meet go on together
        check_same_iteration(checkpoint, None if saved is None else saved["iteration"])
    identity = _run_identity(settings, warmup, draws, target_accept, step_size, dtype)
    identity.update(
        chains=all_chains,
        save_warmup=save_warmup,
        batched=batched,
        checkpoint_every=checkpoint_every,
    )
    if settings.adapt != "stan":  # (checkpoints of Stan's warmup name no adaptation)
        identity["adapt"] = settings.adapt
    if store is not None:
        identity["store"] = os.fspath(store)
    if ranks is not None:
        identity["ranks"] = ranks[1]
    if saved is not None:
        _check_same_run(checkpoint_file, saved["settings"], identity)
    target = as_target(log_prob, dim, batched)
    kept_iterations = draws + (warmup if save_warmup else 0)
    window = _window_draws(settings, all_chains)
    if target.dim is not None:  # before anything is allocated per chain
        check_memory(
            metric, chains, target.dim, kept_iterations, dtype, device, store is not None, window
        )
    reduce = target.reduce if isinstance(target, ShardedPotential) else None
    potential = Potential(
        target.log_prob,
        batched=target.batched,
        compile=settings.compile,
        reduce=reduce,
        compiled_loop=settings.kernel.compiled_loop,
    )
    display = None
    if settings.progress:  # True: the bar; else the caller's factory
        make = Progress if settings.progress is True else settings.progress
        display = make(chains, warmup, draws)
    try:  # the display is closed whatever happens (an error, Ctrl-C)
        if display is not None:
            potential.on_compile = display.compiling
        keys = chain_keys(settings.seed, torch.arange(share.start, share.stop, device=device))
        adapter = _adapter(settings, potential, chain_split)
        started = time.perf_counter()
        resume = None
        if saved is None:
            radius = init_radius(init)
            position = (
                target.initial_positions(init, all_chains, dtype, device)[share.start : share.stop]
                if radius is None and init is not None
                else None
            )
            radius = DEFAULT_INIT_RADIUS if radius is None else radius
            if position is not None or target.dim is not None:  # else initial_state asks for dim
                dim = position.shape[1] if position is not None else target.dim
                check_memory(
                    metric, chains, dim, kept_iterations, dtype, device, store is not None, window
                )
            state = initial_state(target, potential, position, keys, chains, dtype, device, radius)
            dim = state.position.shape[1]
            check_output(target, state.position.numpy(force=True)[:, None])
            if adapted_from is None:
                params = Params(
                    torch.full((chains,), step_size or 1.0, dtype=dtype, device=device),
                    unit_metric(metric, state.position, _rank(settings, dim)),
                )
            else:
                steps, adapted_metric = adapted_parameters(
                    adapted, all_chains, dim, metric, settings.low_rank, dtype, device
                )
                rows = torch.arange(share.start, share.stop, device=device)
                params = Params(steps[rows], take_rows(adapted_metric, rows))
            tuning_started = time.perf_counter()
            adaptation = None
            if warmup > 0 or (step_size is None and adapted_from is None):
                adaptation, params = adapter.init(state, params, keys)
        else:  # the clocks go on from the checkpoint's time
            started = tuning_started = started - saved["seconds"]
            state, params, adaptation, resume = _restored(saved, dtype, device)
            dim = state.position.shape[1]
            _check_same_density(checkpoint_file, target, potential, state)
            potential.evaluations = saved["evaluations"]
        if settings.engine == "numpy":  # the same records as NumPy arrays sharing their memory
            state, adaptation = as_arrays(state), as_arrays(adaptation)
            params = params._replace(  # the metric stays tensors
                step_size=params.step_size.numpy(),
                trajectory_length=as_arrays(params.trajectory_length),
            )
            adapter = _with_schedule(adapter, as_arrays(adapter.schedule))
        recorder = _recorder(
            store, target, chains, warmup, draws, dim, save_warmup, state.position, device, resume,
            json.dumps({**identity, "dim": dim}, sort_keys=True, default=str),
        )  # fmt: skip
        if resume is not None:
            recorder.restore(resume.positions, resume.stats, resume.divergences, resume.iteration)
        save = None
        if checkpoint_file is not None:
            save = functools.partial(
                _save_checkpoint, checkpoint_file, {**identity, "dim": dim}, potential
            )
        # Once for the run, not per evaluation: distribution argument checks off, and no NumPy
        # warnings when the arithmetic overflows on a divergent trajectory (an infinite energy
        # there is a rejection or a divergence). Ctrl-C or SIGTERM ends the loop, keeping the
        # draws so far (hmc.interrupts). One intra-op thread unless more are measured to
        # shorten the wall time (hmc.threads).
        positions = torch.as_tensor(state.position)
        with (
            distribution_validation_off(),
            np.errstate(over="ignore", invalid="ignore"),
            interrupt_requests() as interrupted,
            run_threads(lambda: potential.evaluate_uncounted(positions)) as threads,
        ):
            if vote is not None:  # ranks that meet during the run stop together
                vote.requested, interrupted = interrupted, vote
            run = Run(
                settings.kernel,
                potential,
                keys,
                warmup,
                draws,
                adapter,
                save,
                checkpoint_every or 0,
                interrupted,
                compile_decision_at(settings.adapt, warmup, draws)
                if settings.compile == "auto"
                else None,
            )
            params, adaptation, timing, completed = run_chains(
                run, state, params, adaptation, recorder, display, resume
            )
    finally:
        if display is not None:
            display.close()
    recorder.flush(int(completed.min()))  # what every chain completed, when interrupted
    interrupts.after_run(saved=checkpoint_file is not None or store is not None)
    finished = time.perf_counter()
    if completed.min() < warmup + draws and checkpoint_file and os.path.exists(checkpoint_file):
        warnings.warn(
            f"the run can go on from its last checkpoint: hmc.resume({str(checkpoint)!r}, "
            "log_prob)",
            RuntimeWarning,
            stacklevel=2,
        )
    kept_count = kept_draws(completed, warmup, draws)  # raises if no draw exists yet

    ran = np.arange(warmup)  # the warmup iterations the chains ran
    if timing.skipped is not None:
        ran = ran[(ran < timing.skipped[0]) | (ran >= timing.skipped[1])]
    attrs = run_attrs(
        seed=settings.seed,
        kernel=settings.kernel,
        metric=metric,
        warmup=int(ran.size),
        n_gradient_evaluations=potential.evaluations,
        sampling_time=finished - tuning_started - timing.warmup_seconds,
        warmup_time=timing.warmup_seconds,
        total_time=finished - started,
        chain_utilization=timing.utilization,
        device=device,
        engine=settings.engine,
        compiled=potential.compiled,
        compile_time=potential.compile_seconds,
        compile_note=potential.compile_note,
        compile_decision=potential.compile_decision,
        threads=threads,
        interrupted=kept_count < draws,
        adapt=settings.adapt,
        restarted_chains=_restarted(adaptation),
    )
    inverse_metric = inverse_diagonal(params.metric).numpy(force=True)
    if isinstance(recorder.store, NetcdfStore):
        tree = recorder.store.finish(attrs, adaptation_group(as_tensors(params)))
        _warn_about_tree(tree)
        return tree
    kept = slice(recorder.kept - draws, recorder.kept - draws + kept_count)
    draws_array = recorder.draws(kept)
    warmup_groups = {}
    if save_warmup:
        warmup_draws = recorder.draws(slice(0, warmup))[:, ran]
        warmup_groups = {
            "warmup_posterior": target.posterior(warmup_draws),
            "warmup_sample_stats": {
                name: value[:, ran] for name, value in recorder.stats(slice(0, warmup)).items()
            },
        }
    dims, coords = target.dims_and_coords()
    stats = recorder.stats(kept)
    if ranks is None or (split is None and ranks[0] == 0):  # split runs warn once gathered
        warn_about_run(
            stats,
            inverse_metric,
            attrs["restarted_chains"],
            draws_array,
            target.coordinate_names(),
        )
    tree = to_datatree(
        target.posterior(draws_array),
        stats,
        extra_groups=target.extra_groups(draws_array),
        dims=dims,
        coords=coords,
        attrs=attrs,
        **warmup_groups,
    )
    tree["adaptation"] = adaptation_group(as_tensors(params))
    if split is not None:
        tree = gather_chains(tree, share, all_chains)
        if tree is not None:
            _warn_about_tree(tree)
    return tree


def _warn_about_tree(tree: Any) -> None:
    """The end-of-run warnings (:func:`hmc.run_warnings.warn_about_run`) from a run's
    DataTree."""
    stats = tree["sample_stats"]
    checked = ("diverging", "reached_max_treedepth", "tree_depth")
    warn_about_run(
        {name: stats[name].values for name in checked if name in stats},
        tree["adaptation"]["inverse_metric"].values,
        np.atleast_1d(tree.attrs["restarted_chains"]).astype(np.int64),  # a file's may be 0-d
        tree["posterior"],
    )


def _check_process_group(store: Any) -> None:
    """Refuse what a run under a process group does not do yet, before work starts."""
    if store is not None:
        raise ValueError(
            "store= is not supported under a torch.distributed process group yet (the "
            "ranks' files would have to be gathered on rank 0)"
        )


def resume(
    checkpoint: str | os.PathLike,
    log_prob: Callable[[torch.Tensor], torch.Tensor] | Target,
    *,
    progress: bool | DisplayFactory | None = None,
) -> Any:
    """Continue the run whose checkpoint is at ``checkpoint`` (see :mod:`hmc.checkpoint`)
    and return its DataTree, as :func:`sample` would have.

    Every setting comes from the file; ``log_prob`` must be the run's log density (a
    function cannot be stored safely), and is checked against the saved positions.

    Examples
    --------
    >>> dt = hmc.resume("run.ckpt", log_prob)  # doctest: +SKIP
    """
    saved = read_checkpoint(rank_file(checkpoint))["settings"]
    kernel = KERNELS[saved["kernel"]["name"].lower()](**saved["kernel"]["fields"])
    dtype = getattr(torch, saved["dtype"].removeprefix("torch."))
    as_saved = {name: saved[name] for name in saved.keys() - {"kernel", "dtype", "ranks"}}
    if "low_rank" in as_saved:
        as_saved["metric"] = LowRank(**as_saved.pop("low_rank"))
    return sample(
        log_prob, **as_saved, kernel=kernel, dtype=dtype, progress=progress, checkpoint=checkpoint
    )


def _recorder(
    store: str | os.PathLike | None,
    target: Target,
    chains: int,
    warmup: int,
    draws: int,
    dim: int,
    save_warmup: bool,
    like: torch.Tensor | np.ndarray,
    device: torch.device,
    resume: Snapshot | None = None,
    run: str = "",
) -> Recorder:
    """The run's recorder: streaming to the file ``store`` (which keeps the run's identity
    ``run``), streaming to host memory from a device other than the CPU, else holding the
    whole run (:mod:`hmc.store`); going on from the checkpoint's snapshot ``resume`` when
    there is one."""
    sizes = (chains, warmup, draws, dim, save_warmup, like)
    if store is None and device.type == "cpu":
        return Recorder(*sizes)
    offset = 0 if save_warmup else warmup
    if store is None:
        dtype = np.dtype(str(like.dtype).removeprefix("torch."))
        sink = HostStore(chains, warmup + draws - offset, dim, dtype)
    else:
        skipped = None if resume is None else resume.skipped
        sink = NetcdfStore(store, target, warmup, offset, resume is not None, skipped, run)
    chunk = chunk_iterations(chains, dim, like.dtype.itemsize)
    return Recorder(*sizes, store=sink, chunk=chunk)


def _interrupt_vote(
    log_prob: Any, chain_split: ChainSplit | None, adapt: str
) -> InterruptVote | None:
    """The run's vote on interrupts where its ranks meet during the run: at every
    evaluation (data-parallel: a new vote for the sharded density's all-reduces) or at
    every pooled warmup iteration (chain-parallel); None where they do not (one process,
    or chain-parallel with Stan's warmup)."""
    if isinstance(log_prob, ShardedPotential) and log_prob.world > 1:
        log_prob.vote = InterruptVote()
        return log_prob.vote
    if chain_split is not None and adapt == "ensemble":
        return chain_split.vote
    return None


def _adapter(
    settings: Any, potential: Potential, split: ChainSplit | None
) -> StanWarmup | EnsembleWarmup:
    """The warmup's adapter for the run's settings (``split``: this process's block of a
    chain-parallel run's chains, which the ensemble warmup pools with the others')."""
    search = functools.partial(find_reasonable_step_size, potential=potential)
    common = dict(
        search=search,
        target_accept=settings.target_accept,
        adapt_metric=settings.metric != "identity",
        dense=settings.metric == "dense",
        low_rank=settings.low_rank,
    )
    kernel = settings.kernel
    learns_length = isinstance(kernel, MAMS)  # from the autocorrelation time
    if settings.adapt == "ensemble":
        pooled = EnsembleWarmup(
            schedule=ensemble_schedule(settings.warmup, device=settings.device),
            trajectory=getattr(kernel, "reports_proposal", False),
            max_steps=getattr(kernel, "max_steps", 1024),
            split=split,
            **common,
        )
        return EnsembleLengthWarmup(pooled) if learns_length else pooled
    stan = StanWarmup(schedule=build_schedule(settings.warmup, device=settings.device), **common)
    return StanLengthWarmup(stan) if learns_length else stan


def _with_schedule(adapter: Any, schedule: Any) -> Any:
    """The adapter with its schedule replaced (the one it wraps, for MAMS's)."""
    if isinstance(adapter, StanLengthWarmup | EnsembleLengthWarmup):
        return dataclasses.replace(adapter, inner=_with_schedule(adapter.inner, schedule))
    return dataclasses.replace(adapter, schedule=schedule)


def _window_draws(settings: Any, chains: int) -> int:
    """The draws (and gradients) per chain the low-rank metric's windows hold: the longest
    window of Stan's schedule, or every chain's longest pooled window (0 for the other
    metrics)."""
    if settings.low_rank is None:
        return 0
    if settings.adapt == "ensemble":
        return chains * window_length(ensemble_schedule(settings.warmup).windows)
    return window_length(build_schedule(settings.warmup).windows)


def _rank(settings: Any, dim: int) -> int:
    """The low-rank metric's number of eigenvector slots in dimension ``dim`` (0 for the
    other metrics)."""
    return 0 if settings.low_rank is None else settings.low_rank.rank(dim)


def _restarted(adaptation: Any) -> np.ndarray:
    """The chains the warmup restarted from another chain ``(R,)``."""
    restarted = getattr(adaptation, "restarted", None)
    if restarted is None:
        return np.zeros(0, dtype=np.int64)
    return torch.as_tensor(restarted).nonzero().flatten().numpy(force=True)


def _run_identity(
    settings: Any,
    warmup: int,
    draws: int,
    target_accept: float,
    step_size: float | None,
    dtype: torch.dtype,
) -> dict[str, Any]:
    """What makes a run the same run, as plain values (stored in its checkpoints)."""
    kernel = settings.kernel
    return {
        "warmup": warmup,
        "draws": draws,
        "kernel": {"name": type(kernel).__name__, "fields": dataclasses.asdict(kernel)},
        "metric": settings.metric,
        **(
            {} if settings.low_rank is None else {"low_rank": dataclasses.asdict(settings.low_rank)}
        ),
        "target_accept": float(target_accept),
        "step_size": step_size,
        "seed": settings.seed,
        "dtype": str(dtype),
        "device": str(settings.device),
        "engine": settings.engine,
        "compile": settings.compile,
    }


def _check_same_run(path: Any, saved: dict[str, Any], current: dict[str, Any]) -> None:
    """Raise naming the settings in which the checkpoint at ``path`` differs from this
    run (its dimension is checked against the density later)."""
    plain = lambda d: json.loads(json.dumps({k: v for k, v in d.items() if k != "dim"}))  # noqa: E731
    saved, current = plain(saved), plain(current)
    differing = sorted(k for k in saved.keys() | current.keys() if saved.get(k) != current.get(k))
    if differing:
        details = ", ".join(
            f"{k}: {saved.get(k)!r} there, {current.get(k)!r} here" for k in differing
        )
        raise ValueError(
            f"checkpoint {str(path)!r} belongs to another run ({details}); remove it or "
            "pass the settings it was written with (hmc.resume reads them from it)"
        )


def _check_same_density(path: Any, target: Target, potential: Potential, state: Any) -> None:
    """Raise unless the checkpoint at ``path``, whose chains stand at ``state``, was
    written for this density: the same dimension where the target knows its own, and the
    same potential at the saved positions (to 1e-8 relative: compiled and eager
    evaluations differ by rounding only)."""
    dim = state.position.shape[1]
    if target.dim is not None and target.dim != dim:
        raise ValueError(
            f"checkpoint {str(path)!r} was written for dimension {dim}, this run's density "
            f"has {target.dim}; remove it or resume with the density it was written for"
        )
    U, _ = potential.value_and_grad(state.position)
    saved, now = state.potential.numpy(force=True), np.asarray(torch.as_tensor(U).cpu())
    if not np.allclose(now, saved, rtol=1e-8, atol=1e-8 * max(1.0, float(np.abs(saved).max()))):
        worst = int(np.argmax(np.abs(now - saved)))
        raise ValueError(
            f"checkpoint {str(path)!r} was written for another log_prob: at chain {worst}'s "
            f"saved position it gives potential {now[worst]!r}, the checkpoint "
            f"{saved[worst]!r}; remove it or resume with the density it was written for"
        )


def _restored(saved: dict[str, Any], dtype: torch.dtype, device: torch.device):
    """The state, parameters, adaptation and loop snapshot of a checkpoint, as tensors on
    the run's device."""
    to = functools.partial(map_record, lambda x: x.to(device))
    state, length, adaptation = (
        to(saved["state"]),
        to(saved["trajectory_length"]),
        to(saved["adaptation"]),
    )
    params = Params(to(saved["step_size"]), to(saved_metric(saved)), length)
    resume = Snapshot(
        saved["iteration"],
        state,
        params.step_size,
        params.metric,
        adaptation,
        saved["positions"],
        saved["stats"],
        saved["divergences"],
        saved["warmup_seconds"],
        saved["useful"],
        saved["slots"],
        saved["seconds"],
        length,
        saved["skipped"],
    )
    return state, params, adaptation, resume


def _save_checkpoint(
    path: Any, identity: dict[str, Any], potential: Potential, snapshot: Snapshot
) -> None:
    write_checkpoint(path, snapshot, {"settings": identity, "evaluations": potential.evaluations})
