"""The demo behind ``python -m hmc demo``: sample a model, print its ArviZ summary, save
plots and the run.

The model is chosen by name through :func:`get_model`, which returns a :class:`DemoModel`:
a flat log density over an unconstrained vector plus what is needed to report its draws
under their own names (``constrain``, ``dims``, ``coords``). Adding a model (for example a
built-in posteriordb posterior behind a ``--model NAME`` option) means writing one function
that returns a ``DemoModel`` and registering it in :data:`MODELS`; :func:`run_demo` and the
command line need no other change.

The default model is the non-centred eight schools (Rubin 1981; Gelman et al., BDA3 5.5):

    mu ~ N(0, 5),  tau ~ half-Cauchy(0, 5),  theta_trans_j ~ N(0, 1),
    y_j ~ N(mu + tau * theta_trans_j, sigma_j),  j = 1..8,

sampled on ``q = [mu, log_tau, theta_trans_1..8]`` (tau on the log scale, so the density
gains the log-Jacobian ``+log_tau``).
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hmc.atomic import write_atomically
from hmc.demo_plots import energy_figure, rank_figure, trace_figure
from hmc.progress import DisplayFactory, end_line, print_now, start_line

__all__ = ["MODELS", "DemoModel", "eight_schools", "get_model", "run_demo"]


@dataclass(frozen=True)
class DemoModel:
    """A model the demo can run.

    Attributes
    ----------
    name : str
        The name it is registered under.
    dim : int
        Length D of the unconstrained vector.
    log_prob : callable
        Log density (Jacobian included) of ``q`` shaped ``(..., D)``, returning ``(...)``: it
        works on one position ``(D,)`` and on a batch ``(C, D)``, so the demo samples it
        with ``batched=True``.
    constrain : callable
        Unconstrained draws ``(chain, draw, D)`` (numpy) to named arrays
        ``(chain, draw, *shape)`` on the constrained scale.
    dims, coords : ArviZ ``dims`` and ``coords`` for the named arrays.
    description : str
        A few words for the printed header (its dimension is added).
    plot_vars : names of the variables to plot (None: all of them).
    """

    name: str
    dim: int
    log_prob: Callable[[torch.Tensor], torch.Tensor]
    constrain: Callable[[np.ndarray], dict[str, np.ndarray]]
    dims: dict[str, list[str]] = field(default_factory=dict)
    coords: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    plot_vars: tuple[str, ...] | None = None


# ---------------------------------------------------------------------- eight schools
EIGHT_SCHOOLS_Y = (28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0)
EIGHT_SCHOOLS_SIGMA = (15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0)
SCHOOLS = ("Choate", "Deerfield", "Phillips Andover", "Phillips Exeter", "Hotchkiss",
           "Lawrenceville", "St. Paul's", "Mt. Hermon")  # fmt: skip

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def eight_schools() -> DemoModel:
    """The non-centred eight schools model on ``[mu, log_tau, theta_trans(8)]``."""
    y = torch.tensor(EIGHT_SCHOOLS_Y, dtype=torch.float64)
    sigma = torch.tensor(EIGHT_SCHOOLS_SIGMA, dtype=torch.float64)
    inv_sigma = 1.0 / sigma
    # the normalising constants of N(mu | 0, 5), half-Cauchy(tau | 0, 5), the 8 N(0, 1) and
    # the 8 N(y_j | theta_j, sigma_j), summed once
    constant = (
        -math.log(5.0) + math.log(2.0 / (math.pi * 5.0)) - 17 * _LOG_SQRT_2PI
        - float(torch.log(sigma).sum())
    )  # fmt: skip

    def log_prob(q: torch.Tensor) -> torch.Tensor:
        mu, log_tau, theta_trans = q[..., 0], q[..., 1], q[..., 2:]
        tau = torch.exp(log_tau)
        theta = torch.addcmul(mu.unsqueeze(-1), tau.unsqueeze(-1), theta_trans)
        z = (y.to(q) - theta) * inv_sigma.to(q)
        squares = (0.2 * mu).square() + theta_trans.square().sum(-1) + z.square().sum(-1)
        return constant + log_tau - torch.log1p((0.2 * tau).square()) - 0.5 * squares

    def constrain(draws: np.ndarray) -> dict[str, np.ndarray]:
        mu, tau = draws[..., 0], np.exp(draws[..., 1])
        theta_trans = draws[..., 2:]
        return {
            "mu": mu,
            "tau": tau,
            "theta": mu[..., None] + tau[..., None] * theta_trans,
            "theta_trans": theta_trans,
        }

    return DemoModel(
        name="eight_schools",
        dim=10,
        log_prob=log_prob,
        constrain=constrain,
        dims={"theta": ["school"], "theta_trans": ["school"]},
        coords={"school": list(SCHOOLS)},
        description="non-centred eight schools, tau on the log scale",
        plot_vars=("mu", "tau", "theta"),
    )


#: name -> function returning the model; the demo's ``model`` argument picks from these.
MODELS: dict[str, Callable[[], DemoModel]] = {"eight_schools": eight_schools}
DEFAULT_MODEL = "eight_schools"


def get_model(name: str = DEFAULT_MODEL) -> DemoModel:
    """The demo model registered under ``name`` (see :data:`MODELS`)."""
    try:
        factory = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known models: {sorted(MODELS)}") from None
    return factory()


# ---------------------------------------------------------------------- the run
def named_posterior(dt, model: DemoModel) -> None:
    """Replace ``dt``'s flat posterior ``x`` by the model's named, constrained variables
    (attributes kept)."""
    import arviz_base
    import xarray

    posterior = dt["posterior"]
    draws = posterior["x"].values
    named = arviz_base.dict_to_dataset(
        model.constrain(draws),
        dims=model.dims or None,
        coords=model.coords or None,
    )
    named.attrs = dict(posterior.attrs)
    dt["posterior"] = xarray.DataTree(named)


def run_demo(
    out: str | os.PathLike = "out",
    *,
    model: str = DEFAULT_MODEL,
    chains: int = 4,
    warmup: int = 1000,
    draws: int = 1000,
    seed: int = 0,
    kernel: str = "nuts",
    progress: bool | DisplayFactory | None = None,
    echo: Callable[[str], Any] = print_now,
):
    """Sample ``model``, print its summary and write ``run.nc`` (first), ``trace.png``,
    ``rank.png`` and ``energy.png`` to ``out``. Returns the ``DataTree``.

    ``out`` is checked to be a writable folder before sampling starts. Every file is
    written to a temporary name and then renamed, so a run killed while writing leaves
    the previous file whole. ``progress`` is :func:`hmc.sample`'s. ``echo`` prints the
    lines before and after the run and the summary (flushed at once, so that a log shows
    them as they come).
    """
    import matplotlib

    matplotlib.use("Agg")
    import arviz as az
    import matplotlib.pyplot as plt

    import hmc

    _check_writable(out)
    options: dict[str, Any] = {}
    if model in MODELS:
        spec = get_model(model)
        target, description, plot_vars = spec.log_prob, spec.description, spec.plot_vars
        options.update(dim=spec.dim, batched=True)
        dim = spec.dim
    elif model in hmc.models.names():
        spec, target, plot_vars = None, hmc.models.load(model), None
        description, dim = "posteriordb posterior", target.dim
    else:
        known = sorted(MODELS) + hmc.models.names()
        raise ValueError(f"unknown model {model!r}; known models: {known}")
    echo(start_line(model, description, dim, chains, warmup, draws, kernel, seed))
    started = time.perf_counter()
    dt = hmc.sample(
        target,
        chains=chains,
        warmup=warmup,
        draws=draws,
        seed=seed,
        kernel=kernel,
        progress=progress,
        **options,
    )
    elapsed = time.perf_counter() - started
    if spec is not None:
        named_posterior(dt, spec)
    dt.attrs["model"] = model
    echo(end_line(dt, elapsed))
    # the run's data first: a failure in a plot cannot lose it
    write_atomically(
        os.path.join(out, "run.nc"), lambda path: dt.to_netcdf(path, engine="h5netcdf")
    )
    echo(az.summary(dt).to_string())
    names = list(plot_vars) if plot_vars else None
    figures = {
        "trace.png": trace_figure(dt["posterior"], names),
        "rank.png": rank_figure(dt["posterior"], names),
        "energy.png": energy_figure(dt),
    }
    for filename, figure in figures.items():
        write_atomically(
            os.path.join(out, filename),
            lambda path, f=figure: f.savefig(path, dpi=80, format="png"),
        )
    plt.close("all")
    echo(f"wrote {', '.join(os.path.join(out, f) for f in ('run.nc', *figures))}")
    return dt


def _check_writable(out: str | os.PathLike) -> None:
    """Make the folder ``out`` and check that files can be created in it, before any
    sampling; raise naming it otherwise."""
    try:
        os.makedirs(out, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".hmc-check-"):
            pass
    except OSError as error:
        raise ValueError(f"out={str(out)!r} is not a writable folder: {error}") from None
