"""Sampling across the processes of a ``torch.distributed`` process group.

Both ways start the same script in every process (``torchrun --nproc-per-node N``) after
``torch.distributed.init_process_group`` (gloo on CPUs, nccl on GPUs):

**Chain-parallel.** Under an initialised group of R processes, :func:`hmc.sample` runs on
each rank its share of the chains, a contiguous block of their global indices
(:func:`chain_share`), batched on that rank's device. Chain ``c`` draws its random numbers
from ``(seed, c)`` alone, as in one process, so its draws do not depend on the number of
ranks. The seed is rank 0's (drawn there when none is given). With Stan's warmup the ranks
do not talk during the run; the pooled warmup gathers every chain's state on every rank
once per warmup iteration (:class:`ChainSplit`), and with it any rank's interrupt, so that
the ranks stop together (:class:`InterruptVote`). At its end rank 0 gathers the others'
runs and returns the whole DataTree, with the end-of-run warnings for all chains; the
other ranks return None.

**Data-parallel.** :class:`ShardedPotential` is a log density whose likelihood is a sum
over data shards, one per rank: every rank runs every chain, and each evaluation computes
the rank's share of the value and gradient with the energy module's one
``torch.autograd.grad``, then sums value and gradient over the ranks in one all-reduce of
``(C + 1) x (D + 1)`` numbers. An all-reduce leaves the same sum on every rank, so every
rank takes the same steps and holds the same states without any further communication,
and returns the same DataTree. An interrupt (Ctrl-C, SIGTERM) at any rank rides along the
next all-reduce in its last row, so the ranks stop together (:class:`InterruptVote`).

**Failure.** A rank that dies closes its connections: the others' next collective fails
and raises :class:`RankFailure` naming the rank that saw it. A rank that stalls is
detected by the process group's timeout (``init_process_group(timeout=...)``), after which
the others raise the same error; no rank hangs beyond that timeout.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from hmc.target import FlatTarget

__all__ = ["ChainSplit", "RankFailure", "ShardedPotential", "chain_ranks", "chain_share"]


class RankFailure(RuntimeError):
    """A collective across the process group failed: another rank stopped or stalled."""


def group_ranks() -> tuple[int, int] | None:
    """``(rank, world size)`` of the initialised default process group when it has more
    than one process, else None."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    return dist.get_rank(), dist.get_world_size()


def chain_ranks(log_prob: Any) -> tuple[int, int] | None:
    """``(rank, world size)`` when :func:`hmc.sample` splits the chains of ``log_prob``
    across the ranks (an initialised group of several processes, and a log density that
    is not sharded), else None."""
    return None if isinstance(log_prob, ShardedPotential) else group_ranks()


def chain_share(chains: int, rank: int, world: int) -> range:
    """The global indices of the chains ``rank`` runs: contiguous blocks, the first
    ``chains % world`` ranks one chain more than the others."""
    if chains < world:
        raise ValueError(
            f"chains must be at least the number of ranks ({world}) to split them across "
            f"the process group, got {chains}"
        )
    size, extra = divmod(chains, world)
    start = rank * size + min(rank, extra)
    return range(start, start + size + (rank < extra))


class InterruptVote:
    """An interrupt agreed among ranks that meet at collectives: a run's ``interrupted()``
    for its loop.

    This rank's request (``requested()``: a signal came here) rides along each of the run's
    all-reduces as one more row (:meth:`extend`), whose sum every rank then holds
    (:meth:`count`): every rank learns of any rank's request at the same collective, so
    all stop at the same point of the run, and none is left waiting on a collective for
    the others. While the run still has collectives ahead (``meeting``), a rank stops only
    on a counted request; after its last one, on its own request too."""

    def __init__(self, requested: Callable[[], bool] = lambda: False, meeting: bool = True):
        self.requested = requested
        self.meeting = meeting
        self._count: torch.Tensor | float = 0.0  # a 0-d tensor on the device after a count

    def __call__(self) -> bool:
        """Whether to stop now (read by the loop alone, between kernel calls)."""
        return bool(self._count > 0) or (not self.meeting and self.requested())

    def extend(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` ``(N, K)`` and one more row, this rank's request in its first entry."""
        extra = rows.new_zeros((1, rows.shape[1]))
        extra[0, 0] = float(self.requested())
        return torch.cat([rows, extra])

    def adjourn(self) -> None:
        """The run's last collective is past: the count is read once, and from now on each
        rank stops on its own request too."""
        self._count, self.meeting = float(self._count), False

    def count(self, reduced: torch.Tensor) -> torch.Tensor:
        """Count the requests in the last row of an all-reduced :meth:`extend`; the rows
        before it."""
        self._count = reduced[-1, 0] + self._count  # no read of the device here
        return reduced[:-1]


@dataclass(frozen=True)
class ChainSplit:
    """This rank's block ``share`` of a chain-parallel run's ``chains`` chains, for the
    adaptation that pools every chain (:class:`hmc.adapt.EnsembleWarmup`)."""

    share: range
    chains: int
    #: the interrupts of the ranks, counted at each gathering
    vote: InterruptVote = field(default_factory=InterruptVote)

    def gather(self, rows: torch.Tensor) -> torch.Tensor:
        """Every chain's rows ``(chains, K)`` on every rank, from this rank's ``rows``
        ``(len(share), K)``: one all-reduce of the rows in place among zeros, exact (a sum
        of one number and zeros), with the ranks' interrupts in one more row."""
        all_chains = self.vote.extend(rows.new_zeros((self.chains, rows.shape[1])))
        all_chains[self.share.start : self.share.stop] = rows
        _collective(
            "gathering the chains for the pooled warmup", lambda: dist.all_reduce(all_chains)
        )
        return self.vote.count(all_chains)

    def own_rows(self, all_chains: torch.Tensor) -> torch.Tensor:
        """This rank's rows of ``all_chains`` ``(chains, ...)``."""
        return all_chains[self.share.start : self.share.stop]


def _collective(what: str, call: Callable[[], Any]) -> Any:
    """Run ``call``, a collective, raising :class:`RankFailure` when it fails."""
    try:
        return call()
    except RuntimeError as error:  # gloo and nccl raise DistBackendError, a RuntimeError
        raise RankFailure(
            f"hmc.distributed: {what} failed on rank {dist.get_rank()}: another rank stopped, "
            f"or did not answer within the process group's timeout ({error})"
        ) from error


def rank_file(path: str | os.PathLike) -> str | os.PathLike:
    """``path`` for this process: ``PATH.rank<r>`` under a group of several processes
    (each rank keeps its own checkpoint), ``path`` itself otherwise."""
    ranks = group_ranks()
    return path if ranks is None else f"{os.fspath(path)}.rank{ranks[0]}"


def check_same_iteration(path: str | os.PathLike, iteration: int | None) -> None:
    """Raise ``ValueError`` unless every rank's checkpoint (``iteration``, None for none
    yet) stands at the same iteration: ranks that meet during a run resume together."""
    every = [None] * dist.get_world_size()
    _collective("comparing the checkpoints", lambda: dist.all_gather_object(every, iteration))
    if len(set(every)) > 1:
        raise ValueError(
            f"checkpoint={os.fspath(path)!r}: the ranks' files stand at different iterations "
            f"({', '.join(f'rank {r}: {i}' for r, i in enumerate(every))}; the run was "
            "stopped while they wrote), and ranks that meet during a run (data-parallel, or "
            "the pooled warmup) can only go on together: remove the files to start again"
        )


def common_seed(seed: int) -> int:
    """Rank 0's ``seed``, on every rank."""
    sent = [seed]
    _collective("sharing the seed", lambda: dist.broadcast_object_list(sent, src=0))
    return int(sent[0])


def gather_chains(tree: Any, share: range, chains: int) -> Any:
    """The runs of every rank's ``share`` of the chains gathered on rank 0 as one DataTree
    of all ``chains`` (global chain numbers, the draws every chain completed, the
    gradient evaluations summed, the times of the slowest rank); None on the others."""
    rank = dist.get_rank()
    runs = [None] * dist.get_world_size() if rank == 0 else None
    _collective("gathering the chains", lambda: dist.gather_object(tree, runs, dst=0))
    if rank != 0:
        return None
    return combine_runs(runs, chains)


def combine_runs(runs: list[Any], chains: int) -> Any:
    """One DataTree from DataTrees ``runs`` of consecutive blocks of ``chains`` chains."""
    import xarray

    draws = min(run["posterior"].sizes["draw"] for run in runs)
    starts = np.cumsum([0] + [run["posterior"].sizes["chain"] for run in runs])
    assert starts[-1] == chains, (starts, chains)
    combined = xarray.DataTree()
    for path in runs[0].groups[1:]:  # every group below the root
        parts = []
        for run, start in zip(runs, starts, strict=False):
            group = run[path].to_dataset()
            if "draw" in group.dims and not path.lstrip("/").startswith("warmup"):
                group = group.isel(draw=slice(0, draws))
            if "chain" in group.dims:
                group = group.assign_coords(chain=start + np.arange(group.sizes["chain"]))
            parts.append(group)
        if "chain" in parts[0].dims:
            dataset = xarray.concat(parts, dim="chain", combine_attrs="override")
        else:  # data every rank holds alike (observed data)
            dataset = parts[0]
        combined[path] = xarray.DataTree(dataset)
    attrs = dict(runs[0].attrs)
    attrs["n_gradient_evaluations"] = sum(run.attrs["n_gradient_evaluations"] for run in runs)
    for name in ("sampling_time", "warmup_time", "total_time", "compile_time"):
        attrs[name] = max(run.attrs[name] for run in runs)
    attrs["chain_utilization"] = float(np.mean([run.attrs["chain_utilization"] for run in runs]))
    attrs["interrupted"] = any(bool(run.attrs["interrupted"]) for run in runs)
    attrs["compiled"] = all(bool(run.attrs["compiled"]) for run in runs)
    attrs["ranks"] = len(runs)
    combined.attrs = attrs
    return combined


class ShardedPotential(FlatTarget):
    """A log density ``log_prior(q) + sum over ranks of shard_log_lik(q)`` whose terms are
    computed where the data shards live, for :func:`hmc.sample` and :class:`hmc.Potential`.

    Every rank of the initialised process group builds one with its own ``shard_log_lik``
    (a function of the position that closes over the rank's data) and the same
    ``log_prior``, and calls :func:`hmc.sample` with the same arguments. Rank 0 adds the
    prior to its shard's term; the sum over ranks comes from one all-reduce of value and
    gradient per evaluation (see the module docstring).

    Parameters
    ----------
    log_prior, shard_log_lik : callable
        ``(D,) -> ()``, or ``(C, D) -> (C,)`` with ``batched=True``.
    dim : int, optional
        The dimension D (as :func:`hmc.sample`'s ``dim``).
    batched : bool
        Whether the functions take a batch of positions.

    Examples
    --------
    >>> target = ShardedPotential(log_prior, shard_log_lik, dim=3)  # doctest: +SKIP
    >>> dt = hmc.sample(target, chains=4, seed=1)  # doctest: +SKIP
    """

    def __init__(
        self,
        log_prior: Callable[[torch.Tensor], torch.Tensor],
        shard_log_lik: Callable[[torch.Tensor], torch.Tensor],
        *,
        dim: int | None = None,
        batched: bool = False,
    ) -> None:
        if not (callable(log_prior) and callable(shard_log_lik)):
            raise TypeError("log_prior and shard_log_lik must be callable")
        ranks = group_ranks()
        self.rank, self.world = ranks if ranks is not None else (0, 1)
        self.log_prior = log_prior
        self.shard_log_lik = shard_log_lik
        #: the ranks' interrupts, counted at each all-reduce: :func:`hmc.sample` gives each
        #: run a new one; every kernel call evaluates, so the run always meets
        self.vote = InterruptVote()
        super().__init__(self._local_log_prob, dim, batched)

    def _local_log_prob(self, q: torch.Tensor) -> torch.Tensor:
        """This rank's term: its shard's log-likelihood, plus the prior on rank 0."""
        if self.rank == 0:
            return self.log_prior(q) + self.shard_log_lik(q)
        return self.shard_log_lik(q)

    def reduce[A: (torch.Tensor, np.ndarray)](self, U: A, grad: A) -> tuple[A, A]:
        """Sum the ranks' energies ``U`` ``(C,)`` (or 0-d) and gradients ``grad``
        ``(C, D)`` (or ``(D,)``) in one all-reduce, with the ranks' interrupts in one more
        row (:class:`InterruptVote`); rows that are not finite get ``U = +inf`` and a zero
        gradient, as every evaluation does."""
        if self.world == 1:
            return U, grad
        arrays = isinstance(U, np.ndarray)
        values = torch.as_tensor(U).reshape(-1, 1)
        both = torch.cat([values, torch.as_tensor(grad).reshape(values.shape[0], -1)], dim=1)
        both = self.vote.extend(both)
        _collective("the all-reduce of value and gradient", lambda: dist.all_reduce(both))
        both = self.vote.count(both)
        total, summed = both[:, 0], both[:, 1:]
        finite = torch.isfinite(total) & torch.isfinite(summed).all(-1)
        total = torch.where(finite, total, torch.inf).reshape(U.shape)
        summed = torch.where(finite[:, None], summed, 0.0).reshape(grad.shape)
        return (total.numpy(), summed.numpy()) if arrays else (total, summed)
