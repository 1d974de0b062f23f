"""The command line (``python -m hmc``) and the demo model."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import mcse_z_scores, z_bound

import hmc
from hmc.__main__ import build_parser, main
from hmc.demo import EIGHT_SCHOOLS_SIGMA, EIGHT_SCHOOLS_Y, MODELS, get_model, run_demo

OUTPUTS = ("trace.png", "rank.png", "energy.png", "run.nc")


def run_cli(*args, cwd=None):
    env = dict(os.environ, CI="1", MPLBACKEND="Agg")
    return subprocess.run(
        [sys.executable, "-m", "hmc", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env=env,
    )


def check_outputs(out):
    import arviz as az

    for name in OUTPUTS:
        path = out / name
        assert path.is_file(), name
        assert path.stat().st_size > 1000, name
    dt = az.from_netcdf(out / "run.nc")
    assert {"posterior", "sample_stats"} <= set(dt.children)
    assert {"mu", "tau", "theta"} <= set(dt["posterior"].data_vars)
    assert dt["posterior"]["theta"].dims == ("chain", "draw", "school")
    assert dt.attrs["inference_library"] == "hmc"
    assert dt.attrs["model"] == "eight_schools"
    return dt


# ---------------------------------------------------------------------- help
def test_help_explains_every_command_and_option(capsys):
    top = run_cli("--help")
    assert top.returncode == 0, top.stderr
    assert "demo" in top.stdout
    with pytest.raises(SystemExit) as info:
        main(["demo", "--help"])
    assert info.value.code == 0
    demo = capsys.readouterr().out
    for option in ("--out", "--chains", "--draws", "--warmup", "--seed", "--kernel"):
        assert option in demo, option
    assert "nuts" in demo and "hmc" in demo
    for name in OUTPUTS:
        assert name in demo, name
    # every command and every option has a help text
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {choice.dest: choice.help for choice in commands._choices_actions}
    assert set(helps) == set(commands.choices) and all(helps.values()), helps
    for name, sub in commands.choices.items():
        for action in sub._actions:
            assert action.help, (name, action.dest)


def test_no_command_prints_help(capsys):
    assert main([]) != 0
    assert "demo" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args",
    [
        ["demo", "--chains", "0"],
        ["demo", "--draws", "-5"],
        ["demo", "--warmup", "ten"],
        ["demo", "--seed", "-1"],
        ["demo", "--kernel", "metropolis"],
        ["sample-everything"],
    ],
)
def test_bad_arguments_exit_with_usage(args, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    assert "usage" in capsys.readouterr().err


# ---------------------------------------------------------------------- the demo runs
def test_demo_command_writes_its_four_files(tmp_path):
    """``python -m hmc demo`` with the default kernel, small settings."""
    out = tmp_path / "demo out"
    result = run_cli(
        "demo", "--out", str(out), "--chains", "2", "--draws", "100", "--warmup", "100",
        "--seed", "3",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mu" in result.stdout and "tau" in result.stdout and "ess_bulk" in result.stdout
    # not a terminal: the run is told in plain lines (the progress on standard error)
    assert "2 chains, 100 warmup and 100 draws each, kernel nuts, seed 3" in result.stdout
    assert "sampling: 400/400 iterations (100%)" in result.stderr, result.stderr[-3000:]
    assert "sampled in " in result.stdout
    dt = check_outputs(out)
    assert dt["posterior"].sizes["chain"] == 2 and dt["posterior"].sizes["draw"] == 100


@pytest.mark.slow  # 6 s: the quick tier keeps within its five minutes
def test_demo_in_process_with_static_hmc(tmp_path, capsys):
    assert main(
        ["demo", "--out", str(tmp_path), "--chains", "2", "--draws", "60", "--warmup", "60",
         "--kernel", "hmc", "--seed", "1"]
    ) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "theta[Choate]" in printed
    dt = check_outputs(tmp_path)
    assert dt.attrs["kernel"] == "HMC"
    # the same seed gives the same run
    again = run_demo(tmp_path / "again", chains=2, draws=60, warmup=60, kernel="hmc", seed=1,
                     echo=lambda _: None)  # fmt: skip
    assert np.array_equal(again["posterior"]["mu"].values, dt["posterior"]["mu"].values)


def test_an_unwritable_out_fails_before_sampling(tmp_path, monkeypatch):
    """A file where the folder should be is named at once: nothing is sampled (and so
    nothing is lost after a long run)."""
    blocker = tmp_path / "taken"
    blocker.write_text("not a folder")
    monkeypatch.setattr(hmc, "sample", lambda *a, **k: pytest.fail("sampled before checking out"))
    with pytest.raises(ValueError, match="is not a writable folder"):
        run_demo(blocker / "out", chains=2, draws=10, warmup=10, echo=lambda _: None)


def test_a_failed_write_leaves_the_previous_run_whole(tmp_path, monkeypatch):
    """run.nc is written to a temporary name and renamed: when writing fails midway (a
    kill, a full disk), the previous run.nc still opens, and no temporary file is left."""
    import xarray

    run_demo(tmp_path, chains=2, draws=20, warmup=20, seed=1, echo=lambda _: None)
    before = xarray.open_datatree(tmp_path / "run.nc", engine="h5netcdf")["posterior"]["mu"].values

    def broken_write(self, path, **kwargs):
        with open(path, "wb") as partial:
            partial.write(b"\x89HDF half a file")
        raise OSError("disk full")

    monkeypatch.setattr(xarray.DataTree, "to_netcdf", broken_write)
    with pytest.raises(OSError, match="disk full"):
        run_demo(tmp_path, chains=2, draws=20, warmup=20, seed=2, echo=lambda _: None)
    after = xarray.open_datatree(tmp_path / "run.nc", engine="h5netcdf")["posterior"]["mu"].values
    np.testing.assert_array_equal(after, before)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "energy.png",
        "rank.png",
        "run.nc",
        "trace.png",
    ]


# ---------------------------------------------------------------------- the model
def reference_log_prob(q: torch.Tensor) -> torch.Tensor:
    """Eight schools, non-centred, written with torch.distributions (one position)."""
    D = torch.distributions
    y = torch.tensor(EIGHT_SCHOOLS_Y, dtype=q.dtype)
    sigma = torch.tensor(EIGHT_SCHOOLS_SIGMA, dtype=q.dtype)
    zero, one, five = (torch.tensor(v, dtype=q.dtype) for v in (0.0, 1.0, 5.0))
    mu, log_tau, theta_trans = q[0], q[1], q[2:]
    tau = torch.exp(log_tau)
    return (
        D.Normal(zero, five).log_prob(mu)
        + D.HalfCauchy(five).log_prob(tau)
        + log_tau  # |d tau / d log_tau|
        + D.Normal(zero, one).log_prob(theta_trans).sum()
        + D.Normal(mu + tau * theta_trans, sigma).log_prob(y).sum()
    )


def test_eight_schools_log_density_matches_torch_distributions():
    model = get_model("eight_schools")
    assert model.dim == 10 and model is not get_model()
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(6, 10, generator=gen, dtype=torch.float64) * 2
    batch = model.log_prob(q)
    assert batch.shape == (6,)
    for row, value in zip(q, batch, strict=True):
        expected = reference_log_prob(row)
        torch.testing.assert_close(model.log_prob(row), expected, rtol=1e-13, atol=1e-12)
        torch.testing.assert_close(value, expected, rtol=1e-13, atol=1e-12)
    # gradients too
    U, grad = hmc.Potential(model.log_prob, batched=True).value_and_grad(q)
    U_ref, grad_ref = hmc.Potential(reference_log_prob).value_and_grad(q)
    torch.testing.assert_close(U, U_ref, rtol=1e-13, atol=1e-12)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-12, atol=1e-12)
    # the constrained view
    draws = q.numpy().reshape(2, 3, 10)
    named = model.constrain(draws)
    np.testing.assert_allclose(named["tau"], np.exp(draws[..., 1]))
    np.testing.assert_allclose(
        named["theta"], draws[..., :1] + np.exp(draws[..., 1:2]) * draws[..., 2:]
    )


def test_unknown_model():
    assert "eight_schools" in MODELS
    with pytest.raises(ValueError, match="eight_schools"):
        get_model("nine_schools")


# posteriordb reference (eight_schools-eight_schools_noncentered, 10 x 1000 Stan draws)
REFERENCE = {"mu": (4.4105, 3.3091), "tau": (3.6021, 3.1983), "theta[1]": (6.1505, 5.6156)}


@pytest.mark.slow
def test_demo_model_matches_the_posteriordb_reference():
    model = get_model()
    dt = hmc.sample(
        model.log_prob, dim=10, chains=4, warmup=300, draws=500, kernel=hmc.HMC(), seed=5,
        batched=True, progress=False,
    )  # fmt: skip
    named = model.constrain(dt["posterior"]["x"].values)
    values = np.stack(
        [named["mu"], named["tau"], named["theta"][..., 0]], axis=-1
    )  # (chain, draw, 3)
    truth = np.array([mean for mean, _ in REFERENCE.values()])
    z, estimate, _ess = mcse_z_scores(values, truth)
    # the reference means have their own error (sd / sqrt(10000)); add it in quadrature
    sd = np.array([s for _, s in REFERENCE.values()])
    mcse = np.abs(estimate - truth) / np.abs(z)
    z_total = (estimate - truth) / np.sqrt(mcse**2 + sd**2 / 10_000)
    assert (np.abs(z_total) < z_bound(3)).all(), (estimate, z_total)
    np.testing.assert_allclose(values.std(axis=(0, 1)), sd, rtol=0.15)


# ---------------------------------------------------------------------- the sample command
def test_sample_command_runs_a_built_in_posterior(tmp_path, capsys):
    out = tmp_path / "run.nc"
    assert main(
        ["sample", "blr", "--chains", "2", "--warmup", "100", "--draws", "50", "--seed", "2",
         "--out", str(out), "--no-progress"]
    ) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "beta[0]" in printed and "sigma" in printed and "ess_bulk" in printed
    import xarray

    dt = xarray.open_datatree(out, engine="h5netcdf")
    assert dt["posterior"]["beta"].shape == (2, 50, 5)


def test_sample_command_reports_the_run_in_a_log(tmp_path, capsys):
    """With its output captured (a log, not a terminal), ``sample`` says what it samples,
    then writes plain progress lines to standard error (here at every iteration end), then
    says what the run did: a long run never looks hung."""
    out = tmp_path / "run.nc"
    assert main(
        ["sample", "blr", "--chains", "2", "--warmup", "20", "--draws", "20", "--seed", "2",
         "--out", str(out), "--progress-every", "0"]
    ) == 0  # fmt: skip
    captured = capsys.readouterr()
    printed = captured.out.splitlines()
    assert re.fullmatch(
        r"hmc \S+: sblrc-blr \(posteriordb posterior, 6 unconstrained dimensions\); 2 chains, "
        r"20 warmup and 20 draws each, kernel nuts, seed 2",
        printed[0],
    ), printed[0]
    assert re.fullmatch(
        r"sampled in [0-9.]+ s \(NUTS, \d+ gradient evaluations, \d+ divergent transitions\)",
        printed[1],
    ), printed[1]
    progress = [
        line
        for line in captured.err.splitlines()
        if re.fullmatch(
            r"(warmup|sampling): \d+/80 iterations \(\d+%\), \d+ divergent, [0-9.]+ s", line
        )
    ]
    assert len(progress) > 2, captured.err
    assert progress[0].startswith("warmup: ") and progress[-1].startswith(
        "sampling: 80/80 iterations (100%)"
    ), progress


def test_sample_command_writes_a_progress_line_at_most_every_interval(tmp_path, capsys):
    """An interval longer than the run: no line but the one at its end."""
    out = tmp_path / "run.nc"
    assert main(
        ["sample", "blr", "--chains", "2", "--warmup", "20", "--draws", "20", "--out", str(out),
         "--progress-every", "3600"]
    ) == 0  # fmt: skip
    lines = [line for line in capsys.readouterr().err.splitlines() if " iterations (" in line]
    assert len(lines) == 1 and lines[0].startswith("sampling: 80/80 iterations (100%)"), lines


def test_sample_command_runs_a_model_file(tmp_path, capsys):
    source = tmp_path / "model.py"
    source.write_text("dim = 3\n\ndef model(q):\n    return -0.5 * (q**2).sum()\n")
    out = tmp_path / "run.nc"
    assert main(["sample", str(source), "--chains", "2", "--warmup", "50", "--draws", "20",
                 "--out", str(out), "--no-progress"]) == 0  # fmt: skip
    assert "x[2]" in capsys.readouterr().out and out.exists()


@pytest.mark.parametrize(
    ("model", "message"),
    [("nope", "unknown posterior 'nope'"), ("missing.py", "no such model file")],
)
def test_sample_command_names_an_unknown_model(model, message, tmp_path):
    with pytest.raises(SystemExit, match=message):
        main(["sample", model, "--out", str(tmp_path / "run.nc")])


def test_a_model_the_package_refuses_is_one_line_on_stderr_not_a_traceback(tmp_path, capsys):
    source = tmp_path / "model.py"
    source.write_text(
        'import hmc\nmodel = hmc.Model(lambda p: -p["chain"] ** 2, {"chain": hmc.Param()})\n'
    )
    status = main(["sample", str(source), "--warmup", "5", "--draws", "5", "--no-progress",
                   "--out", str(tmp_path / "run.nc")])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith("hmc sample: error: posterior variable(s) ['chain'] would vanish")
    assert "Traceback" not in err and err.count("\n") == 1


def test_model_names_work_as_in_the_command_line():
    assert hmc.models.resolve("eight_schools") == "eight_schools-eight_schools_noncentered"
    assert hmc.models.resolve("blr") == "sblrc-blr"
    assert hmc.models.load("eight_schools").dim == 10
    with pytest.raises(KeyError, match="unknown posterior"):
        hmc.models.resolve("eight_schools_noncentered-x")


def test_help_shows_real_defaults_and_whole_model_names(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = capsys.readouterr().out
    assert "default: None" not in text and "(default: nuts)" in text
    assert "eight_schools-eight_schools_noncentered" in text  # not broken at a hyphen


def test_the_installed_script_names_itself_hmc(monkeypatch):
    from hmc.__main__ import build_parser

    monkeypatch.setattr(sys, "argv", ["/venv/bin/hmc", "--help"])
    assert build_parser().prog == "hmc"
    monkeypatch.setattr(sys, "argv", ["/src/hmc/__main__.py", "--help"])
    assert build_parser().prog == "python -m hmc"


def test_demo_figures_name_every_panel_and_number_chains_by_integers(tmp_path):
    import matplotlib.pyplot as plt

    from hmc.demo_plots import energy_figure, rank_figure, trace_figure

    dt = run_demo(tmp_path, chains=2, draws=40, warmup=40, seed=1, echo=lambda _: None)
    names = ["mu", "tau", "theta"]
    schools = [f"theta[{school}]" for school in dt["posterior"]["theta"].coords["school"].values]
    trace = trace_figure(dt["posterior"], names)
    titles = [ax.get_title(loc="left") for ax in trace.axes]
    assert titles[::2] == ["mu", "tau", *schools]  # one row per school
    assert all(ax.get_xlabel() for ax in trace.axes[-2:])
    rank = rank_figure(dt["posterior"], names)
    assert [ax.get_title() for ax in rank.axes if ax.get_visible()] == ["mu", "tau", *schools]
    assert not any("p=" in text.get_text() for ax in rank.axes for text in ax.texts)
    energy = energy_figure(dt)
    assert list(energy.axes[1].get_yticks()) == [0, 1]
    assert all(ax.get_xlabel() and ax.get_ylabel() for ax in energy.axes)
    plt.close("all")
