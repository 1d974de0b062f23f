"""Raw sampler arrays to an ArviZ ``xarray.DataTree``.

``arviz_base`` is imported on first use, so ``import hmc`` stays light.
"""

from __future__ import annotations

import importlib.metadata
import json
import warnings
from typing import Any

import numpy as np
import torch

from hmc.metric import LowRankMetric, inverse_diagonal

__all__ = ["adaptation_group", "run_attrs", "to_datatree"]


def to_datatree(
    posterior: dict[str, np.ndarray],
    sample_stats: dict[str, np.ndarray],
    *,
    warmup_posterior: dict[str, np.ndarray] | None = None,
    warmup_sample_stats: dict[str, np.ndarray] | None = None,
    extra_groups: dict[str, dict[str, np.ndarray]] | None = None,
    dims: dict[str, list[str]] | None = None,
    coords: dict[str, Any] | None = None,
    attrs: dict[str, Any] | None = None,
):
    """Build the DataTree of a run.

    Every array in ``posterior`` and ``sample_stats`` is ``(chain, draw, ...)``. ``attrs``
    go on the root and on the posterior and sample_stats groups; values that netCDF cannot
    store (dicts, booleans, None) are written as JSON strings or integers.
    """
    import arviz_base

    groups: dict[str, dict[str, np.ndarray]] = {
        "posterior": posterior,
        "sample_stats": sample_stats,
    }
    save_warmup = warmup_posterior is not None
    if save_warmup:
        groups["warmup_posterior"] = warmup_posterior
        groups["warmup_sample_stats"] = warmup_sample_stats or {}
    groups.update(extra_groups or {})
    clean = {key: netcdf_value(value) for key, value in (attrs or {}).items()}
    group_attrs = {name: clean for name in groups if name in ("posterior", "sample_stats")}
    with warnings.catch_warnings():  # many short chains are a recipe here, not a mistake
        warnings.filterwarnings("ignore", "Found chain dimension to be longer than draw")
        return arviz_base.from_dict(
            groups,
            dims=dims or None,
            coords=coords or None,
            save_warmup=save_warmup,
            attrs={"/": clean, **group_attrs},
        )


def check_output(target: Any, draws: np.ndarray) -> None:
    """Build a run's output groups from ``draws`` ``(C, 1, D)`` (the initial points) as the
    end of the run will, so that what would fail there fails before any work: ``derived``
    or ``log_likelihood`` raising or returning something else than a dict of tensors, a
    derived quantity named like a parameter, ``coords`` or ``dims`` that do not fit, a
    name ArviZ cannot store. Raises ValueError naming a posterior variable that the
    DataTree would lose: one named like a dimension (``chain``, ``draw``, another
    variable's ``<name>_dim_<k>``, or a label used in ``dims``)."""
    posterior = target.posterior(draws)
    dims, coords = target.dims_and_coords()
    tree = to_datatree(
        posterior, {}, extra_groups=target.extra_groups(draws), dims=dims, coords=coords
    )
    lost = [name for name in posterior if name not in tree["posterior"].data_vars]
    if lost:
        raise ValueError(
            f"posterior variable(s) {lost} would vanish from the DataTree: a variable may "
            "not be named like a dimension ('chain', 'draw', another variable's "
            "'<name>_dim_<k>', or a label used in dims); rename them"
        )


def netcdf_value(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if value is None or isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, str):
        return str(value)  # str subclasses (torch's version string) trip h5py
    if isinstance(value, np.ndarray):
        return value.ravel().tolist() if value.ndim else value.item()
    return value


def run_attrs(
    *,
    seed: int,
    kernel: Any,
    metric: str,
    warmup: int,
    n_gradient_evaluations: int,
    sampling_time: float,
    warmup_time: float,
    total_time: float,
    chain_utilization: float,
    device: torch.device,
    engine: str,
    compiled: bool,
    compile_time: float,
    compile_note: str | None,
    compile_decision: str | None = None,
    threads: str = "",
    interrupted: bool = False,
    adapt: str = "stan",
    restarted_chains: np.ndarray | None = None,
) -> dict[str, Any]:
    """The attrs of a run's DataTree (ArviZ's names where ArviZ has one): ``tuning_steps``
    counts the warmup iterations each chain ran, ``adapt`` names the warmup and
    ``restarted_chains`` lists the chains it restarted from another."""
    return {
        "inference_library": "hmc",
        "inference_library_version": _version(),
        "sampling_time": sampling_time,
        "warmup_time": warmup_time,
        "total_time": total_time,
        "tuning_steps": warmup,
        "n_gradient_evaluations": n_gradient_evaluations,
        "seed": seed,
        "kernel": type(kernel).__name__,
        "kernel_settings": str(kernel),
        "metric": metric,
        "chain_utilization": chain_utilization,
        "torch_version": str(torch.__version__),
        "device": str(device),
        "engine": engine,
        "compiled": compiled,
        "compile_time": compile_time,
        "compile_note": compile_note or "",
        "compile_decision": compile_decision or "",
        "threads": threads,
        "interrupted": interrupted,
        "adapt": adapt,
        "restarted_chains": np.zeros(0, dtype=np.int64)
        if restarted_chains is None
        else restarted_chains,
    }


def adaptation_group(params: Any):
    """The ``adaptation`` group: each chain's adapted step size ``(chain,)``, inverse
    metric ``(chain, unconstrained)`` or ``(chain, unconstrained, unconstrained_column)``
    (the sampler's flat unconstrained coordinates, numbered), for the low-rank metric
    (:class:`hmc.metric.LowRankMetric`) the diagonal of its matrix as ``inverse_metric``
    with its fields ``metric_scale`` ``(chain, unconstrained)``, ``metric_eigenvectors``
    ``(chain, unconstrained, metric_rank)`` and ``metric_eigenvalues`` ``(chain,
    metric_rank)``, and, for ChEES, trajectory length ``(chain,)``, from tensor
    ``params``."""
    import xarray

    metric = params.metric
    inverse = inverse_diagonal(metric) if isinstance(metric, LowRankMetric) else metric.inverse
    inverse = inverse.numpy(force=True)
    dims = ("chain", "unconstrained", "unconstrained_column")[: inverse.ndim]
    coords = {name: np.arange(size) for name, size in zip(dims, inverse.shape, strict=True)}
    variables = {
        "step_size": (("chain",), params.step_size.numpy(force=True)),
        "inverse_metric": (dims, inverse),
    }
    if isinstance(metric, LowRankMetric):
        scale, vectors, values = (x.numpy(force=True) for x in metric)
        coords["metric_rank"] = np.arange(values.shape[1])
        variables["metric_scale"] = (("chain", "unconstrained"), scale)
        variables["metric_eigenvectors"] = (("chain", "unconstrained", "metric_rank"), vectors)
        variables["metric_eigenvalues"] = (("chain", "metric_rank"), values)
    if params.trajectory_length is not None:
        variables["trajectory_length"] = (("chain",), params.trajectory_length.numpy(force=True))
    return xarray.DataTree(xarray.Dataset(variables, coords=coords))


def _version() -> str:
    try:
        return importlib.metadata.version("hmc")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        return "0.1.0"
