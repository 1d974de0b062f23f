"""Property-based tests: careless and hostile inputs, drawn at random by hypothesis.

Every call of :func:`hmc.sample`, :class:`hmc.Potential` and :class:`hmc.Model` with
random shapes, dtypes, values and arguments either succeeds with finite output or raises
one of the documented errors (``ValueError`` or ``TypeError``, or ``KeyError`` for a
model reading an undeclared name) before sampling; never a hang, a NaN in the output or
another exception from deep inside torch. The examples are derandomised (the same ones
every run) and the runs tiny.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch.distributions import constraints  # noqa: E402

import hmc  # noqa: E402

DOCUMENTED = (ValueError, TypeError)
SETTINGS = settings(max_examples=100, deadline=None, derandomize=True, database=None)


def gaussian(q):
    return -0.5 * (q**2).sum(-1)


def raises_on_the_right(q):  # a rejection where the first coordinate is positive
    if bool((q[..., 0] > 0).any()):
        raise ValueError("not defined here")
    return gaussian(q)


DENSITIES = {
    "gaussian": gaussian,
    "nan": lambda q: gaussian(q) * torch.nan,
    "+inf": lambda q: gaussian(q) * 0 + torch.inf,
    "-inf": lambda q: gaussian(q) * 0 - torch.inf,
    "int": lambda q: gaussian(q).round().to(torch.int64),
    "bool": lambda q: gaussian(q) > -1,
    "float16": lambda q: gaussian(q).to(torch.float16),
    "wrong shape": lambda q: q.sum(-1, keepdim=True).expand(*q.shape[:-1], 2),
    "raises on the right": raises_on_the_right,
    "in place": lambda q: gaussian(q.mul_(1.0)),
    "not a tensor": lambda q: 1.0,
}

ANY_NUMBER = st.one_of(
    st.integers(-3, 6),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.just(10**30),
    st.just("3"),
)


def finite_output(dt) -> None:
    """Finite draws; statistics without NaN (an energy error is +inf where a trajectory
    ran into a point of zero density: a divergence, not a failure)."""
    for name, values in dt["posterior"].data_vars.items():
        assert np.isfinite(values.values).all(), f"posterior/{name} is not finite"
    for name, values in dt["sample_stats"].data_vars.items():
        if values.dtype.kind == "f":
            assert not np.isnan(values.values).any(), f"sample_stats/{name} has NaN"


#: each argument of hmc.sample: valid values, and careless ones (one argument at most is
#: careless in a call, so that many calls run)
VALID = {
    "density": st.sampled_from(["gaussian", "raises on the right"]),
    "dim": st.integers(1, 4),
    "batched": st.booleans(),
    "chains": st.integers(1, 3),
    "warmup": st.integers(0, 6),
    "draws": st.integers(1, 6),
    "seed": st.one_of(st.none(), st.integers(0, 2**64 - 1)),
    "dtype": st.sampled_from([torch.float64, torch.float32]),
    "target_accept": st.one_of(st.none(), st.floats(0.05, 0.95)),
    "kernel": st.sampled_from(["nuts", "hmc", "chees", "NUTS"]),
    "adapt": st.sampled_from([None, "stan", "ensemble"]),
}
CARELESS = {
    "density": st.sampled_from(sorted(DENSITIES)),
    "dim": st.sampled_from([0, -1, 2.0, "2", True]),
    "batched": st.sampled_from([1, "yes", None]),
    "chains": ANY_NUMBER,
    "warmup": ANY_NUMBER,
    "draws": ANY_NUMBER,
    "seed": st.sampled_from([-1, 2**64, "1", 1.5, True]),
    "dtype": st.sampled_from([torch.float16, torch.int64, torch.bool, "float64"]),
    "target_accept": st.one_of(st.floats(-1, 2).filter(lambda x: not 0 < x < 1), st.just(1.0)),
    "kernel": st.sampled_from(["leapfrog", 3, None]),
    "adapt": st.sampled_from(["pooled", 1]),
}


@SETTINGS
@given(data=st.data(), careless=st.one_of(st.none(), st.sampled_from(sorted(CARELESS))))
def test_sample_succeeds_with_finite_draws_or_raises_a_documented_error(data, careless):
    options = {
        name: data.draw(CARELESS[name] if name == careless else valid, label=name)
        for name, valid in VALID.items()
    }
    density = DENSITIES[options.pop("density")]
    for name in ("warmup", "draws"):  # kept tiny
        if type(options[name]) is int and options[name] > 6:
            options[name] = 6
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            dt = hmc.sample(density, progress=False, compile=False, **options)
        except DOCUMENTED as error:
            event(f"refused: {type(error).__name__}")
            return
    event("sampled")
    finite_output(dt)


@SETTINGS
@given(
    density=st.sampled_from(sorted(DENSITIES)),
    batched=st.booleans(),
    shape=st.lists(st.integers(0, 3), min_size=0, max_size=3),
    dtype=st.sampled_from([torch.float64, torch.float32, torch.float16, torch.int64]),
    fill=st.sampled_from([0.0, 1.5, -2.0, float("nan"), float("inf")]),
    requires_grad=st.booleans(),
)
def test_potential_gives_finite_or_infinite_energies_or_a_documented_error(
    density, batched, shape, dtype, fill, requires_grad
):
    q = torch.full(shape, fill, dtype=dtype) if dtype.is_floating_point else torch.zeros(shape)
    if requires_grad and q.dtype.is_floating_point:
        q.requires_grad_(True)
    try:
        potential = hmc.Potential(DENSITIES[density], batched=batched, compile=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value, grad = potential.value_and_grad(q)
    except DOCUMENTED as error:
        event(f"refused: {type(error).__name__}")
        return
    event("evaluated")
    # an energy is a number or +inf (zero density); a gradient is finite where the
    # energy is, and nothing is NaN
    assert not torch.isnan(value).any()
    assert not torch.isnan(grad[torch.isfinite(value)]).any()
    assert not value.requires_grad and not grad.requires_grad


SUPPORTS = [
    constraints.real,
    constraints.positive,
    constraints.unit_interval,
    constraints.interval(-1.0, 3.0),
    constraints.simplex,
    constraints.lower_cholesky,
    constraints.positive_definite,
    constraints.dependent,
    constraints.integer_interval(0, 3),
]


@SETTINGS
@given(
    support=st.sampled_from(range(len(SUPPORTS))),
    shape=st.lists(st.integers(0, 3), min_size=0, max_size=2),
    init=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    chains=st.integers(1, 2),
    reads=st.sampled_from(["x", "y", "nothing"]),
)
def test_model_samples_finite_draws_or_raises_a_documented_error(
    support, shape, init, chains, reads
):
    constraint = SUPPORTS[support]

    def log_prob(p):
        if reads == "nothing":
            return torch.zeros(())
        return -0.5 * (p[reads].double() ** 2).sum()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model = hmc.Model(log_prob, params={"x": hmc.Param(tuple(shape), constraint)})
            dt = hmc.sample(
                model,
                chains=chains,
                warmup=4,
                draws=4,
                seed=1,
                progress=False,
                compile=False,
                init=None
                if init is None
                else {"x": torch.full(tuple(shape), init, dtype=torch.float64)},
            )
        except (*DOCUMENTED, KeyError) as error:
            event(f"refused: {type(error).__name__}")
            return
    event("sampled")
    finite_output(dt)


#: names a careless user might give a variable or a dimension: ArviZ's own dimensions,
#: the default dimension names, separators of DataTree paths, empty, non-ASCII
NAMES = st.one_of(
    st.sampled_from(["a", "b", "chain", "draw", "a_dim_0", "b_dim_0", "x/y", "", "école", "a.b"]),
    st.text(alphabet="ab_/. 0", min_size=0, max_size=4),
)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(
    names=st.lists(NAMES, min_size=1, max_size=3),
    shapes=st.lists(st.lists(st.integers(1, 3), max_size=2), min_size=3, max_size=3),
    derived_name=st.one_of(st.none(), NAMES),
    labels=st.one_of(st.none(), st.lists(NAMES, max_size=3)),
    coord_length=st.integers(0, 4),
)
def test_output_settings_keep_every_variable_or_are_refused_before_sampling(
    names, shapes, derived_name, labels, coord_length
):
    """Random names, derived quantities, dims and coords: either every declared variable is
    in the posterior with its shape, its dims and coords, or a documented error comes
    before sampling (``log_prob`` evaluated only at the initial points)."""
    params = {name: hmc.Param(tuple(shape)) for name, shape in zip(names, shapes, strict=False)}
    first = next(iter(params))
    calls = {"n": 0}

    def log_prob(p):
        calls["n"] += 1
        return sum(-0.5 * (value**2).sum() for value in p.values())

    derived = None if derived_name is None else (lambda p: {derived_name: 2 * p[first]})
    dims = {} if labels is None else {first: labels}
    coords = {labels[0]: list(range(coord_length))} if labels else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model = hmc.Model(log_prob, params, derived=derived, dims=dims, coords=coords)
            dt = hmc.sample(
                model, chains=1, warmup=10, draws=10, kernel=hmc.HMC(num_steps=3), seed=1,
                progress=False, compile=False,
            )  # fmt: skip
        except (*DOCUMENTED, KeyError) as error:
            event(f"refused: {type(error).__name__}")
            assert calls["n"] <= 10, f"refused after {calls['n']} evaluations: {error}"
            return
    event("sampled")
    posterior = dt["posterior"]
    for name, param in params.items():
        assert posterior[name].shape == (1, 10, *param.shape), name
    if derived_name is not None:
        assert posterior[derived_name].shape == posterior[first].shape
    if labels:
        assert list(posterior[first].dims[2:]) == labels
        if len(labels) and coord_length == posterior[first].shape[2]:
            assert posterior[first][labels[0]].values.tolist() == list(range(coord_length))
