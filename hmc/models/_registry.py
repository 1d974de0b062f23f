"""The table of built-in posteriors: posteriordb name -> model builder and the variables
posteriordb reports."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from hmc.parameters import Model

__all__ = ["REGISTRY", "Posterior", "posterior"]


class Posterior(NamedTuple):
    """A built-in posterior.

    ``reported``: the posterior variables behind posteriordb's reference parameter names,
    in posteriordb's order (``theta`` stands for ``theta[1]``, ``theta[2]``, ...).
    """

    name: str
    build: Callable[[], Model]
    reported: tuple[str, ...]


REGISTRY: dict[str, Posterior] = {}


def posterior(name: str, reported: tuple[str, ...]) -> Callable:
    """Register a model builder under the posteriordb posterior ``name``."""

    def register(build: Callable[[], Model]) -> Callable[[], Model]:
        if name in REGISTRY:
            raise ValueError(f"posterior {name!r} is registered twice")
        REGISTRY[name] = Posterior(name, build, reported)
        return build

    return register
