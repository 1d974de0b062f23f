"""Named, constrained parameters <-> the flat unconstrained vector the sampler works on.

A :class:`Model` is a log density over named parameters, each with a shape and a support
(a ``torch.distributions.constraints`` object). The sampler sees a :class:`hmc.target.Target`:
one flat vector ``q`` of ``D`` unconstrained reals. The model splits ``q`` into one slice
per parameter (in declaration order), maps each slice onto its support with a bijection
(:func:`param_transform`), adds the log-abs-det-Jacobians, and hands the user's function a
dict of constrained tensors. Draws come back on the constrained scale under the user's
names and shapes.

The bijections are torch's ``biject_to`` where it has one, plus four that torch lacks or
does not make bijective on a flat vector: :data:`ordered_vector` and
:data:`positive_ordered_vector` (Stan's ``ordered``/``positive_ordered``), and
``lower_cholesky``/``positive_definite`` parameterised by their lower triangle (torch's
``LowerCholeskyTransform`` ignores the upper triangle of a full matrix, so it is not a
bijection of ``R^(n x n)``).

Everything on the sampler's path works for one position ``(D,)`` under ``torch.func.vmap``
(no ``.item()``, no data-dependent Python branches, no in-place writes), in the dtype and
on the device of ``q``. Distributions given as parameters (and torch transforms with tensor
parameters) are copied once per dtype and device (:func:`cast_to`), so a float32 prior
does not turn a float64 run into a mixed-precision one.

Choices worth knowing:

- Parameter names are checked by reading: the user's function gets a dict that records
  which names it reads. Reading an undeclared name raises :class:`UndeclaredParameterError`
  (a ``KeyError``); a declared :class:`Param` that is never read (its density would be
  flat and improper) raises ``ValueError``. This runs once at construction at the
  unconstrained point 0, and on the first evaluation if that dry run failed for another
  reason (data on another device, say), then never again.
- The unconstrained draws (``unconstrained=True``) are named ``<name>_unconstrained``:
  ArviZ ``dims`` are per variable name, and a simplex or a Cholesky factor has a different
  shape on the two scales, so the two cannot share a name.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch.distributions import Distribution, Transform, biject_to, constraints
from torch.distributions.constraints import Constraint

from hmc._torch_compat import (
    distribution_validation_off,
    is_cached_inverse,
    is_lower_cholesky,
    is_positive_definite,
    is_real,
    turn_off_validation,
)

__all__ = [
    "Model",
    "Param",
    "ParamTransform",
    "UndeclaredParameterError",
    "cast_to",
    "ordered_vector",
    "param_transform",
    "positive_ordered_vector",
]

Values = Mapping[str, torch.Tensor]
_CHUNK = 1024  # draws per vmap call when evaluating derived quantities and log-likelihoods


def check_name(name: Any, what: str) -> None:
    """Raise naming ``what`` unless ``name`` can name a variable of the DataTree: a
    non-empty string, not ``.`` or ``..`` and without ``/`` (DataTree's paths)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"{what} names must be non-empty strings, got {name!r}")
    if name in (".", "..") or "/" in name:
        raise ValueError(
            f"{what} name {name!r} cannot name a DataTree variable ('.', '..' and names "
            "with '/' are paths): use another name"
        )


# ====================================================================== constraints
class _OrderedVector(Constraint):
    """Vectors whose entries strictly increase along the last axis (Stan's ``ordered``)."""

    event_dim = 1

    def check(self, value: torch.Tensor) -> torch.Tensor:
        increasing = (value[..., 1:] > value[..., :-1]).all(-1)
        return increasing & torch.isfinite(value).all(-1)


class _PositiveOrderedVector(_OrderedVector):
    """Increasing vectors with a positive first entry (Stan's ``positive_ordered``)."""

    def check(self, value: torch.Tensor) -> torch.Tensor:
        return super().check(value) & (value[..., :1] > 0).all(-1)


ordered_vector = _OrderedVector()
positive_ordered_vector = _PositiveOrderedVector()


# ====================================================================== transforms
class ParamTransform:
    """A bijection between ``size`` unconstrained reals and a tensor of ``shape`` in a
    support.

    ``forward(u)``: ``u`` ``(*batch, size)`` -> ``x`` ``(*batch, *shape)`` and the log
    absolute determinant of the Jacobian of ``u -> free coordinates of x``, ``(*batch,)``.
    ``inverse(x)``: ``(*batch, *shape)`` -> ``(*batch, size)``.
    ``has_jacobian`` is False when the log-determinant is identically zero.
    """

    has_jacobian = True

    def __init__(self, shape: tuple[int, ...], unconstrained_shape: tuple[int, ...]) -> None:
        self.shape = tuple(shape)
        self.unconstrained_shape = tuple(unconstrained_shape)
        self.size = math.prod(self.unconstrained_shape)

    def forward(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def inverse(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _unflatten(self, u: torch.Tensor) -> tuple[torch.Size, torch.Tensor]:
        batch = u.shape[:-1]
        return batch, u.reshape((*batch, *self.unconstrained_shape))

    def _flatten(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Unconstrained values ``z`` of constrained ``x`` ``(*batch, *shape)`` as
        ``(*batch, size)``."""
        return z.reshape((*x.shape[: x.dim() - len(self.shape)], self.size))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={self.shape}, size={self.size})"


def _sum_to_batch(ladj: torch.Tensor, batch: torch.Size) -> torch.Tensor:
    return ladj.reshape(*batch, -1).sum(-1)


class _Identity(ParamTransform):
    has_jacobian = False

    def forward(self, u):
        batch, x = self._unflatten(u)
        return x, u.new_zeros(batch)

    def inverse(self, x):
        return self._flatten(x, x)


class _TorchBijection(ParamTransform):
    """``torch.distributions.biject_to(constraint)``, recast to the dtype of its input."""

    def __init__(self, transform: Transform, shape: tuple[int, ...]) -> None:
        unconstrained = tuple(transform.inverse_shape(torch.Size(shape)))
        if tuple(transform.forward_shape(torch.Size(unconstrained))) != tuple(shape):
            raise ValueError(f"{transform} does not map onto shape {shape}")
        super().__init__(shape, unconstrained)
        self.transform = transform
        self._cast: dict[tuple[torch.dtype, torch.device], Transform] = {}

    def _like(self, u: torch.Tensor) -> Transform:
        key = (u.dtype, u.device)
        if key not in self._cast:
            self._cast[key] = cast_to(self.transform, u.dtype, u.device)
        return self._cast[key]

    def forward(self, u):
        batch, z = self._unflatten(u)
        t = self._like(u)
        x = t(z)
        return x, _sum_to_batch(t.log_abs_det_jacobian(z, x), batch)

    def inverse(self, x):
        z = self._like(x).inv(x)
        return self._flatten(z, x)

    def __repr__(self) -> str:
        return f"_TorchBijection({self.transform}, shape={self.shape}, size={self.size})"


class _Ordered(ParamTransform):
    """``x = cumsum([u_1, exp(u_2), ..., exp(u_K)])`` (``positive``: ``cumsum(exp(u))``),
    Stan's ordered and positive_ordered transforms along the last axis."""

    def __init__(self, shape: tuple[int, ...], positive: bool) -> None:
        super().__init__(shape, shape)
        self.positive = positive

    def forward(self, u):
        batch, z = self._unflatten(u)
        if self.positive:
            return torch.cumsum(z.exp(), -1), _sum_to_batch(z, batch)
        steps = torch.cat((z[..., :1], z[..., 1:].exp()), -1)
        return torch.cumsum(steps, -1), _sum_to_batch(z[..., 1:], batch)

    def inverse(self, x):
        first = x[..., :1].log() if self.positive else x[..., :1]
        z = torch.cat((first, torch.log(x[..., 1:] - x[..., :-1])), -1)
        return self._flatten(z, x)


class _LowerCholesky(ParamTransform):
    """Lower-triangular matrices with a positive diagonal from their ``n (n + 1) / 2``
    lower-triangle entries (row-major), the diagonal through ``exp``."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        n = shape[-1]
        m = n * (n + 1) // 2
        super().__init__(shape, (*shape[:-2], m))
        self.n = n
        rows, cols = torch.tril_indices(n, n)
        gather = torch.full((n * n,), m, dtype=torch.int64)
        gather[rows * n + cols] = torch.arange(m)
        self._index = {"rows": rows, "cols": cols, "gather": gather, "diag": (rows == cols)}
        self._on: dict[torch.device, dict[str, torch.Tensor]] = {}

    def _indices(self, device: torch.device) -> dict[str, torch.Tensor]:
        if device not in self._on:
            self._on[device] = {k: v.to(device) for k, v in self._index.items()}
        return self._on[device]

    def _log_factor(self, u: torch.Tensor) -> tuple[torch.Size, torch.Tensor]:
        """The lower-triangular matrix with ``log`` diagonal, and the batch shape."""
        batch, z = self._unflatten(u)
        idx = self._indices(u.device)
        padded = F.pad(z, (0, 1))
        return batch, padded[..., idx["gather"]].reshape(*z.shape[:-1], self.n, self.n)

    def forward(self, u):
        batch, m = self._log_factor(u)
        log_diag = m.diagonal(dim1=-2, dim2=-1)
        L = m.tril(-1) + torch.diag_embed(log_diag.exp())
        return L, _sum_to_batch(log_diag, batch)

    def inverse(self, x):
        idx = self._indices(x.device)
        m = x.tril(-1) + torch.diag_embed(x.diagonal(dim1=-2, dim2=-1).log())
        z = m[..., idx["rows"], idx["cols"]]
        return self._flatten(z, x)


class _PositiveDefinite(_LowerCholesky):
    """``S = L L^T`` with ``L`` from :class:`_LowerCholesky`; the Jacobian of
    ``L -> lower triangle of S`` is ``2^n prod_i L_ii^(n - i + 1)`` (1-based ``i``)."""

    def forward(self, u):
        batch, m = self._log_factor(u)
        log_diag = m.diagonal(dim1=-2, dim2=-1)
        L = m.tril(-1) + torch.diag_embed(log_diag.exp())
        weights = torch.arange(self.n + 1, 1, -1, dtype=u.dtype, device=u.device)
        ladj = log_diag * weights + math.log(2.0)
        return L @ L.transpose(-1, -2), _sum_to_batch(ladj, batch)

    def inverse(self, x):
        return super().inverse(torch.linalg.cholesky(x))


def param_transform(constraint: Constraint, shape: Sequence[int] = ()) -> ParamTransform:
    """The bijection from unconstrained reals onto ``constraint``'s support for a tensor of
    ``shape``.

    Handles every constraint ``torch.distributions.biject_to`` handles, plus
    :data:`ordered_vector`, :data:`positive_ordered_vector`, ``constraints.lower_cholesky``
    and ``constraints.positive_definite`` (and ``positive_semidefinite``, whose interior it
    maps onto).

    Raises
    ------
    ValueError
        For a discrete support, a constraint with no bijection, or a shape with fewer
        dimensions than the constraint's event (a simplex needs a vector).
    """
    shape = _as_shape(shape)
    if not isinstance(constraint, Constraint):
        raise TypeError(
            f"constraint must be a torch.distributions.constraints object, got {constraint!r}"
        )
    if isinstance(constraint, type(constraints.dependent)):
        raise ValueError(
            f"{constraint} has no fixed support (it depends on other values); declare the "
            "parameter with the constraint it has, or sample it on the real line"
        )
    if constraint.is_discrete:
        raise ValueError(f"{constraint} is discrete; HMC samples continuous parameters only")
    if len(shape) < constraint.event_dim:
        raise ValueError(
            f"{constraint} needs a shape with at least {constraint.event_dim} dimension(s), "
            f"got {shape}"
        )
    if is_real(constraint):
        return _Identity(shape, shape)
    if isinstance(constraint, _OrderedVector):
        return _Ordered(shape, positive=isinstance(constraint, _PositiveOrderedVector))
    if is_lower_cholesky(constraint) or is_positive_definite(constraint):
        if shape[-1] != shape[-2]:
            raise ValueError(f"{constraint} needs square matrices, got shape {shape}")
        if is_lower_cholesky(constraint):
            return _LowerCholesky(shape)
        return _PositiveDefinite(shape)
    try:
        transform = biject_to(constraint)
    except NotImplementedError as error:
        raise ValueError(
            f"torch.distributions.biject_to cannot handle {constraint} ({error}); "
            "use a constraint with a bijection to the reals"
        ) from None
    if not transform.bijective:
        raise ValueError(f"biject_to({constraint}) = {transform} is not bijective")
    return _TorchBijection(transform, shape)


def cast_to(obj: Any, dtype: torch.dtype, device: torch.device | str | None = None) -> Any:
    """A copy of a distribution, transform or constraint whose floating-point tensors are in
    ``dtype`` on ``device`` (recursively; argument validation off on the copies)."""
    return _cast(obj, dtype, device, {})


def _cast(obj: Any, dtype: torch.dtype, device: Any, memo: dict[int, Any]) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device=device, dtype=dtype if obj.is_floating_point() else obj.dtype)
    if isinstance(obj, Distribution | Transform | Constraint):
        if id(obj) in memo:
            return memo[id(obj)]
        new = copy.copy(obj)
        memo[id(obj)] = new
        for key, value in vars(obj).items():
            vars(new)[key] = (
                None if is_cached_inverse(obj, key) else _cast(value, dtype, device, memo)
            )
        if isinstance(new, Distribution):
            turn_off_validation(new)
        return new
    if type(obj) in (list, tuple):
        return type(obj)(_cast(v, dtype, device, memo) for v in obj)
    return obj


def _as_shape(shape: Sequence[int] | int) -> tuple[int, ...]:
    if isinstance(shape, int | np.integer) and not isinstance(shape, bool):
        shape = (int(shape),)
    try:
        out = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise TypeError(f"shape must be a tuple of integers, got {shape!r}") from None
    if any(s < 0 for s in out) or any(isinstance(s, bool) for s in shape):
        raise ValueError(f"shape must be non-negative integers, got {shape!r}")
    return out


# ====================================================================== parameters
@dataclass(frozen=True)
class Param:
    """A parameter's shape and support.

    Examples
    --------
    >>> from torch.distributions import constraints
    >>> Param(shape=8).shape, Param((2, 2), constraints.lower_cholesky).shape
    ((8,), (2, 2))
    """

    shape: tuple[int, ...] | int = ()
    constraint: Constraint = constraints.real

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", _as_shape(self.shape))
        _check_bounds(self.constraint)


ARTICLED = {"lower_bound": "a lower bound", "upper_bound": "an upper bound"}


def _check_bounds(constraint: Constraint) -> None:
    """Raise naming an interval or bound that leaves no room: a lower bound not below the
    upper one, or a bound that is not a finite number (use ``constraints.positive``,
    ``greater_than`` or ``real`` for a half-line or the line)."""
    bounds = {
        name: getattr(constraint, name)
        for name in ("lower_bound", "upper_bound")
        if hasattr(constraint, name)
    }
    for name, bound in bounds.items():
        values = torch.as_tensor(bound, dtype=torch.float64)
        if not torch.isfinite(values).all():
            raise ValueError(
                f"constraint {constraint} has {ARTICLED[name]} that is not finite "
                f"({bound}); for a half-line use constraints.greater_than or less_than, for "
                "the whole line constraints.real"
            )
    if len(bounds) == 2:
        lower, upper = (torch.as_tensor(b, dtype=torch.float64) for b in bounds.values())
        if not (lower < upper).all():
            raise ValueError(
                f"constraint {constraint} is empty or a point: its lower bound "
                f"{bounds['lower_bound']} must be below its upper bound {bounds['upper_bound']}"
            )


class UndeclaredParameterError(KeyError):
    """``log_prob`` read a name that is not among the model's parameters."""

    def __str__(self) -> str:
        return str(self.args[0])


class _Slot(NamedTuple):
    name: str
    transform: ParamTransform
    start: int
    stop: int
    constraint: Constraint
    prior: Distribution | None


class _ReadRecorder(Mapping):
    """A read-only dict of parameter values that records which names were read."""

    def __init__(self, values: Values, what: str) -> None:
        self._values = values
        self._what = what
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._values:
            raise UndeclaredParameterError(
                f"{self._what} reads parameter {key!r}, which is not declared; the model's "
                f"parameters are {list(self._values)}"
            )
        self.read.add(key)
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        self.read.update(self._values)
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


# ====================================================================== the model
class Model:
    """A log density over named, constrained parameters, sampled on the unconstrained scale.

    Parameters
    ----------
    log_prob : callable or None
        ``log_prob(p)`` with ``p`` a dict ``name -> tensor of the parameter's shape`` (on
        the constrained scale) returning a 0-d tensor: the log density up to a constant,
        without Jacobians (the model adds them). It must work under ``torch.func.vmap``:
        no ``.item()``, no Python branches on values, no in-place writes to ``p``; and in
        the dtype of its inputs. None when every parameter is a distribution.
    params : dict
        ``name -> Param(shape, constraint)``, or ``name -> torch Distribution``: its
        ``log_prob`` is added, its ``support`` is the constraint and
        ``batch_shape + event_shape`` the shape. The flat vector lists them in this order.
    derived : callable, optional
        ``derived(p) -> {name: tensor}``: deterministic quantities per draw (e.g.
        ``theta = mu + tau * theta_trans``), added to the posterior group.
    log_likelihood : callable, optional
        ``log_likelihood(p) -> {name: tensor (n_obs...)}``: pointwise log-likelihoods per
        draw, returned as the ``log_likelihood`` group (what ``arviz_stats.loo`` reads).
    observed_data : dict, optional
        Arrays returned as the ``observed_data`` group.
    dims, coords : dict, optional
        ArviZ dims (``name -> list of dimension names``) and coords
        (``dimension -> labels``) of posterior, derived and data variables.
    unconstrained : bool
        Also return the unconstrained draws, group ``unconstrained_posterior``, one variable
        ``<name>_unconstrained`` per parameter of shape ``transform.unconstrained_shape``.
    name : str, optional
        A label (for display).

    Attributes
    ----------
    dim : int
        ``D``, the length of the unconstrained vector.
    batched : bool
        False: :meth:`log_prob` takes one position ``(D,)``.

    Raises
    ------
    UndeclaredParameterError (a KeyError)
        When ``log_prob`` reads a name that is not a parameter.
    ValueError
        When a declared :class:`Param` is never read by ``log_prob`` (its prior would be
        flat and improper), or a constraint has no bijection. Names are checked by running
        ``log_prob`` once at construction (at the unconstrained point 0, float64, CPU); if
        that raises for another reason, on the first evaluation instead.

    Examples
    --------
    >>> import torch, hmc
    >>> from torch.distributions import HalfCauchy
    >>> y = torch.tensor([28.0, 8, -3, 7, -1, 1, 18, 12], dtype=torch.float64)
    >>> s = torch.tensor([15.0, 10, 16, 11, 9, 11, 10, 18], dtype=torch.float64)
    >>> def log_prob(p):
    ...     theta = p["mu"] + p["tau"] * p["z"]
    ...     prior = -0.5 * (p["z"] ** 2).sum() - 0.5 * (p["mu"] / 5) ** 2
    ...     return prior - 0.5 * (((y - theta) / s) ** 2).sum()
    >>> model = hmc.Model(
    ...     log_prob,
    ...     {"mu": hmc.Param(), "tau": HalfCauchy(5.0), "z": hmc.Param(shape=8)},
    ...     derived=lambda p: {"theta": p["mu"] + p["tau"] * p["z"]},
    ...     dims={"z": ["school"], "theta": ["school"]},
    ... )
    >>> dt = hmc.sample(model, chains=2, warmup=200, draws=200, seed=1)  # doctest: +SKIP
    >>> model.dim
    10
    """

    batched = False

    def __init__(
        self,
        log_prob: Callable[[Values], torch.Tensor] | None,
        params: Mapping[str, Param | Distribution],
        *,
        derived: Callable[[Values], Mapping[str, torch.Tensor]] | None = None,
        log_likelihood: Callable[[Values], Mapping[str, torch.Tensor]] | None = None,
        observed_data: Mapping[str, Any] | None = None,
        dims: Mapping[str, Sequence[str]] | None = None,
        coords: Mapping[str, Sequence[Any]] | None = None,
        unconstrained: bool = False,
        name: str | None = None,
    ) -> None:
        for label, fn in (("log_prob", log_prob), ("derived", derived)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{label} must be callable, got {type(fn).__name__}")
        if log_likelihood is not None and not callable(log_likelihood):
            raise TypeError(f"log_likelihood must be callable, got {type(log_likelihood).__name__}")
        if not isinstance(params, Mapping) or not params:
            raise ValueError(
                "params must be a non-empty dict name -> hmc.Param or torch Distribution"
            )
        self._fn = log_prob
        self._derived = derived
        self._log_likelihood = log_likelihood
        self._slots = self._layout(params)
        self.dim = self._slots[-1].stop
        if log_prob is None and not any(s.prior is not None for s in self._slots):
            raise ValueError("log_prob is None, so every parameter must be a distribution")
        self.observed_data = {k: np.asarray(v) for k, v in (observed_data or {}).items()}
        self.dims = {k: list(v) for k, v in (dims or {}).items()}
        for variable, labels in self.dims.items():
            taken = sorted({"chain", "draw"} & set(labels))
            if taken:
                raise ValueError(
                    f"dims of {variable!r} use {taken}: the DataTree's own dimensions; name "
                    "the variable's dimensions otherwise"
                )
        self.coords = {k: list(v) for k, v in (coords or {}).items()}
        self.unconstrained = bool(unconstrained)
        self.name = name
        self._priors: dict[tuple[str, torch.dtype, torch.device], Distribution] = {}
        self._checked = log_prob is None
        self._dry_run()

    # ------------------------------------------------------------------ layout
    @staticmethod
    def _layout(params: Mapping[str, Param | Distribution]) -> list[_Slot]:
        slots, start = [], 0
        for name, spec in params.items():
            check_name(name, "parameter")
            prior = None
            if isinstance(spec, Distribution):
                prior = spec
                shape = tuple(spec.batch_shape + spec.event_shape)
                constraint = spec.support
                if constraints.is_dependent(constraint):
                    raise ValueError(
                        f"parameter {name!r}: the support of {spec} depends on other "
                        "variables; declare it with hmc.Param and add its log density"
                    )
            elif isinstance(spec, Param):
                shape, constraint = spec.shape, spec.constraint
            else:
                raise TypeError(
                    f"parameter {name!r} must be an hmc.Param or a torch Distribution, "
                    f"got {type(spec).__name__}"
                )
            try:
                transform = param_transform(constraint, shape)
            except (TypeError, ValueError) as error:
                raise type(error)(f"parameter {name!r}: {error}") from None
            slots.append(_Slot(name, transform, start, start + transform.size, constraint, prior))
            start += transform.size
        if start == 0:
            raise ValueError("the model has no free parameters (unconstrained dimension 0)")
        return slots

    @property
    def names(self) -> list[str]:
        """Parameter names, in the order of the flat vector."""
        return [s.name for s in self._slots]

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Constrained shape of each parameter."""
        return {s.name: s.transform.shape for s in self._slots}

    @property
    def transforms(self) -> dict[str, ParamTransform]:
        """The bijection of each parameter."""
        return {s.name: s.transform for s in self._slots}

    def coordinate_names(self) -> list[str]:
        """A name for each of the ``D`` unconstrained coordinates, in the flat vector's
        order: ``sigma`` for a scalar parameter, ``W[3]`` or ``W[1, 2]`` for an entry of a
        tensor one, and ``w_unconstrained[1]`` where the unconstrained shape is not the
        parameter's own (a simplex, a Cholesky factor: the index is not an entry of ``w``).

        Examples
        --------
        >>> from torch.distributions import constraints
        >>> model = Model(
        ...     lambda p: -(p["W"] ** 2).sum() - p["sigma"] - (p["w"] ** 2).sum(),
        ...     {"sigma": Param((), constraints.positive), "W": Param((2, 2)),
        ...      "w": Param(3, constraints.simplex)},
        ... )
        >>> model.coordinate_names()  # doctest: +NORMALIZE_WHITESPACE
        ['sigma', 'W[0, 0]', 'W[0, 1]', 'W[1, 0]', 'W[1, 1]', 'w_unconstrained[0]',
         'w_unconstrained[1]']
        """
        names = []
        for slot in self._slots:
            shape = slot.transform.unconstrained_shape
            label = slot.name if shape == slot.transform.shape else f"{slot.name}_unconstrained"
            names += [
                f"{label}[{', '.join(map(str, index))}]" if shape else label
                for index in np.ndindex(*shape)
            ]
        return names

    def __repr__(self) -> str:
        parts = ", ".join(f"{s.name}: {s.transform.shape} {s.constraint}" for s in self._slots)
        label = f"{self.name!r}, " if self.name else ""
        return f"Model({label}dim={self.dim}, {parts})"

    # ------------------------------------------------------------------ scales
    def _constrain(self, q: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        values, log_det = {}, None
        for slot in self._slots:
            x, ladj = slot.transform.forward(q[..., slot.start : slot.stop])
            values[slot.name] = x
            if slot.transform.has_jacobian:
                log_det = ladj if log_det is None else log_det + ladj
        return values, log_det

    def constrain(self, q: torch.Tensor) -> dict[str, torch.Tensor]:
        """Constrained values ``name -> (*batch, *shape)`` from ``q`` ``(*batch, D)``."""
        self._check_width(q)
        return self._constrain(q)[0]

    def unconstrain(self, values: Mapping[str, Any]) -> torch.Tensor:
        """The flat unconstrained vector ``(*batch, D)`` of constrained values (every
        parameter given, all with the same batch shape)."""
        missing = [s.name for s in self._slots if s.name not in values]
        if missing:
            raise ValueError(f"unconstrain needs every parameter; missing {missing}")
        return torch.cat(
            [s.transform.inverse(torch.as_tensor(values[s.name])) for s in self._slots], -1
        )

    def _check_width(self, q: torch.Tensor) -> None:
        if q.dim() < 1 or q.shape[-1] != self.dim:
            raise ValueError(f"expected positions of shape (..., {self.dim}), got {tuple(q.shape)}")

    # ------------------------------------------------------------------ density
    def log_prob(self, q: torch.Tensor) -> torch.Tensor:
        """Log density at one unconstrained position ``q`` ``(D,)``: the user's log
        density, the priors of distribution parameters and the log-Jacobians; 0-d."""
        if q.dim() != 1 or q.shape[0] != self.dim:
            raise ValueError(
                f"Model.log_prob takes one position of shape ({self.dim},), got "
                f"{tuple(q.shape)}; hmc.sample batches it over chains"
            )
        values, total = self._constrain(q)
        for slot in self._slots:
            if slot.prior is not None:
                lp = self._prior_like(slot, q).log_prob(values[slot.name]).sum()
                total = lp if total is None else total + lp
        if self._fn is not None:
            lp = self._call_user(values)
            total = lp if total is None else total + lp
        assert total is not None  # a model has a log_prob, a prior or a Jacobian
        return total

    def _prior_like(self, slot: _Slot, q: torch.Tensor) -> Distribution:
        key = (slot.name, q.dtype, q.device)
        if key not in self._priors:
            self._priors[key] = cast_to(slot.prior, q.dtype, q.device)
        return self._priors[key]

    def _call_user(self, values: dict[str, torch.Tensor]) -> torch.Tensor:
        assert self._fn is not None
        if self._checked:
            lp = self._fn(values)
        else:
            recorder = _ReadRecorder(values, "log_prob")
            lp = self._fn(recorder)
            self._check_reads(recorder)
        if not isinstance(lp, torch.Tensor):
            raise TypeError(f"log_prob must return a 0-d torch.Tensor, got {type(lp).__name__}")
        if lp.dim() != 0:
            raise ValueError(f"log_prob must return a 0-d tensor, got shape {tuple(lp.shape)}")
        return lp

    def _check_reads(self, recorder: _ReadRecorder) -> None:
        unread = [s.name for s in self._slots if s.prior is None and s.name not in recorder.read]
        if unread:
            raise ValueError(
                f"log_prob never reads parameter(s) {unread}: an hmc.Param needs a density "
                "from log_prob (remove it, use it, or declare it with a prior distribution)"
            )
        self._checked = True

    def _dry_run(self) -> None:
        """Check parameter names by one evaluation at the unconstrained point 0."""
        if self._checked:
            return
        values, _ = self._constrain(torch.zeros(self.dim, dtype=torch.float64))
        recorder = _ReadRecorder(values, "log_prob")
        try:
            with torch.no_grad(), distribution_validation_off():
                assert self._fn is not None
                self._fn(recorder)
        except UndeclaredParameterError:
            raise
        except Exception:  # not a naming error: checked at the first evaluation instead
            return
        self._check_reads(recorder)

    # ------------------------------------------------------------------ Target protocol
    def initial_positions(
        self, init: Mapping[str, Any] | None, chains: int, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor | None:
        """``(chains, D)`` unconstrained starts from constrained values.

        ``init`` maps parameter names to values of the parameter's shape (every chain) or
        ``(chains, *shape)``. Parameters left out start at unconstrained 0.
        """
        if init is None:
            return None
        if not isinstance(init, Mapping):
            raise TypeError(
                f"init for a Model must be a dict name -> constrained value, got "
                f"{type(init).__name__}"
            )
        unknown = [k for k in init if k not in self.shapes]
        if unknown:
            raise ValueError(
                f"init has unknown parameter(s) {unknown}; the model's parameters are {self.names}"
            )
        q = torch.zeros(chains, self.dim, dtype=dtype, device=device)
        for slot in self._slots:
            if slot.name in init:
                u = self._init_slot(slot, init[slot.name], chains, dtype, device)
                q[:, slot.start : slot.stop] = u
        return q

    def _init_slot(
        self, slot: _Slot, value: Any, chains: int, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        shape = slot.transform.shape
        try:
            x = torch.as_tensor(value, dtype=dtype, device=device).detach()
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(f"init for {slot.name!r} is not numeric: {error}") from None
        if tuple(x.shape) == shape:
            x = x.expand(chains, *shape)
        elif tuple(x.shape) != (chains, *shape):
            raise ValueError(
                f"init for {slot.name!r} has shape {tuple(x.shape)}; expected {shape} or "
                f"(chains={chains}, *{shape})"
            )
        inside = cast_to(slot.constraint, dtype, device).check(x)
        if not (bool(inside.all()) and bool(torch.isfinite(x).all())):
            raise ValueError(f"init for {slot.name!r} is outside its support {slot.constraint}")
        u = slot.transform.inverse(x)
        if not torch.isfinite(u).all():
            raise ValueError(
                f"init for {slot.name!r} is on the boundary of its support {slot.constraint}"
            )
        return u

    def posterior(self, draws: np.ndarray) -> dict[str, np.ndarray]:
        """Constrained draws ``name -> (C, N, *shape)`` (and derived quantities) from
        unconstrained draws ``(C, N, D)``."""
        q = torch.as_tensor(np.asarray(draws))
        self._check_width(q)
        with torch.no_grad():
            values, _ = self._constrain(q)
        out = {name: v.numpy(force=True) for name, v in values.items()}
        if self._derived is not None:
            for name, value in self._per_draw(self._derived, q, "derived").items():
                if name in out:
                    raise ValueError(f"derived quantity {name!r} has a parameter's name")
                out[name] = value
        return out

    def dims_and_coords(self) -> tuple[dict[str, list[str]], dict[str, Any]]:
        """ArviZ ``dims`` and ``coords`` (those given, and the unconstrained variables')."""
        dims = dict(self.dims)
        if self.unconstrained:
            for slot in self._slots:
                t = slot.transform
                if slot.name in self.dims and t.unconstrained_shape == t.shape:
                    dims[f"{slot.name}_unconstrained"] = self.dims[slot.name]
        return dims, dict(self.coords)

    def extra_groups(self, draws: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
        """``observed_data``, ``log_likelihood`` and ``unconstrained_posterior`` groups, as
        far as the model has them."""
        groups: dict[str, dict[str, np.ndarray]] = {}
        if self.observed_data:
            groups["observed_data"] = dict(self.observed_data)
        q = torch.as_tensor(np.asarray(draws))
        if self._log_likelihood is not None:
            groups["log_likelihood"] = self._per_draw(self._log_likelihood, q, "log_likelihood")
        if self.unconstrained:
            groups["unconstrained_posterior"] = {
                f"{s.name}_unconstrained": draws[..., s.start : s.stop].reshape(
                    *draws.shape[:-1], *s.transform.unconstrained_shape
                )
                for s in self._slots
            }
        return groups

    def _per_draw(
        self, fn: Callable[[Values], Mapping[str, torch.Tensor]], q: torch.Tensor, what: str
    ) -> dict[str, np.ndarray]:
        """``fn`` of the constrained values of every draw in ``q`` ``(*batch, D)``, as
        ``name -> (*batch, *shape)`` arrays (vmapped in chunks; a loop if vmap fails)."""
        batch = q.shape[:-1]
        rows = q.reshape(-1, self.dim)

        def one(row: torch.Tensor) -> dict[str, torch.Tensor]:
            out = fn(_ReadRecorder(self._constrain(row)[0], what))
            if not isinstance(out, Mapping):
                raise TypeError(f"{what} must return a dict name -> tensor, got {type(out)}")
            for name in out:
                check_name(name, f"{what}'s value")

            return {k: torch.as_tensor(v) for k, v in out.items()}

        parts: list[dict[str, torch.Tensor]] = []
        with torch.no_grad(), distribution_validation_off():
            for chunk in rows.split(_CHUNK):
                try:
                    parts.append(torch.func.vmap(one)(chunk))
                except UndeclaredParameterError:
                    raise
                except (RuntimeError, ValueError, NotImplementedError):
                    loop = [one(row) for row in chunk]
                    parts.append({k: torch.stack([p[k] for p in loop]) for k in loop[0]})
        names = parts[0].keys() if parts else []
        return {
            k: torch.cat([p[k] for p in parts])
            .reshape((*batch, *parts[0][k].shape[1:]))
            .numpy(force=True)
            for k in names
        }
