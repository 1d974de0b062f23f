"""Where a run's draws go as they come: host memory, or a netCDF file.

A streaming :class:`hmc.recorder.Recorder` keeps one chunk of iterations in its buffers and
sends each complete chunk here:

- :class:`HostStore`: NumPy arrays of the whole run in host memory. A run on an
  accelerator uses it, so the device holds one chunk of draws, not the run.
- :class:`NetcdfStore` (``hmc.sample(..., store=PATH)``): each chunk is appended to a
  netCDF file (HDF5, through ``h5netcdf``) with the groups and names of the DataTree that
  :func:`hmc.sample` returns, so memory holds one chunk whatever the length of the run. At
  the end the run's attrs and its ``adaptation`` group are written and ``hmc.sample``
  returns the file opened lazily (``xarray.open_datatree``): a run larger than memory
  completes and opens with ArviZ. Between chunks the file is closed, so a run that dies
  leaves the draws of its complete chunks readable (the end's attrs missing). With
  ``checkpoint=`` as well, the checkpoint holds everything but the draws; resuming cuts
  the file back to the draws it held at the checkpoint and goes on. A file already at
  the path is replaced only once the run's first chunk is complete: until then the run
  writes to ``PATH.incomplete`` (:data:`INCOMPLETE`), so a run that fails or is stopped
  in its warmup leaves an earlier results file as it was.

:data:`STREAM_BYTES` sets the chunk: as many iterations as fit in it, at least
:data:`MIN_CHUNK`. Every chain waits for the others at each chunk's end.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from hmc.target import Target
from hmc.to_arviz import netcdf_value, to_datatree

__all__ = [
    "INCOMPLETE",
    "MIN_CHUNK",
    "STREAM_BYTES",
    "HostStore",
    "NetcdfStore",
    "chunk_iterations",
]

#: the most a streaming recorder buffers per chunk, in bytes
STREAM_BYTES = 64 * 2**20
#: the fewest iterations in a chunk (every chain waits for the others at each chunk's end)
MIN_CHUNK = 20
#: the suffix of the name a store writes under until its first chunk is complete
INCOMPLETE = ".incomplete"
#: the root attribute of a store's file that holds its run's identity
RUN = "hmc_run"


def chunk_iterations(chains: int, dim: int, itemsize: int) -> int:
    """Iterations per chunk for ``chains`` chains of dimension ``dim``: those whose draws
    and statistics fit in :data:`STREAM_BYTES`, at least :data:`MIN_CHUNK`."""
    per_iteration = chains * (dim * itemsize + 12 * 8)
    return max(MIN_CHUNK, STREAM_BYTES // per_iteration)


class HostStore:
    """The kept iterations of every chain in host memory: ``positions`` ``(C, kept + 1,
    D)`` and ``stats`` ``name -> (C, kept + 1)`` (the recorder's layout, spare column
    included), filled chunk by chunk."""

    def __init__(self, chains: int, kept: int, dim: int, dtype: np.dtype) -> None:
        self.positions = np.zeros((chains, kept + 1, dim), dtype=dtype)
        self.stats: dict[str, np.ndarray] = {}

    def append(self, first: int, positions: np.ndarray, stats: dict[str, np.ndarray]) -> None:
        count = positions.shape[1]
        self.positions[:, first : first + count] = positions
        for name, value in stats.items():
            if name not in self.stats:
                self.stats[name] = np.zeros(self.positions.shape[:2], dtype=value.dtype)
            self.stats[name][:, first : first + count] = value

    def held(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        return self.positions, self.stats

    def restore(
        self, positions: np.ndarray, stats: dict[str, np.ndarray], iteration: int
    ) -> dict[str, np.ndarray]:
        self.positions, self.stats = positions, stats
        return {name: value.sum(1) for name, value in stats.items()}


class NetcdfStore:
    """A run's DataTree written to the netCDF file ``path`` chunk by chunk.

    The draws and statistics of the kept iterations go to ``posterior`` and
    ``sample_stats`` (``warmup_posterior``, ``warmup_sample_stats`` for the warmup's, from
    ``offset = 0``), with the ``target``'s further groups; the ``draw`` dimension of each
    grows with every chunk. An existing file is replaced once the first chunk is complete
    (written under the name with :data:`INCOMPLETE` appended until then), unless the run
    resumes from a checkpoint that follows a complete chunk (``resuming``, with the warmup
    iterations its early stop ``skipped``; :meth:`restore` cuts the file back to the draws
    it held then). The file keeps the run's identity ``run`` (its settings and seed) in
    the root attribute :data:`RUN`, and a resume refuses a file with another.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        target: Target,
        warmup: int,
        offset: int,
        resuming: bool = False,
        skipped: tuple[int, int] | None = None,
        run: str = "",
    ) -> None:
        self.path = os.fspath(path)
        self.run = run  # the run's identity, kept in the file's RUN attribute
        self.target = target
        self.warmup = warmup
        self.offset = offset
        self.dims, self.coords = target.dims_and_coords()
        self.groups: set[str] = set()  # those in the file
        self.skipped = skipped  # (resuming) the warmup iterations no chain ran
        # where the chunks go: a name of their own until the first is complete
        self.writing = self.path if resuming else self.path + INCOMPLETE
        if os.path.exists(self.writing) and not resuming:
            os.remove(self.writing)  # an earlier run's incomplete file

    def held(self) -> None:
        return None  # the file holds the draws

    def restore(
        self, positions: np.ndarray, stats: dict[str, np.ndarray], iteration: int
    ) -> dict[str, np.ndarray]:
        """Cut the file back to the draws of the first ``iteration`` iterations (a later
        chunk or the end's ``adaptation`` group may have been written after the
        checkpoint); return each statistic's per-chain sums over what it keeps."""
        import h5py

        ran = np.arange(min(iteration, self.warmup))
        if self.skipped is not None:
            ran = ran[(ran < self.skipped[0]) | (ran >= self.skipped[1])]
        sizes = {"warmup": ran.size if self.offset == 0 else 0, "": max(0, iteration - self.warmup)}
        if not any(sizes.values()):  # no chunk was complete: the file at the path is not ours
            self.writing = self.path + INCOMPLETE
            if os.path.exists(self.writing):
                os.remove(self.writing)
            return {}
        if not os.path.exists(self.path):
            raise ValueError(f"store={self.path!r} is missing: it held the draws so far")
        sums: dict[str, np.ndarray] = {}
        try:
            file = h5py.File(self.path, "a")
        except OSError as error:  # a kill while a chunk was being written, say
            raise ValueError(
                f"store={self.path!r} cannot be read ({error}): it held the draws so far, "
                "so the run cannot go on from its checkpoint; start it afresh"
            ) from None
        with file:
            found = file.attrs.get(RUN)
            if (found.decode() if isinstance(found, bytes) else found) != self.run:
                raise ValueError(
                    f"store={self.path!r} holds another run's draws (not those of the run "
                    "its checkpoint continues): move it away, or resume with the file this "
                    "run wrote"
                )
            if "adaptation" in file:
                del file["adaptation"]
            self.groups = set(file)
        with h5netcdf_file(self.path) as file:
            for name in self.groups:
                group = file[name]
                if "draw" not in group.dimensions:
                    continue
                size = sizes["warmup" if name.startswith("warmup_") else ""]
                if group.dimensions["draw"].size < size:
                    raise ValueError(
                        f"store={self.path!r} holds fewer draws than its run's checkpoint "
                        f"({group.dimensions['draw'].size} in {name!r}, {size} expected)"
                    )
                group.resize_dimension("draw", size)
                if name.endswith("sample_stats"):
                    for stat, variable in group.variables.items():
                        if variable.dimensions == ("chain", "draw"):
                            value = np.asarray(variable[:, :size]).sum(1)
                            sums[stat] = sums.get(stat, 0) + value
        return sums

    def append(self, first: int, positions: np.ndarray, stats: dict[str, np.ndarray]) -> None:
        split = int(np.clip(self.warmup - (first + self.offset), 0, positions.shape[1]))
        if split:
            self._write(positions[:, :split], _columns(stats, 0, split), warmup=True)
        if split < positions.shape[1]:
            self._write(positions[:, split:], _columns(stats, split, None), warmup=False)
        self._complete()

    def _complete(self) -> None:
        """The file written so far takes the path (replacing what was there), once."""
        if self.writing != self.path:
            os.replace(self.writing, self.path)
            self.writing = self.path

    def _write(self, positions: np.ndarray, stats: dict[str, np.ndarray], warmup: bool) -> None:
        """Append a chunk's groups, made by the code that makes the in-memory DataTree."""
        target = self.target
        extra = {} if warmup else target.extra_groups(positions)
        tree = to_datatree(
            target.posterior(positions),
            stats,
            extra_groups=extra,
            dims=self.dims,
            coords=self.coords,
        )
        prefix = "warmup_" if warmup else ""
        datasets = {
            (prefix + node.name): node.to_dataset(inherit=False) for node in tree.children.values()
        }
        new = {name: ds for name, ds in datasets.items() if name not in self.groups}
        first = not self.groups
        for name, dataset in new.items():
            dataset.attrs = {}
            has_draw = "draw" in dataset.dims
            dataset.to_netcdf(
                self.writing,
                mode="a" if os.path.exists(self.writing) else "w",
                group=name,
                engine="h5netcdf",
                unlimited_dims=["draw"] if has_draw else None,
            )
            self.groups.add(name)
        if first:
            with h5netcdf_file(self.writing) as file:
                file.attrs[RUN] = self.run
        later = {name: ds for name, ds in datasets.items() if name not in new and "draw" in ds.dims}
        if not later:
            return
        with h5netcdf_file(self.writing) as file:
            for name, dataset in later.items():
                group = file[name]
                start = group.dimensions["draw"].size
                count = dataset.sizes["draw"]
                group.resize_dimension("draw", start + count)
                group.variables["draw"][start:] = np.arange(start, start + count)
                for variable_name, variable in dataset.data_vars.items():
                    axis = variable.dims.index("draw")
                    where = (slice(None),) * axis + (slice(start, start + count),)
                    group.variables[variable_name][where] = variable.values

    def finish(self, attrs: dict[str, Any], adaptation: Any) -> Any:
        """Write the run's ``attrs`` (on the root, ``posterior`` and ``sample_stats``, as
        in memory) and its ``adaptation`` DataTree; return the file opened lazily."""
        import xarray

        adaptation.to_dataset().to_netcdf(
            self.writing,
            mode="a" if os.path.exists(self.writing) else "w",
            group="adaptation",
            engine="h5netcdf",
        )
        self._complete()
        clean = {key: netcdf_value(value) for key, value in attrs.items()}
        with h5netcdf_file(self.path) as file:
            for group in (file, *(file[g] for g in ("posterior", "sample_stats") if g in file)):
                for key, value in clean.items():
                    group.attrs[key] = np.asarray(value) if isinstance(value, list) else value
        return xarray.open_datatree(self.path, engine="h5netcdf")


def h5netcdf_file(path: str) -> Any:
    """The netCDF file at ``path``, open to append."""
    import h5netcdf

    return h5netcdf.File(path, "a")


def _columns(stats: dict[str, np.ndarray], start: int, stop: int | None) -> dict[str, np.ndarray]:
    return {name: value[:, start:stop] for name, value in stats.items()}
