"""Raw sampler arrays to an ArviZ ``xarray.DataTree``.

``arviz_base`` is imported on first use, so ``import hmc`` stays light.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

__all__ = ["to_datatree"]


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
    clean = {key: _netcdf_value(value) for key, value in (attrs or {}).items()}
    group_attrs = {name: clean for name in groups if name in ("posterior", "sample_stats")}
    return arviz_base.from_dict(
        groups,
        dims=dims or None,
        coords=coords or None,
        save_warmup=save_warmup,
        attrs={"/": clean, **group_attrs},
    )


def _netcdf_value(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if value is None or isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, str):
        return str(value)  # str subclasses (torch's version string) trip h5py
    if isinstance(value, np.ndarray):
        return value.ravel().tolist() if value.ndim else value.item()
    return value
