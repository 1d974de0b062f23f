"""Pyro models as :class:`hmc.Model`: ``hmc.sample(hmc.from_pyro(model, *args))``.

:func:`from_pyro` runs the Pyro model once under ``pyro.poutine.trace`` (with the global
torch random state saved and restored, and torch's default dtype that of the first
floating-point tensor among the arguments, float64 without one) to learn its sites:

- each latent (unobserved) sample site becomes an :class:`hmc.Param` of the site value's
  shape with the site's support, mapped to the reals by :func:`hmc.parameters.param_transform`,
  which is ``torch.distributions.biject_to`` (as Pyro's own HMC uses, with Pyro's
  registrations) for every support Pyro's HMC handles; the unconstrained coordinates are
  then Pyro's own;
- observed sites condition the density, and come back as the ``observed_data`` group with
  their pointwise log densities as the ``log_likelihood`` group (what ``arviz_stats.loo``
  reads); ``pyro.factor`` terms are added to the density;
- ``pyro.deterministic`` sites come back in the posterior as derived quantities;
- a site's dimensions inside ``pyro.plate`` take the plate's name as their ArviZ dim
  (the others ``<site>_dim_<i>``, ArviZ's default).

Supports are read once, from that trace, as Pyro's HMC does: a support that depends on
another latent value (``Uniform(0, tau)`` with ``tau`` sampled) is fixed at its traced
value. Discrete latent sites and subsampled plates are refused, naming the site.

**The log joint is one traced graph.** The log joint of the latent values is a function
of tensors that runs the model's Python body under one small handler, :class:`_Replay`,
which puts the values into the latent sites and adds up ``fn.log_prob(value)``, scaled and
masked as Pyro scales and masks them (it builds no trace). That function is traced once
per dtype and device with ``torch.fx.experimental.proxy_tensor.make_fx`` into a graph of
torch operations, and the graph is what every gradient evaluates: no Pyro code runs in the
sampler's loop, and ``torch.compile`` captures the whole energy (Pyro's messages are typed
dicts that dynamo cannot trace: compiling the handler itself breaks the graph at every
site). The tracing runs with torch's default dtype set to the sampling dtype, so the
model's Python-number constants (``Normal(0.0, 5.0)``) are in that dtype too; tensors the
model is given keep theirs. Tracing refuses to turn a traced tensor into a Python number
(``.item()``, ``int(...)``, an ``if`` on a tensor: a value the graph could not follow);
the graph is then checked against the handler at a second point. Where tracing fails or
the two differ, a warning says why and the handler is evaluated at every gradient instead:
slower, but the same density.

Measured here (torch 2.14, 1 thread, the eight schools of ``tests/test_pyro.py``, value
and gradient of one position): ``poutine.trace(poutine.condition(model, values))`` with
``log_prob_sum()`` 453 microseconds, the handler 406 to 434, its traced graph 300, the
same distributions called directly without Pyro 248, a plain hand-written density 123;
at 4 chains under ``torch.func.vmap``: 875, 669 to 787, 539, 448 and 239.

Pyro is an optional dependency (``pip install "hmc[pyro]"``): this module imports it
only when :func:`from_pyro` is called, so ``import hmc`` does not import Pyro.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any, NamedTuple

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from hmc._torch_compat import distribution_validation_off
from hmc.parameters import Model, Param, param_transform

__all__ = ["from_pyro"]

Values = Mapping[str, torch.Tensor]


def _import_pyro() -> ModuleType:
    try:
        import pyro
    except ImportError as error:
        raise ImportError(
            f"hmc.from_pyro needs Pyro, which is not installed ({error}); install it with: "
            'pip install "hmc[pyro]"'
        ) from None
    return pyro


class _Sites(NamedTuple):
    """What one trace of the model says about its sites, in the order they ran."""

    latent: dict[str, Param]
    values: dict[str, torch.Tensor]  # the traced latent values (inside their supports)
    deterministic: list[str]
    observed: dict[str, torch.Tensor]  # observed values (``pyro.factor`` sites left out)
    dims: dict[str, list[str]]


@functools.cache
def _replay_handler() -> type:
    """The :class:`_Replay` handler class (built on first use: its base class is Pyro's)."""
    from pyro.distributions.util import scale_and_mask
    from pyro.poutine.messenger import Messenger
    from pyro.poutine.util import site_is_factor, site_is_subsample

    class _Replay(Messenger):
        """Run a model with the latent sites set to ``values``; add up the log density.

        After the model has run: ``log_joint`` is the sum over sample sites (latent and
        observed; deterministic and subsample sites carry none) of the scaled, masked
        ``fn.log_prob(value)``, a 0-d tensor (or 0.0 for a model without terms);
        ``deterministic`` holds the deterministic sites' values and ``pointwise`` the
        observed sites' (not factors') unreduced log densities, both by site name.
        """

        def __init__(self, values: Values) -> None:
            super().__init__()
            self.values = values
            self.log_joint: torch.Tensor | float = 0.0
            self.deterministic: dict[str, torch.Tensor] = {}
            self.pointwise: dict[str, torch.Tensor] = {}

        def _pyro_sample(self, msg: Any) -> None:
            if msg["is_observed"] or site_is_subsample(msg):
                return
            name = msg["name"]
            if name not in self.values:
                raise ValueError(
                    f"the Pyro model sampled a latent site {name!r} that was not there when "
                    "hmc.from_pyro traced it; HMC needs the same latent sites at every "
                    f"evaluation (those traced: {list(self.values)})"
                )
            msg["value"] = self.values[name]
            msg["is_observed"] = True
            msg["done"] = True

        def _pyro_post_sample(self, msg: Any) -> None:
            if site_is_subsample(msg):
                return
            if (msg["infer"] or {}).get("_deterministic"):
                self.deterministic[msg["name"]] = msg["value"]
                return
            lp = scale_and_mask(msg["fn"].log_prob(msg["value"]), msg["scale"], msg["mask"])
            if msg["name"] not in self.values and not site_is_factor(msg):
                self.pointwise[msg["name"]] = lp
            self.log_joint = self.log_joint + lp.sum()

    return _Replay


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """torch's default dtype set to ``dtype`` (a floating dtype) for a block."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


class _LogJoint:
    """The model's log joint at latent values, ``log_joint(values) -> 0-d tensor``,
    evaluated through a graph traced once per dtype and device (see the module
    docstring), or through the :class:`_Replay` handler where no graph could be traced.

    ``values`` maps every latent site's name to a tensor of its shape (constrained);
    the dtype and device of the first one pick the graph.
    """

    def __init__(self, model: Callable, args: tuple, kwargs: dict, sites: _Sites) -> None:
        self.model, self.args, self.kwargs = model, args, kwargs
        self.names = list(sites.latent)
        self.sites = sites
        self.replay = _replay_handler()  # looked up here: torch.compile does not trace a cache
        self.graphs: dict[tuple[torch.dtype, torch.device], Callable | None] = {}

    def run(self, values: Values) -> Any:
        """The :class:`_Replay` handler after one run of the model at ``values``, with the
        default dtype that of the values."""
        handler = self.replay(values)
        with handler, _default_dtype(next(iter(values.values())).dtype):
            self.model(*self.args, **self.kwargs)
        return handler

    def eager(self, values: Values) -> torch.Tensor:
        """The log joint through Pyro's handlers (the oracle of the traced graph)."""
        return torch.as_tensor(self.run(values).log_joint)

    def __call__(self, values: Values) -> torch.Tensor:
        first = values[self.names[0]]
        key = (first.dtype, first.device)
        if key not in self.graphs:
            if torch.compiler.is_compiling():  # trace outside the compiler's own tracing
                return self.eager(values)
            self.graphs[key] = self._trace(*key)
        graph = self.graphs[key]
        if graph is None:
            return self.eager(values)
        return graph(*(values[name] for name in self.names))

    def _flat(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.eager(dict(zip(self.names, tensors, strict=True)))

    def _trace(self, dtype: torch.dtype, device: torch.device) -> Callable | None:
        """The graph of the log joint in ``dtype`` on ``device``, checked against the
        handler at a second point; None (after a warning) where that fails."""
        at = [self.sites.values[n].to(dtype=dtype, device=device) for n in self.names]
        other = [_nearby(self.sites.latent[n], x) for n, x in zip(self.names, at, strict=True)]
        try:
            with torch.no_grad(), distribution_validation_off():
                graph = make_fx(self._flat)(*at)
                graph.graph.eliminate_dead_code()
                graph.recompile()
                expected, got = self._flat(*other), graph(*other)
        except Exception as error:  # the model does something tracing cannot follow
            why = (
                f"tracing failed ({type(error).__name__}: {error}); where the model turns a "
                "tensor into a Python number (int(y.sum()), .item(), an if on a tensor), "
                "compute that number outside the model and pass it in"
            )
        else:
            if torch.allclose(got, expected, rtol=1e-9, atol=1e-9, equal_nan=True):
                return graph
            why = (
                f"the traced graph gives {float(got)} where the model gives {float(expected)} "
                "at a second point: its Python does something its tensors do not show"
            )
        warnings.warn(
            f"hmc.from_pyro: {why}; evaluating the model through Pyro's handlers at every "
            "gradient instead (slower, and torch.compile breaks its graph at every site)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def _nearby(param: Param, x: torch.Tensor) -> torch.Tensor:
    """A point of ``param``'s support near ``x``: its unconstrained coordinates moved by
    0.3 (a second point to check a traced graph at)."""
    transform = param_transform(param.constraint, param.shape)
    u = transform.inverse(x)
    return transform.forward(u + 0.3)[0]


def _trace_sites(model: Callable, args: tuple, kwargs: dict) -> _Sites:
    """Run the model once under ``pyro.poutine.trace`` (the torch random state restored
    after) and sort its sample sites.

    Raises
    ------
    ValueError
        Naming a discrete latent site, a subsampled plate, a site whose support has no
        bijection to the reals, or when the model has no latent sites.
    """
    from pyro import poutine
    from pyro.poutine.util import site_is_subsample

    with (
        torch.random.fork_rng(devices=[]),
        torch.no_grad(),
        _default_dtype(_data_dtype(args, kwargs)),
    ):
        trace = poutine.trace(model).get_trace(*args, **kwargs)
    latent: dict[str, Param] = {}
    values: dict[str, torch.Tensor] = {}
    deterministic, observed, dims = [], {}, {}
    for name, site in trace.nodes.items():
        if site["type"] != "sample":
            continue
        fn = site["fn"]
        if site_is_subsample(site):
            if fn.subsample_size is not None and fn.subsample_size < fn.size:
                raise ValueError(
                    f"plate {name!r} subsamples {fn.subsample_size} of {fn.size}: the density "
                    "would change at every evaluation; HMC needs the full data (drop "
                    "subsample_size)"
                )
            continue
        if (site["infer"] or {}).get("_deterministic"):
            deterministic.append(name)
        elif site["is_observed"]:
            if type(fn).__name__ != "Unit":  # a pyro.factor term has no data
                observed[name] = site["value"].detach()
        else:
            latent[name] = _latent_param(name, site)
            values[name] = site["value"].detach()
        site_dims = _plate_dims(name, site)
        if site_dims is not None:
            dims[name] = site_dims
    if not latent:
        raise ValueError(
            "the Pyro model has no latent sample sites: nothing to sample (every site is "
            "observed or deterministic)"
        )
    return _Sites(latent, values, deterministic, observed, dims)


def _data_dtype(args: tuple, kwargs: dict) -> torch.dtype:
    """The dtype to trace the model in: that of its first floating-point tensor argument
    (so that ``x @ beta`` meets a ``beta`` of ``x``'s dtype), float64 (the sampler's
    default) without one."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.dtype
    return torch.float64


def _latent_param(name: str, site: Any) -> Param:
    fn = site["fn"]
    support = fn.support
    if support.is_discrete or (site["infer"] or {}).get("enumerate"):
        raise ValueError(
            f"latent site {name!r} is discrete ({type(fn).__name__} with support {support}); "
            "HMC samples continuous sites only: marginalise it out in the model, or observe it"
        )
    shape = tuple(site["value"].shape)
    try:
        param_transform(support, shape)
    except (TypeError, ValueError) as error:
        raise ValueError(f"latent site {name!r} ({type(fn).__name__}): {error}") from None
    return Param(shape, support)


def _plate_dims(name: str, site: Any) -> list[str] | None:
    """ArviZ dims of a site's value: a plate's name at each dimension a vectorised plate
    indexes, ``<name>_dim_<i>`` elsewhere; None when no plate indexes it."""
    shape = tuple(site["value"].shape)
    deterministic = (site["infer"] or {}).get("_deterministic")
    # a deterministic site's value is all event by default, but is computed in its plates
    batch_rank = len(shape) if deterministic else len(shape) - len(site["fn"].event_shape)
    labels = [f"{name}_dim_{i}" for i in range(len(shape))]
    found = False
    for frame in site["cond_indep_stack"]:
        if frame.vectorized and frame.dim is not None and -frame.dim <= batch_rank:
            index = batch_rank + frame.dim
            if shape[index] == frame.size:
                labels[index] = frame.name
                found = True
    return labels if found else None


def from_pyro(model: Callable[..., Any], *args: Any, **kwargs: Any) -> Model:
    """An :class:`hmc.Model` of a Pyro model's posterior, for :func:`hmc.sample`.

    Parameters
    ----------
    model : callable
        A Pyro model: a function whose ``pyro.sample`` sites without ``obs`` are the
        latent variables (continuous, a fixed set of them), the others data.
    *args, **kwargs
        Passed to ``model`` at every evaluation (data, sizes).

    Returns
    -------
    hmc.Model
        One parameter per latent site (the site's name, the traced value's shape
        ``batch_shape + event_shape``, its support), sampled on Pyro's unconstrained scale.
        ``log_prob`` is the model's log joint (every sample site's scaled, masked
        ``log_prob``, ``pyro.factor`` terms included) plus the log-Jacobians. The
        posterior has the deterministic sites too; ``observed_data`` and
        ``log_likelihood`` the observed sites; plate names are the dims.

    Raises
    ------
    ImportError
        When Pyro is not installed (``pip install "hmc[pyro]"``).
    TypeError
        When ``model`` is not callable.
    ValueError
        Naming a discrete latent site (enumeration is not supported), a subsampled plate,
        a support with no bijection to the reals; or when there is no latent site.

    Examples
    --------
    >>> import pyro, pyro.distributions as dist, torch, hmc
    >>> def model(y):
    ...     mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    ...     sigma = pyro.sample("sigma", dist.HalfNormal(5.0))
    ...     with pyro.plate("obs", len(y)):
    ...         pyro.sample("y", dist.Normal(mu, sigma), obs=y)
    >>> posterior = hmc.from_pyro(model, torch.tensor([1.0, 2.0, 0.5]))
    >>> posterior.names, posterior.dim
    (['mu', 'sigma'], 2)
    """
    _import_pyro()
    if not callable(model):
        raise TypeError(f"model must be a callable Pyro model, got {type(model).__name__}")
    sites = _trace_sites(model, args, kwargs)
    log_joint = _LogJoint(model, args, kwargs, sites)

    def derived(values: Values) -> dict[str, torch.Tensor]:
        return log_joint.run(values).deterministic

    def log_likelihood(values: Values) -> dict[str, torch.Tensor]:
        return log_joint.run(values).pointwise

    return Model(
        log_joint,
        sites.latent,
        derived=derived if sites.deterministic else None,
        log_likelihood=log_likelihood if sites.observed else None,
        observed_data={k: v.numpy(force=True) for k, v in sites.observed.items()},
        dims=sites.dims,
        name=getattr(model, "__name__", None),
    )
