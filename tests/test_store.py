"""Draws streamed as they come: ``hmc.sample(..., store=PATH)`` writes the DataTree to a
netCDF file chunk by chunk and returns it opened lazily, with the same groups, names and
values as the run in memory; a streaming recorder sends host memory the same draws as
one that holds the whole run (what a run on an accelerator uses)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections import namedtuple

import h5netcdf
import numpy as np
import pytest
import torch

import hmc
import hmc.run_warnings
import hmc.store
from hmc.checkpoint import read_checkpoint
from hmc.recorder import Recorder
from hmc.sampler import _warn_about_tree
from hmc.store import HostStore


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 7 iterations, so that every run below flushes many times."""
    monkeypatch.setattr(hmc.store, "STREAM_BYTES", 1)
    monkeypatch.setattr(hmc.store, "MIN_CHUNK", 7)


def standard_normal(q):
    return -0.5 * (q**2).sum(-1)


def assert_same_tree(memory, stored, exact):
    """Every group, variable, dtype and coordinate of ``memory`` is in ``stored`` with the
    same values (to rounding unless ``exact``)."""
    assert sorted(memory.children) == sorted(stored.children)
    for group in memory.children:
        a, b = memory[group].to_dataset(), stored[group].to_dataset()
        assert dict(a.sizes) == dict(b.sizes), group
        for name in [*a.data_vars, *a.coords]:
            x, y = a[name].values, b[name].values
            assert x.dtype == y.dtype, (group, name)
            if exact or x.dtype.kind not in "fc":
                np.testing.assert_array_equal(x, y, err_msg=f"{group}/{name}")
            else:
                np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-12, err_msg=f"{group}/{name}")


@pytest.mark.parametrize("save_warmup", [False, True])
def test_static_hmc_stores_exactly_the_run_in_memory(small_chunks, tmp_path, save_warmup):
    """Static HMC finishes every chain at every call, so the chunk stops change nothing:
    the file holds the in-memory run bit for bit, attrs included."""
    options = dict(dim=3, chains=3, warmup=60, draws=40, seed=2, progress=False)
    options.update(kernel=hmc.HMC(num_steps=4), save_warmup=save_warmup, batched=True)
    memory = hmc.sample(standard_normal, **options)
    stored = hmc.sample(standard_normal, store=tmp_path / "run.nc", **options)
    assert_same_tree(memory, stored, exact=True)
    for key in ("seed", "kernel", "n_gradient_evaluations", "tuning_steps", "interrupted"):
        assert stored.attrs[key] == memory.attrs[key]
        assert stored["posterior"].attrs[key] == memory["posterior"].attrs[key]


def test_nuts_on_a_model_stores_every_group(small_chunks, tmp_path):
    """NUTS chains wait for each other at each chunk's end (the batch of a gradient then
    changes, hence rounding differences); a model's constrained variables, string
    coordinates, observed data and pointwise log-likelihood are all there."""
    model = hmc.models.load("eight_schools_noncentered")
    options = dict(chains=2, warmup=40, draws=30, seed=3, progress=False)
    memory = hmc.sample(model, **options)
    stored = hmc.sample(model, store=tmp_path / "run.nc", **options)
    assert {"log_likelihood", "observed_data"} <= set(stored.children)
    assert stored["posterior"]["school"].values.tolist()[0] == "Choate"
    assert_same_tree(memory, stored, exact=False)


def test_pooled_warmup_stores_only_the_warmup_iterations_run(small_chunks, tmp_path):
    """ChEES's pooled warmup stops early; the warmup groups hold the iterations run (the
    skipped ones are left out, as in memory)."""
    options = dict(dim=3, chains=64, warmup=200, draws=30, seed=3, progress=False)
    options.update(kernel="chees")
    memory = hmc.sample(standard_normal, save_warmup=True, **options)
    stored = hmc.sample(standard_normal, save_warmup=True, store=tmp_path / "r.nc", **options)
    assert memory.attrs["tuning_steps"] < 200  # it did stop early
    assert stored["warmup_posterior"].sizes["draw"] == memory.attrs["tuning_steps"]
    assert_same_tree(memory, stored, exact=True)


def test_stored_run_opens_with_arviz_and_warns_about_unsettled_coordinates(tmp_path):
    """The unsettled-coordinate check reads the stored posterior a block at a time and
    names its coordinates; the file reads back with ArviZ."""
    import arviz

    path = tmp_path / "flat.nc"
    with pytest.warns(
        RuntimeWarning, match=r"1 of 2 coordinates \(of the stored posterior: x\[1\]\)"
    ):
        hmc.sample(
            lambda q: -0.5 * q[..., 0] ** 2, dim=2, chains=4, warmup=150, draws=150,
            batched=True, seed=1, progress=False, kernel=hmc.NUTS(max_tree_depth=5),
            store=path,
        )  # fmt: skip
    tree = arviz.from_netcdf(path)
    assert tree["posterior"]["x"].shape == (4, 150, 2)
    assert np.isfinite(tree["sample_stats"]["lp"].values).all()
    # a file holds one restarted chain as a 0-d attr: the warnings name it, not crash on it
    tree.attrs["restarted_chains"] = np.int64(2)
    with pytest.warns(RuntimeWarning, match=r"chains \[2\] stayed far below"):
        _warn_about_tree(tree)


def test_interrupted_stored_run_keeps_the_draws_every_chain_completed(small_chunks, tmp_path):
    """Ctrl-C mid-sampling: the file holds the draws every chain completed, the complete
    chunks and the part of the last one, and the attrs say it was interrupted."""
    calls = [0]

    def log_prob(q):
        calls[0] += 1
        if calls[0] == 203:
            raise KeyboardInterrupt
        return standard_normal(q)

    options = dict(dim=2, chains=2, warmup=20, draws=300, seed=4, progress=False, batched=True)
    options.update(kernel=hmc.HMC(num_steps=1), compile=False)
    with pytest.warns(RuntimeWarning, match="sampling interrupted"):
        stored = hmc.sample(log_prob, store=tmp_path / "cut.nc", **options)
    kept = stored["posterior"].sizes["draw"]
    assert 0 < kept < 300 and kept % 7 != 0  # (not a whole number of chunks)
    assert stored.attrs["interrupted"] == 1
    full = hmc.sample(standard_normal, **options)
    np.testing.assert_array_equal(
        stored["posterior"]["x"].values, full["posterior"]["x"].values[:, :kept]
    )


def test_a_run_that_fails_in_warmup_leaves_an_earlier_results_file_as_it_was(tmp_path):
    """The store replaces a file at its path only once its first chunk is complete: a
    density that raises (a bug) in warmup, or a run stopped there, leaves it whole."""
    path = tmp_path / "results.nc"
    path.write_bytes(b"an earlier run's results")
    calls = [0]

    def log_prob(q):
        calls[0] += 1
        if calls[0] == 60:
            raise TypeError("a bug in the model")
        return standard_normal(q)

    options = dict(dim=2, chains=2, warmup=50, draws=50, seed=1, progress=False, batched=True)
    with pytest.raises(TypeError, match="a bug in the model"):
        hmc.sample(log_prob, store=path, kernel=hmc.HMC(num_steps=1), compile=False, **options)
    assert path.read_bytes() == b"an earlier run's results"
    stored = hmc.sample(standard_normal, store=path, compile=False, **options)
    assert stored["posterior"].sizes["draw"] == 50  # a run that completes replaces it
    assert not (tmp_path / "results.nc.incomplete").exists()


CHECKPOINTED = dict(dim=3, chains=3, warmup=50, draws=100, seed=5, batched=True, progress=False)
CHECKPOINTED.update(save_warmup=True, checkpoint_every=20, compile=False)

KILLED_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import hmc, hmc.store

    hmc.store.STREAM_BYTES, hmc.store.MIN_CHUNK = 1, 7
    append = hmc.store.NetcdfStore.append

    def append_then_die(self, first, positions, stats):
        append(self, first, positions, stats)
        if first >= 120:  # draws in the file past the checkpoint at 120
            os.kill(os.getpid(), signal.SIGKILL)

    hmc.store.NetcdfStore.append = append_then_die
    hmc.sample(lambda q: -0.5 * (q**2).sum(-1), checkpoint=sys.argv[1], store=sys.argv[2],
               **eval(sys.argv[3]))
    """
)


@pytest.mark.slow
def test_a_stored_run_resumes_from_its_checkpoint_to_the_uninterrupted_file(small_chunks, tmp_path):
    """Killed (SIGKILL) with draws in the file past its last checkpoint, or interrupted
    (Ctrl-C) after the end's groups were written: resuming cuts the file back to the
    checkpoint's draws and ends with the file of the uninterrupted run, warmup included."""
    whole = hmc.sample(
        standard_normal, checkpoint=tmp_path / "w.ckpt", store=tmp_path / "w.nc", **CHECKPOINTED
    )
    child = subprocess.run(
        [sys.executable, "-c", KILLED_CHILD, str(tmp_path / "k.ckpt"), str(tmp_path / "k.nc"),
         repr(CHECKPOINTED)],
        capture_output=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]
    assert read_checkpoint(tmp_path / "k.ckpt")["iteration"] == 120
    with h5netcdf.File(tmp_path / "k.nc", "r") as file:
        assert file["posterior"].dimensions["draw"].size > 120 - 50
    killed = hmc.resume(tmp_path / "k.ckpt", standard_normal)
    assert_same_tree(whole, killed, exact=True)

    after = [0]  # calls after the checkpoint at 120

    def interrupting(q):
        if (tmp_path / "i.ckpt").exists() and read_checkpoint(tmp_path / "i.ckpt")[
            "iteration"
        ] >= 120:
            after[0] += 1
            if after[0] == 60:
                raise KeyboardInterrupt
        return standard_normal(q)

    with pytest.warns(RuntimeWarning, match="interrupted"):
        cut = hmc.sample(
            interrupting, checkpoint=tmp_path / "i.ckpt", store=tmp_path / "i.nc", **CHECKPOINTED
        )
    assert cut.attrs["interrupted"] == 1 and "adaptation" in cut.children
    cut.close()
    resumed = hmc.resume(tmp_path / "i.ckpt", standard_normal)
    assert resumed.attrs["interrupted"] == 0
    assert_same_tree(whole, resumed, exact=True)


def test_store_argument_errors(tmp_path):
    run = dict(dim=2, chains=1, warmup=5, draws=5, progress=False)
    with pytest.raises(TypeError, match="store must be a file path"):
        hmc.sample(standard_normal, store=3, **run)
    with pytest.raises(ValueError, match="store="):
        hmc.sample(standard_normal, store=tmp_path / "missing" / "x.nc", **run)
    with pytest.raises(ValueError, match="store=''"):
        hmc.sample(standard_normal, store="", **run)
    with pytest.raises(ValueError, match="store and checkpoint name the same file"):
        hmc.sample(standard_normal, store=tmp_path / "a", checkpoint=str(tmp_path / "a"), **run)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs a folder no one can write")
def test_a_folder_where_no_file_can_be_created_is_refused_before_sampling():
    """Tried, not read from the permission bits (which root, for one, ignores)."""
    run = dict(dim=2, chains=1, warmup=5, draws=5, progress=False)
    for name in ("store", "checkpoint"):
        with pytest.raises(ValueError, match=f"{name}='/proc/run.nc' must name a file"):
            hmc.sample(standard_normal, **{name: "/proc/run.nc"}, **run)


def test_streaming_recorder_sends_host_memory_the_same_draws():
    """A recorder with chunks of 2 iterations, its chains finishing at different calls,
    ends with the same draws and statistics in host memory as one that holds the run; its
    per-chain sums (the progress bar's) count every iteration recorded."""
    Info = namedtuple("Info", "diverging n_steps")
    chains, dim, warmup, draws = 3, 2, 2, 6
    like = torch.zeros(chains, dim, dtype=torch.float64)
    whole = Recorder(chains, warmup, draws, dim, True, like)
    store = HostStore(chains, warmup + draws, dim, np.dtype("float64"))
    chunked = Recorder(chains, warmup, draws, dim, True, like, store=store, chunk=2)
    assert chunked.ends(0, warmup + draws) == [2, 4, 6]
    rng = np.random.default_rng(1)
    iteration = torch.zeros(chains, dtype=torch.int64)
    stops = [2, 4, 6, 8]
    while stops:
        done = torch.as_tensor(rng.random(chains) < 0.5) & (iteration < stops[0])
        position = torch.as_tensor(rng.normal(size=(chains, dim)))
        state = hmc.State(position, -position.sum(-1), position)
        info = Info(torch.as_tensor(rng.random(chains) < 0.3), torch.as_tensor([1, 2, 3]))
        for recorder in (whole, chunked):
            recorder.write(done, iteration, state, info, torch.full((chains,), 0.5))
        iteration = iteration + done
        if (iteration == stops[0]).all():
            chunked.flush(stops.pop(0))
    window = slice(0, warmup + draws)
    np.testing.assert_array_equal(whole.draws(window), chunked.draws(window))
    for name, value in whole.stats(window).items():
        np.testing.assert_array_equal(value, chunked.stats(window)[name])
        np.testing.assert_allclose(value.sum(1), chunked.chain_sums(name), rtol=1e-12)
    assert int(whole.divergences) == int(chunked.divergences)


def test_a_run_off_the_cpu_streams_to_host_memory(small_chunks):
    """The sampler's recorder for a device other than the CPU holds chunks and sends them
    to host memory (checked without a GPU: the choice depends on the device's type)."""
    from hmc.sampler import _recorder

    like = torch.zeros(4, 3, dtype=torch.float32)
    on_gpu = _recorder(None, None, 4, 10, 5000, 3, False, like, torch.device("cuda"))
    assert isinstance(on_gpu.store, HostStore) and on_gpu.chunk == 7
    assert on_gpu.store.positions.dtype == np.float32
    assert _recorder(None, None, 4, 10, 5000, 3, False, like, torch.device("cpu")).store is None


def test_a_resume_refuses_a_store_file_of_another_run(small_chunks, tmp_path):
    """The store file keeps its run's identity: a checkpoint resumed beside a file that
    another run wrote at the same path is refused, not continued into the other's draws."""
    options = dict(dim=2, chains=2, warmup=20, draws=40, progress=False, batched=True)
    options.update(kernel=hmc.HMC(num_steps=2), compile=False, checkpoint_every=20)
    store = tmp_path / "run.nc"
    for seed, path in ((1, store), (2, tmp_path / "other.nc")):  # (each file closed after)
        hmc.sample(
            standard_normal, seed=seed, store=path, checkpoint=tmp_path / f"{seed}.ckpt", **options
        ).close()
    other = tmp_path / "other.nc"
    store.write_bytes(other.read_bytes())  # another run's file where this run's was
    with pytest.raises(ValueError, match="holds another run's draws"):
        hmc.resume(tmp_path / "1.ckpt", standard_normal)


def test_a_resume_beside_an_unreadable_store_file_names_it(small_chunks, tmp_path):
    """A kill while a chunk is written can leave the file unreadable: the resume says so,
    naming the file, rather than failing inside h5py."""
    options = dict(dim=2, chains=2, warmup=20, draws=40, progress=False, batched=True)
    options.update(kernel=hmc.HMC(num_steps=2), compile=False, checkpoint_every=20)
    store = tmp_path / "run.nc"
    checkpoint = tmp_path / "run.ckpt"
    hmc.sample(standard_normal, seed=1, store=store, checkpoint=checkpoint, **options).close()
    store.write_bytes(store.read_bytes()[:1000])  # cut short
    with pytest.raises(ValueError, match=r"store='.*run.nc' cannot be read"):
        hmc.resume(checkpoint, standard_normal)
