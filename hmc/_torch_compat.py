"""Every use of torch's private API in hmc, in one place.

torch offers no public way to do a few things the package needs: read the default of
``torch.distributions`` argument validation, turn it off on one distribution, recognise a
few constraints by their class, and tell a transform's cached inverse from its other
attributes. Each is done here, with what it relies on; the rest of the package imports
these names and touches no private torch attribute itself.

On a torch upgrade, check each item below against the new torch source
(``torch/distributions/distribution.py``, ``constraints.py`` and ``transforms.py``), then
run ``tests/test_potential.py``, ``tests/test_model.py`` and ``tests/test_transforms.py``,
which exercise all of them. A renamed class fails loudly (an ``AttributeError`` on
import); a renamed attribute or a changed meaning may not, hence the list.
"""

from __future__ import annotations

import torch
from torch.distributions import Distribution, constraints
from torch.distributions.constraints import Constraint

__all__ = [
    "distribution_validation_off",
    "is_cached_inverse",
    "is_lower_cholesky",
    "is_positive_definite",
    "is_real",
    "turn_off_validation",
    "validation_enabled",
]


# ============================================================ argument validation
def validation_enabled() -> bool:
    """Whether ``torch.distributions`` validates arguments by default.

    Relies on the class attribute ``Distribution._validate_args``, which
    ``Distribution.set_default_validate_args`` writes and ``Distribution.__init__`` reads
    when no ``validate_args`` is given: torch has that setter but no getter. One
    attribute read, cheap enough for the energy module to call once per evaluation.

    On a torch upgrade: check that ``set_default_validate_args`` still stores its value in
    ``Distribution._validate_args`` (or use a public getter if one has appeared).
    """
    return Distribution._validate_args


class distribution_validation_off:  # used like a function: ``with ...():``
    """Turn off ``torch.distributions`` argument checks for a block (they fail badly under
    vmap), and back on after it.

    Setting a class attribute invalidates the attribute caches of every subclass (about
    ten microseconds for ``Distribution``'s), so when the checks are already off nothing
    is set. The sampler turns them off once around a whole run, and the energy module
    enters this guard only when it finds them on: inside a run an evaluation reads the
    flag and nothing more.

    Relies on :func:`validation_enabled` (the private class attribute
    ``Distribution._validate_args``); turning the checks off and on again uses the public
    ``Distribution.set_default_validate_args``.
    """

    def __enter__(self) -> None:
        self.was_on = Distribution._validate_args
        if self.was_on:
            Distribution.set_default_validate_args(False)

    def __exit__(self, *exc_info: object) -> None:
        if self.was_on:
            Distribution.set_default_validate_args(True)


def turn_off_validation(distribution: Distribution) -> None:
    """Turn off argument validation on one distribution, whatever the default.

    Relies on the instance attribute ``_validate_args``, which ``Distribution.__init__``
    sets (from its ``validate_args`` argument or the default) and which ``log_prob``,
    ``sample`` and the other methods read. It is written into the instance's ``__dict__``
    directly, as the copies made by ``hmc.parameters.cast_to`` are filled in.

    On a torch upgrade: check that ``Distribution`` methods still decide whether to
    validate by reading ``self._validate_args``.
    """
    vars(distribution)["_validate_args"] = False


# ============================================================ constraints
# torch exports its constraints as instances (``constraints.real``,
# ``constraints.lower_cholesky``, ...); their classes are private. They are named here, so
# that a renamed class fails on import rather than going unrecognised.
_Independent = constraints._IndependentConstraint
_Real = constraints._Real
_LowerCholesky = constraints._LowerCholesky
_PositiveDefinite = constraints._PositiveDefinite
_PositiveSemidefinite = constraints._PositiveSemidefinite


def is_real(constraint: Constraint) -> bool:
    """Whether ``constraint`` is ``constraints.real``, possibly made independent over some
    dimensions (``constraints.real_vector``, ``constraints.independent(real, n)``): a
    support whose bijection is the identity.

    Relies on the private classes ``constraints._IndependentConstraint`` (and its
    ``base_constraint`` attribute) and ``constraints._Real``; the class is compared exactly,
    so subclasses of ``_Real`` with a narrower support would not count.

    On a torch upgrade: check that ``constraints.real`` and ``constraints.real_vector`` are
    still instances of these two classes, and that no other constraint is an instance of
    ``_Real`` itself.
    """
    while isinstance(constraint, _Independent):
        constraint = constraint.base_constraint
    return type(constraint) is _Real


def is_lower_cholesky(constraint: Constraint) -> bool:
    """Whether ``constraint`` is ``constraints.lower_cholesky`` (lower-triangular matrices
    with a positive diagonal).

    Relies on the private class ``constraints._LowerCholesky``. On a torch upgrade: check
    that ``constraints.lower_cholesky`` is still an instance of it, and that
    ``constraints.corr_cholesky`` is not (it has its own bijection in ``biject_to``).
    """
    return isinstance(constraint, _LowerCholesky)


def is_positive_definite(constraint: Constraint) -> bool:
    """Whether ``constraint`` is ``constraints.positive_definite`` or
    ``constraints.positive_semidefinite`` (the package maps onto the interior of the
    latter).

    Relies on the private classes ``constraints._PositiveDefinite`` and
    ``constraints._PositiveSemidefinite``. On a torch upgrade: check that the two
    constraints are still instances of them.
    """
    return isinstance(constraint, _PositiveDefinite | _PositiveSemidefinite)


# ============================================================ transforms
_InverseTransform = torch.distributions.transforms._InverseTransform


def is_cached_inverse(obj: object, key: str) -> bool:
    """Whether the attribute ``key`` of ``obj`` (a distribution, transform or constraint)
    is a transform's cache of its own inverse, which a copy must not share:
    ``hmc.parameters.cast_to`` sets it to ``None`` on the copies it makes, so that a copy
    in another dtype or on another device makes its own inverse.

    Relies on two private details of ``torch/distributions/transforms.py``: a
    ``Transform`` keeps the inverse that its ``inv`` property makes on first use in the
    instance attribute ``_inv``; and ``_InverseTransform`` (what ``t.inv`` is) keeps in
    that same attribute the transform it inverts, which is no cache: without it the
    inverse cannot be evaluated, so on those it is copied like any other attribute.

    On a torch upgrade: check the name of the attribute in ``Transform.__init__`` and
    ``Transform.inv``, and that ``_InverseTransform`` still stores its transform there.
    """
    return key == "_inv" and not isinstance(obj, _InverseTransform)
