"""The driver ``hmc.sample``: counting, output layout, ArviZ interplay, reproducibility."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import xarray
from conftest import diagonal_gaussian_log_prob, in_engine, mcse_z_scores, z_bound

import hmc

STAT_NAMES = {
    "lp",
    "acceptance_rate",
    "step_size",
    "n_steps",
    "diverging",
    "energy",
    "energy_error",
    "max_energy_error",
}
SD = np.array([0.5, 1.0, 2.0])
ELEMENTWISE = diagonal_gaussian_log_prob(np.zeros(3), SD)


def small_run(**kwargs):
    options = dict(dim=3, chains=3, warmup=60, draws=40, kernel=hmc.HMC(), seed=1, progress=False)
    options.update(kwargs)
    return hmc.sample(ELEMENTWISE, **options)


def all_arrays(dt):
    """Every data variable and coordinate of every group: {(group, name): ndarray}."""
    out = {}
    for node in dt.subtree:
        for name, var in node.dataset.variables.items():
            out[(node.path, name)] = var.values
    return out


def assert_identical(a, b):
    arrays_a, arrays_b = all_arrays(a), all_arrays(b)
    assert arrays_a.keys() == arrays_b.keys()
    for key, value in arrays_a.items():
        assert value.dtype == arrays_b[key].dtype, key
        assert np.array_equal(value, arrays_b[key]), key


# ---------------------------------------------------------------------- counting
@pytest.mark.parametrize(("chains", "draws", "L"), [(1, 7, 3), (4, 25, 5), (3, 10, 1)])
def test_gradient_evaluations_are_one_per_leapfrog_step(chains, draws, L):
    dt = hmc.sample(
        ELEMENTWISE,
        dim=3,
        chains=chains,
        warmup=0,
        draws=draws,
        kernel=hmc.HMC(num_steps=L),
        step_size=0.1,
        seed=3,
        progress=False,
    )
    assert dt.attrs["n_gradient_evaluations"] == chains * (1 + draws * L)
    assert (dt["sample_stats"]["n_steps"].values == L).all()
    assert (dt["sample_stats"]["step_size"].values == 0.1).all()


def test_random_length_counts_match_the_reported_steps():
    dt = hmc.sample(
        ELEMENTWISE, dim=3, chains=4, warmup=0, draws=30, kernel=hmc.HMC(), step_size=0.4,
        seed=3, progress=False,
    )  # fmt: skip
    n_steps = dt["sample_stats"]["n_steps"].values
    assert n_steps.min() >= 1 and n_steps.max() <= math.ceil(2 * math.pi / 0.4)
    assert len(np.unique(n_steps)) > 3
    assert dt.attrs["n_gradient_evaluations"] == 4 + n_steps.sum()


def test_output_groups_names_and_dims():
    dt = small_run()
    assert {"posterior", "sample_stats", "adaptation"} <= set(dt.children)
    assert "warmup_posterior" not in dt.children
    x = dt["posterior"]["x"]
    assert x.dims == ("chain", "draw", "x_dim_0")
    assert x.shape == (3, 40, 3) and x.dtype == np.float64
    assert np.isfinite(x.values).all()
    stats = dt["sample_stats"]
    assert set(stats.data_vars) >= STAT_NAMES
    for name in STAT_NAMES:
        assert stats[name].dims == ("chain", "draw"), name
        assert np.isfinite(stats[name].values.astype(float)).all(), name
    assert stats["diverging"].dtype == bool
    assert np.issubdtype(stats["n_steps"].dtype, np.integer)
    # lp is the log density of the recorded draws
    lp = ELEMENTWISE(torch.as_tensor(x.values)).numpy()
    np.testing.assert_allclose(stats["lp"].values, lp, rtol=1e-12, atol=1e-12)
    # energy = -lp + kinetic >= -lp
    assert (stats["energy"].values >= -stats["lp"].values - 1e-12).all()
    assert ((stats["acceptance_rate"].values >= 0) & (stats["acceptance_rate"].values <= 1)).all()
    for key in ("inference_library", "n_gradient_evaluations", "sampling_time"):
        assert key in dt.attrs, key
        assert key in dt["posterior"].attrs, key
    assert dt.attrs["inference_library"] == "hmc"
    assert dt.attrs["inference_library_version"] == hmc.__version__
    assert dt.attrs["sampling_time"] > 0
    assert dt.attrs["seed"] == 1
    adaptation = dt["adaptation"]
    assert adaptation["step_size"].shape == (3,)
    assert adaptation["inverse_metric"].shape == (3, 3)


def test_save_warmup_adds_the_warmup_groups():
    dt = small_run(save_warmup=True)
    assert {"warmup_posterior", "warmup_sample_stats"} <= set(dt.children)
    assert dt["warmup_posterior"]["x"].shape == (3, 60, 3)
    assert set(dt["warmup_sample_stats"].data_vars) >= STAT_NAMES
    assert dt["warmup_sample_stats"]["lp"].shape == (3, 60)
    # the kept draws are the same as without save_warmup
    plain = small_run(save_warmup=False)
    assert np.array_equal(plain["posterior"]["x"].values, dt["posterior"]["x"].values)
    # warmup iterations are distinct from the draws, and warmup moved
    warm = dt["warmup_posterior"]["x"].values
    assert not np.array_equal(warm[:, -40:], dt["posterior"]["x"].values)
    assert np.ptp(warm, axis=1).min() > 0


def test_dense_metric_in_the_output():
    dense = small_run(metric="dense", warmup=150)
    inverse = dense["adaptation"]["inverse_metric"].values
    assert inverse.shape == (3, 3, 3)
    np.testing.assert_allclose(inverse, np.swapaxes(inverse, 1, 2))
    assert (np.linalg.eigvalsh(inverse) > 0).all()
    assert dense.attrs["metric"] == "dense"


def test_identity_metric_is_not_adapted():
    identity = small_run(metric="identity")
    assert (identity["adaptation"]["inverse_metric"].values == 1).all()
    assert identity.attrs["metric"] == "identity"
    diag = small_run(metric="diag", warmup=150)
    assert not (diag["adaptation"]["inverse_metric"].values == 1).all()


def starts(init, chains=4):
    """The chains' starting points: one step of 1e-12 moves them by less than 1e-9."""
    with warnings.catch_warnings():  # ArviZ warns of more chains than draws
        warnings.filterwarnings("ignore", "Found chain dimension")
        dt = hmc.sample(
            ELEMENTWISE, init=init, dim=3, chains=chains, warmup=0, draws=1,
            kernel=hmc.HMC(num_steps=1), step_size=1e-12, seed=5, progress=False,
        )  # fmt: skip
    return dt["posterior"]["x"].values[:, 0]


def test_init_is_used_and_broadcast():
    init = torch.tensor([0.1, -0.2, 0.3], dtype=torch.float64)
    np.testing.assert_allclose(starts(init, chains=2), init.expand(2, 3), atol=1e-9)
    per_chain = torch.tensor([[0.1, 0.2, 0.3], [3.0, 2.0, 1.0]], dtype=torch.float64)
    np.testing.assert_allclose(starts(per_chain, chains=2), per_chain, atol=1e-9)


def test_init_radius_sets_the_random_starts():
    default = starts(None, chains=64)
    assert 1.5 < np.abs(default).max() <= 2.0
    # the default radius is 2: the same uniforms, the same starts
    np.testing.assert_array_equal(starts(2.0, chains=64), default)
    # radius R scales the same uniforms to (-R, R)
    np.testing.assert_allclose(starts(0.25, chains=64), default / 8, atol=1e-9)
    np.testing.assert_allclose(starts(0, chains=2), np.zeros((2, 3)), atol=1e-9)


def test_float32():
    dt = small_run(dtype=torch.float32)
    assert dt["posterior"]["x"].dtype == np.float32
    assert np.isfinite(dt["posterior"]["x"].values).all()


# ---------------------------------------------------------------------- ArviZ
def test_arviz_summary_and_plots_run(tmp_path):
    import arviz as az
    import matplotlib.pyplot as plt

    dt = small_run(save_warmup=True)
    summary = az.summary(dt)
    assert list(summary.index) == ["x[0]", "x[1]", "x[2]"]
    assert {"mean", "sd", "ess_bulk", "r_hat"} <= set(summary.columns)
    with az.rc_context({"plot.backend": "matplotlib"}):
        for name, plot in {
            "trace": az.plot_trace_dist(dt),
            "rank": az.plot_rank(dt),
            "energy": az.plot_energy(dt),
        }.items():
            path = tmp_path / f"{name}.png"
            plot.savefig(path, dpi=40)
            assert path.stat().st_size > 1000
    plt.close("all")
    assert np.isfinite(az.bfmi(dt)["energy"].values).all()


def _netcdf_round_trip(dt, path):
    import arviz as az

    dt.to_netcdf(path, engine="h5netcdf")
    for loaded in (az.from_netcdf(path), xarray.open_datatree(path, engine="h5netcdf")):
        assert set(dt.children) <= set(loaded.children)
        for group in dt.children:
            for name, var in dt[group].dataset.data_vars.items():
                assert np.array_equal(loaded[group][name].values, var.values), (group, name)
        assert loaded.attrs["inference_library"] == "hmc"
        assert loaded.attrs["n_gradient_evaluations"] == dt.attrs["n_gradient_evaluations"]


def test_netcdf_round_trip(tmp_path):
    dt = small_run(save_warmup=True)
    _netcdf_round_trip(dt, tmp_path / "run.nc")


# ---------------------------------------------------------------------- reproducibility
@pytest.mark.parametrize("kernel", [hmc.HMC(), hmc.HMC(num_steps=3)])
def test_same_seed_gives_bit_identical_output(kernel):
    a = small_run(kernel=kernel, seed=42, save_warmup=True, warmup=120)
    b = small_run(kernel=kernel, seed=42, save_warmup=True, warmup=120)
    assert_identical(a, b)
    c = small_run(kernel=kernel, seed=43, save_warmup=True, warmup=120)
    assert not np.array_equal(a["posterior"]["x"].values, c["posterior"]["x"].values)
    assert not np.array_equal(
        a["sample_stats"]["acceptance_rate"].values, c["sample_stats"]["acceptance_rate"].values
    )


@pytest.mark.parametrize("num_steps", [None, 3])
def test_static_hmc_gives_the_same_run_on_both_engines(num_steps):
    """With the NumPy engine the lockstep loop keeps step sizes and the adaptation in
    NumPy: a short warmup, recorded, gives the torch engine's run to rounding (energy
    errors of 1e8 in the first warmup iterations differ in the 13th digit), with the same
    numbers of steps, the same divergences and the same gradient count; both record every
    statistic in the same dtype."""
    options = dict(warmup=15, draws=30, save_warmup=True, seed=6)
    runs = [
        small_run(kernel=hmc.HMC(num_steps=num_steps), engine=engine, **options)
        for engine in ("numpy", "torch")
    ]
    host, tensor = (all_arrays(dt) for dt in runs)
    assert host.keys() == tensor.keys()
    for key, value in host.items():
        assert value.dtype == tensor[key].dtype, key
        if value.dtype.kind in "biu":  # steps, divergences, coordinates
            assert np.array_equal(value, tensor[key]), key
        else:
            np.testing.assert_allclose(value, tensor[key], rtol=1e-9, atol=1e-9, err_msg=str(key))
    assert runs[0].attrs["n_gradient_evaluations"] == runs[1].attrs["n_gradient_evaluations"]
    step = runs[0]["warmup_sample_stats"]["step_size"].values
    assert not (step == step[:, :1]).all()  # the step sizes did adapt


def test_recorder_keeps_each_chain_at_its_own_iteration(engine):
    """Chains that finish at different iterations land in their own slots; chains not
    done, and warmup iterations not kept, write nothing (the spare column takes them)."""
    from collections import namedtuple

    from hmc.recorder import Recorder

    Info = namedtuple("Info", "diverging n_steps")
    chains, dim, warmup, draws = 3, 2, 2, 3
    position = torch.arange(chains * dim, dtype=torch.float64).reshape(chains, dim)
    state = in_engine(hmc.State(position, -position.sum(-1), position), engine)
    recorder = Recorder(chains, warmup, draws, dim, False, state.position)
    iteration = in_engine(torch.tensor([1, 2, 4]), engine)  # warmup, first kept, last
    done = in_engine(torch.tensor([True, True, False]), engine)
    info = in_engine(Info(torch.tensor([True, True, True]), torch.tensor([3, 5, 7])), engine)
    step_size = in_engine(torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64), engine)
    recorder.write(done, iteration, state, info, step_size)
    kept = recorder.draws(slice(0, draws))
    assert kept.shape == (chains, draws, dim)
    np.testing.assert_array_equal(kept[1, 0], position[1].numpy())
    assert not kept[[0, 2]].any() and not kept[1, 1:].any()
    stats = recorder.stats(slice(0, draws))
    assert list(stats) == ["lp", "step_size", "diverging", "n_steps"]
    assert stats["n_steps"].tolist() == [[0, 0, 0], [5, 0, 0], [0, 0, 0]]
    assert stats["step_size"][1, 0] == 0.2 and stats["lp"][1, 0] == position[1].sum()
    assert int(recorder.divergences) == 1  # chain 0's is in warmup, chain 2 not done


def test_seed_none_is_random_and_recorded():
    a, b = small_run(seed=None), small_run(seed=None)
    assert a.attrs["seed"] != b.attrs["seed"]
    again = small_run(seed=a.attrs["seed"])
    assert np.array_equal(again["posterior"]["x"].values, a["posterior"]["x"].values)


def test_a_chain_does_not_depend_on_the_other_chains():
    """Chain c's draws depend only on (seed, c): the same with 2 or 4 chains."""
    two = small_run(chains=2, seed=5)
    four = small_run(chains=4, seed=5)
    for group in ("posterior", "sample_stats", "adaptation"):
        for name, var in two[group].dataset.data_vars.items():
            np.testing.assert_array_equal(var.values, four[group][name].values[:2], err_msg=name)


# ---------------------------------------------------------------------- trouble mid-run
def test_zero_density_on_half_the_space():
    """log p = -inf where q0 < -1: no crash, no NaN, every draw inside the support, and the
    truncated normal's mean is right.

    (With adaptation, every trajectory that crosses the wall is rejected whatever the step
    size, so dual averaging drives the step size down and drawn trajectory lengths up to
    ``max_steps``; a fixed number of steps keeps this test cheap.)
    """

    def log_prob(q):
        lp = -0.5 * (q**2).sum(-1)
        return torch.where(q[..., 0] < -1.0, -torch.inf, lp)

    dt = hmc.sample(
        log_prob, dim=2, chains=4, warmup=100, draws=1000, kernel=hmc.HMC(num_steps=4),
        seed=4, batched=True, progress=False, save_warmup=True,
    )  # fmt: skip
    for group in ("posterior", "sample_stats", "warmup_posterior", "warmup_sample_stats"):
        for name, var in dt[group].dataset.data_vars.items():
            assert not np.isnan(var.values.astype(float)).any(), (group, name)
    x = dt["posterior"]["x"].values
    assert (x[..., 0] >= -1.0).all()
    assert np.isfinite(dt["sample_stats"]["lp"].values).all()
    assert dt["sample_stats"]["diverging"].values.any()  # proposals beyond the wall
    # E[q0 | q0 > -1] = phi(-1) / (1 - Phi(-1)); q1 is untouched
    phi = math.exp(-0.5) / math.sqrt(2 * math.pi)
    Phi = 0.5 * (1 + math.erf(-1 / math.sqrt(2)))
    truth = np.array([phi / (1 - Phi), 0.0])
    z, _, _ = mcse_z_scores(x, truth)
    assert (np.abs(z) < z_bound(2)).all(), z


@pytest.mark.parametrize("kernel", [hmc.HMC(num_steps=4), hmc.NUTS()])
def test_progress_bar_counts_the_draws_and_their_divergences(kernel, engine, capsys):
    """The bar ends at every chain's every iteration and shows the divergent draws kept
    (the wall of the half-space density makes some)."""

    def log_prob(q):
        return torch.where(q[..., 0] < -1.0, -torch.inf, -0.5 * (q**2).sum(-1))

    dt = hmc.sample(
        log_prob, dim=2, chains=3, warmup=20, draws=30, kernel=kernel, seed=2, batched=True,
        progress=True, engine=engine,
    )  # fmt: skip
    lines = re.split(r"[\r\n]", capsys.readouterr().err)
    per_chain = dt["sample_stats"]["diverging"].values.sum(1)
    assert per_chain.sum() > 0
    for chain, divergent in enumerate(per_chain):
        final = [line for line in lines if line.strip().startswith(f"chain {chain} ")][-1]
        assert "50/50" in final and f"{divergent} divergent" in final, final
    assert any("150/150" in line for line in lines)


def test_log_prob_that_raises_mid_run_is_a_rejection():
    def log_prob(q):
        if q[0] > 1.5:
            raise ValueError("outside")
        return -0.5 * (q**2).sum()

    with pytest.warns(RuntimeWarning):
        dt = hmc.sample(
            log_prob, dim=2, chains=2, warmup=30, draws=30, kernel=hmc.HMC(num_steps=5),
            seed=0, progress=False, init=torch.zeros(2, dtype=torch.float64),
        )  # fmt: skip
    x = dt["posterior"]["x"].values
    assert (x[..., 0] <= 1.5).all() and np.isfinite(x).all()


def test_a_chains_draws_do_not_depend_on_how_many_chains_run(engine):
    """Chain c's random numbers come from (seed, c) alone, so with a given step size and
    no warmup its static HMC draws with 1 chain and with 8 agree to rounding (the last
    bits of batched arithmetic may depend on the batch size and the CPU's vector width,
    so equality is not asserted)."""
    options = dict(kernel=hmc.HMC(), warmup=0, step_size=0.3, draws=200, seed=12, engine=engine)
    one, eight = (small_run(chains=chains, **options) for chains in (1, 8))
    np.testing.assert_allclose(
        one["posterior"]["x"].values[0], eight["posterior"]["x"].values[0], rtol=0, atol=1e-12
    )
    assert np.array_equal(
        one["sample_stats"]["n_steps"].values[0], eight["sample_stats"]["n_steps"].values[0]
    )
    assert not np.allclose(eight["posterior"]["x"].values[0], eight["posterior"]["x"].values[1])


def test_a_short_run_imports_neither_arviz_stats_nor_sympy() -> None:
    """Importing ArviZ's statistics takes over a second, SymPy half a second: a short (eager)
    run's own checks and gradients do without them (``hmc.diagnostics``, the energy's
    implicit cotangent)."""
    code = (
        "import sys, torch, hmc\n"
        "hmc.sample(lambda x: -0.5 * (x * x).sum(-1), dim=2, chains=8, warmup=150, draws=120,\n"
        "           adapt='ensemble', kernel='chees', seed=1, progress=False)\n"
        "hmc.sample(lambda x: -0.5 * (x * x).sum(-1), dim=2, chains=2, warmup=100, draws=100,\n"
        "           seed=1, progress=False)\n"
        "print('arviz_stats' in sys.modules, 'sympy' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]
