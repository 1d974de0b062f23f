"""Built-in models: the 14 posteriors of posteriordb's validation set.

Each is a function returning an :class:`hmc.Model` built from data shipped with the
package (``hmc/models/data/``, BSD-3 licensed, from stan-dev/posteriordb; see
``data/README.md``). They are named after posteriordb's model names and listed under
posteriordb's posterior names:

>>> import hmc.models
>>> hmc.models.names()[:2]
['arK-arK', 'arma-arma11']
>>> model = hmc.models.load("eight_schools-eight_schools_noncentered")
>>> model.dim
10

:func:`reference_draws` maps a run to posteriordb's reported parameter names (1-based,
``theta[1]``; derived quantities such as the non-centred ``theta`` included) and
:func:`reference` gives the summary of posteriordb's reference draws, :func:`data` the
data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from hmc.models._data import read_json
from hmc.models._registry import REGISTRY
from hmc.models.gaussian_process import gp_pois_regr, gp_regr
from hmc.models.hierarchical import eight_schools_centered, eight_schools_noncentered
from hmc.models.mixtures import hmm_example, low_dim_gauss_mix
from hmc.models.regression import blr, diamonds, earn_height, kidscore_interaction, kilpisjarvi
from hmc.models.time_series import arK, arma11, garch11
from hmc.parameters import Model

__all__ = [
    "arK",
    "arma11",
    "blr",
    "data",
    "diamonds",
    "earn_height",
    "eight_schools_centered",
    "eight_schools_noncentered",
    "garch11",
    "gp_pois_regr",
    "gp_regr",
    "hmm_example",
    "kidscore_interaction",
    "kilpisjarvi",
    "load",
    "low_dim_gauss_mix",
    "names",
    "reference",
    "reference_draws",
    "reported_names",
    "resolve",
]


def names() -> list[str]:
    """posteriordb names of the built-in posteriors (``"<data>-<model>"``), sorted."""
    return sorted(REGISTRY)


#: short names the command line uses too: the demo's eight schools is the non-centred one
ALIASES = {"eight_schools": "eight_schools-eight_schools_noncentered"}


def resolve(name: str) -> str:
    """The posteriordb name of ``name``: a posteriordb name (``"sblrc-blr"``), a model
    name that only one posterior uses (``"blr"``, ``"eight_schools_centered"``), or an
    alias (:data:`ALIASES`)."""
    if name in REGISTRY:
        return name
    if name in ALIASES:
        return ALIASES[name]
    matches = [posterior for posterior in REGISTRY if posterior.split("-", 1)[1] == name]
    if len(matches) == 1:
        return matches[0]
    raise KeyError(f"unknown posterior {name!r}; the built-in ones are {names()}")


def _entry(name: str):
    return REGISTRY[resolve(name)]


def load(name: str) -> Model:
    """The model of the posteriordb posterior ``name`` (e.g. ``"sblrc-blr"``, or a name
    :func:`resolve` knows: ``"blr"``, ``"eight_schools"``)."""
    return _entry(name).build()


def data(name: str) -> dict[str, Any]:
    """The data of the posteriordb posterior ``name`` as posteriordb stores it
    (``data.json``: numbers and lists; matrices as lists of rows)."""
    name = resolve(name)
    return read_json(name, "data.json")


def reference(name: str) -> dict[str, Any]:
    """The summary of posteriordb's reference draws for ``name`` (``reference.json``):
    ``parameter_names`` and per name ``stats`` (mean, sd, q05, q50, q95, ess_bulk,
    ess_tail, rhat, mcse_mean), with how the draws were made."""
    name = resolve(name)
    return read_json(name, "reference.json")


def reported_names(name: str, shapes: Mapping[str, tuple[int, ...]]) -> list[str]:
    """posteriordb's flat names (``theta[1]``, ...; ``m[i,j]`` row-major) of the reported
    variables of ``name``, given each variable's shape."""
    return [label for var in _entry(name).reported for label, _ in _flat(var, shapes[var])]


def _flat(var: str, shape: tuple[int, ...]):
    for index in np.ndindex(*shape):
        label = f"{var}[{','.join(str(i + 1) for i in index)}]" if shape else var
        yield label, index


def reference_draws(name: str, draws: Any) -> dict[str, np.ndarray]:
    """A run's draws under posteriordb's parameter names: ``name -> (chain, draw)``.

    Parameters
    ----------
    name : a posterior name from :func:`names`
    draws : the ``DataTree`` returned by :func:`hmc.sample`, its ``posterior`` group, or a
        dict ``variable -> (chain, draw, *shape)`` (as ``Model.posterior`` returns).
    """
    posterior = draws["posterior"] if _has_group(draws, "posterior") else draws
    out: dict[str, np.ndarray] = {}
    for var in _entry(name).reported:
        values = np.asarray(posterior[var])
        for label, index in _flat(var, values.shape[2:]):
            out[label] = values[(..., *index)]
    return out


def _has_group(draws: Any, group: str) -> bool:
    children = getattr(draws, "children", None)
    return children is not None and group in children
