"""Every bad argument is a ValueError or TypeError that names it, raised before sampling."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import hmc


class Counting:
    """A standard normal log density that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, q: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return -0.5 * (q**2).sum(-1)


def run(log_prob=None, **kwargs):
    options = dict(dim=2, chains=2, warmup=10, draws=10, kernel="hmc", seed=0, progress=False)
    options.update(kwargs)
    return hmc.sample(log_prob if log_prob is not None else Counting(), **options)


# ---------------------------------------------------------------------- plain arguments
BAD_ARGUMENTS = [
    ("chains", 0),
    ("chains", -1),
    ("chains", 2.5),
    ("chains", True),
    ("chains", "4"),
    ("chains", None),
    ("draws", 0),
    ("draws", -1),
    ("draws", 2.5),
    ("draws", True),
    ("warmup", -1),
    ("warmup", 2.5),
    ("warmup", True),
    ("warmup", np.float64(10.0)),
    ("kernel", "metropolis"),
    ("kernel", "NUTS!"),
    ("metric", "full"),
    ("metric", "diagonal"),
    ("metric", None),
    ("step_size", 0.0),
    ("step_size", -0.1),
    ("step_size", math.inf),
    ("step_size", math.nan),
    ("step_size", "0.1"),
    ("step_size", True),
    ("target_accept", 0.0),
    ("target_accept", 1.0),
    ("target_accept", 1.5),
    ("target_accept", -0.2),
    ("target_accept", "0.8"),
    ("target_accept", math.nan),
    ("seed", -1),
    ("seed", 2.5),
    ("seed", "1"),
    ("seed", True),
    ("seed", 2**64),  # would alias seed 0 in 64-bit keys
    ("device", "meta"),
    ("device", "no-such-device"),
    ("device", "cuda:99"),
    ("batched", 2),
    ("batched", "yes"),
    ("progress", "yes"),
    ("progress", 1),
    ("dim", 0),
    ("dim", -3),
    ("dim", 2.5),
    ("dtype", torch.int64),
    ("dtype", "float64"),
]


@pytest.mark.parametrize(("name", "value"), BAD_ARGUMENTS)
def test_bad_argument_is_named_before_any_work(name, value):
    log_prob = Counting()
    with pytest.raises((ValueError, TypeError), match=name) as info:
        run(log_prob, **{name: value})
    assert info.type in (ValueError, TypeError)
    assert log_prob.calls == 0, "the error came after log_prob was evaluated"


def test_metric_names_are_case_insensitive_like_kernel_names():
    dt = run(metric="DIAG", kernel="HMC", warmup=30)
    assert dt.attrs["metric"] == "diag"


def test_a_zero_dimensional_init_is_a_radius_like_a_number():
    for init in (0.5, np.float64(0.5), torch.tensor(0.5)):
        dt = run(init=init)
        assert np.abs(dt["posterior"]["x"].values).max() < 10


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_data_of_another_dtype_is_named_before_sampling(dtype):
    """A float64 run whose density computes in float32 (or the reverse) would run in mixed
    precision or fail inside the recorder: it is refused at the first evaluation."""
    other = torch.float32 if dtype == torch.float64 else torch.float64
    data = torch.ones(3, dtype=other)
    with pytest.raises(TypeError, match=f"log_prob returned {other} for {dtype} positions"):
        run(lambda q: -0.5 * ((q[0] - data) ** 2).sum(), dim=1, dtype=dtype)


def test_good_integer_types_are_accepted():
    dt = run(
        chains=np.int64(2), draws=np.int32(5), warmup=np.int64(0), seed=np.uint8(3), step_size=1
    )
    assert dt["posterior"]["x"].shape == (2, 5, 2)


@pytest.mark.parametrize("kernel", [object(), 42, "hmc ", None])
def test_kernel_that_is_not_a_kernel(kernel):
    log_prob = Counting()
    with pytest.raises((TypeError, ValueError), match="kernel"):
        run(log_prob, kernel=kernel)
    assert log_prob.calls == 0


def test_kernel_class_instead_of_instance():
    log_prob = Counting()
    with pytest.raises(TypeError, match="kernel"):
        run(log_prob, kernel=hmc.HMC)


def test_save_warmup_and_log_prob_types():
    with pytest.raises(TypeError, match="save_warmup"):
        run(save_warmup="yes")
    with pytest.raises(TypeError, match="log_prob"):
        hmc.sample(3.0, dim=2, progress=False)


def test_no_dim_and_no_init():
    log_prob = Counting()
    with pytest.raises(ValueError, match="dim"):
        hmc.sample(log_prob, chains=2, warmup=5, draws=5, progress=False)
    assert log_prob.calls == 0


# ---------------------------------------------------------------------- log_prob output
def wrong_shape(q):
    return -0.5 * q**2  # (D,) instead of a scalar


def not_a_tensor(q):
    return -0.5 * (q**2).sum().item()


def constant(q):
    return torch.tensor(1.0, dtype=q.dtype)


def uses_item(q):
    return torch.tensor(-0.5 * (q**2).sum().item(), dtype=q.dtype)


def detached(q):
    return (-0.5 * (q**2).sum()).detach()


def integer_valued(q):
    return torch.tensor(1)


@pytest.mark.parametrize(
    ("log_prob", "error", "match"),
    [
        (wrong_shape, ValueError, "shape"),
        (not_a_tensor, TypeError, "Tensor"),
        (constant, ValueError, "gradient"),
        (uses_item, ValueError, "gradient"),
        (detached, ValueError, "gradient"),
        (integer_valued, (TypeError, ValueError), "log_prob"),
    ],
)
def test_bad_log_prob_output(log_prob, error, match):
    calls = []

    def wrapped(q):
        calls.append(q.shape)
        return log_prob(q)

    with pytest.raises(error, match=match) as info:
        run(wrapped)
    assert "log_prob" in str(info.value)
    assert len(calls) <= 2  # found on the first evaluation, not mid-run


def test_batched_log_prob_with_wrong_shape():
    with pytest.raises(ValueError, match="shape"):
        run(lambda q: -0.5 * (q**2).sum(), batched=True)  # a scalar instead of (C,)
    with pytest.raises(ValueError, match="shape"):
        run(lambda q: -0.5 * (q**2).sum(-1, keepdim=True), batched=True)  # (C, 1)


def test_unbatched_log_prob_returning_a_batch_hints_at_batched():
    with pytest.raises(ValueError, match="batched=True"):
        run(lambda q: -0.5 * (q**2).sum(-1, keepdim=True))  # (1,) for one position


# ---------------------------------------------------------------------- init
@pytest.mark.parametrize(
    ("init", "match"),
    [
        (torch.zeros(3, dtype=torch.float64), "dim"),  # dim=2
        (torch.zeros(3, 2, dtype=torch.float64), "init"),  # chains=2
        (torch.zeros(2, 2, 2, dtype=torch.float64), "init"),
        (torch.tensor([0.0, math.nan], dtype=torch.float64), "init"),
        (torch.tensor([[0.0, 0.0], [math.inf, 0.0]], dtype=torch.float64), "init"),
        ("zeros", "init"),
        (-1.0, "radius"),
        (math.inf, "radius"),
        (math.nan, "radius"),
        (True, "init"),
    ],
)
def test_bad_init(init, match):
    log_prob = Counting()
    with pytest.raises((ValueError, TypeError), match=match):
        run(log_prob, init=init)
    assert log_prob.calls == 0


def test_init_at_zero_density_names_the_chain():
    def log_prob(q):
        return torch.where(q[..., 0] > 1.0, -torch.inf, -0.5 * (q**2).sum(-1))

    init = torch.tensor([[0.0, 0.0], [2.0, 0.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"init.*\[1\]"):
        run(log_prob, init=init)


def test_no_finite_starting_point():
    with pytest.raises(ValueError, match=r"finite starting point.*uniform\(-2, 2\)"):
        run(lambda q: -torch.inf * (q**2).sum(-1) - torch.inf, batched=True)
    with pytest.raises(ValueError, match=r"uniform\(-0.5, 0.5\)"):
        run(lambda q: -torch.inf * (q**2).sum(-1) - torch.inf, batched=True, init=0.5)


# ---------------------------------------------------------------------- dense metric memory
def test_dense_metric_too_large_fails_before_sampling():
    log_prob = Counting()
    with pytest.raises(ValueError, match="dense") as info:
        hmc.sample(
            log_prob, dim=200_000, chains=4, metric="dense", kernel="hmc", seed=0,
            batched=True, progress=False,
        )  # fmt: skip
    message = str(info.value)
    assert "GiB" in message and "diag" in message
    assert log_prob.calls <= 2  # at most the start was evaluated; no sampling


# ---------------------------------------------------------------------- raising densities
def cholesky_log_prob(q):
    """Zero density (linalg.cholesky raises) where q[0] <= 0.25."""
    half = torch.tensor(0.5, dtype=q.dtype)
    matrix = torch.stack((torch.stack((q[0], half)), torch.stack((half, torch.ones_like(half)))))
    factor = torch.linalg.cholesky(matrix)
    return -0.5 * (q**2).sum() + torch.log(torch.diagonal(factor)).sum()


@pytest.mark.parametrize("seed", [0, 6, 8, 11])
def test_a_density_raising_at_the_first_random_start_is_zero_density_there(seed):
    """Chain 0's first random start lands where log_prob raises for seeds 6, 8 and 11:
    that start is retried like any other of zero density, whatever the seed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "log_prob raised ..." once
        dt = run(cholesky_log_prob, kernel="nuts", warmup=50, draws=50, seed=seed)
    assert (dt["posterior"]["x"].values[..., 0] > 0.25).all()


def test_a_raising_user_init_is_named():
    with pytest.raises(ValueError, match=r"init for chains \[0, 1\] has zero density.*raised"):
        run(cholesky_log_prob, init=torch.tensor([-1.0, 0.0], dtype=torch.float64))


def test_a_batched_output_that_only_looks_like_a_batch_is_named():
    """``sum(0)`` returns (D,), which passes for (C,) when C == D: a one-row batch shows
    it before sampling."""
    with pytest.raises(ValueError, match=r"returned shape \(2,\); expected \(1,\)"):
        run(lambda q: -0.5 * (q**2).sum(0), batched=True)


def test_a_batched_log_prob_whose_rows_see_each_other_is_refused():
    """Centring the batch couples the chains (each one's gradient would mix in the
    others'): refused before sampling, naming the row; rows evaluated apart pass."""
    with pytest.raises(ValueError, match=r"log_prob\(q\)\[0\] depends on row 1 of q"):
        run(lambda q: -0.5 * ((q - q.mean(0)) ** 2).sum(1), batched=True)
    run(lambda q: -0.5 * (q**2).sum(1) - 0.0 * q[:, 0].clamp(max=0), batched=True)


def test_a_density_that_writes_to_its_input_is_named():
    def in_place(q):
        q.mul_(1.0)
        return -(q**2).sum()

    for batched in (False, True):
        with pytest.raises(ValueError, match="log_prob modifies its input in place"):
            run(in_place, batched=batched)


@pytest.mark.parametrize(
    "sizes", [{"draws": 10**10}, {"chains": 10**9}, {"warmup": 10**11, "save_warmup": True}]
)
def test_a_run_too_large_for_memory_is_refused_before_any_work(sizes):
    log_prob = Counting()
    with pytest.raises(ValueError, match=r"GiB available; pass store=PATH .* or run fewer"):
        run(log_prob, **sizes)
    assert log_prob.calls == 0


def test_draws_streamed_to_a_file_do_not_count_against_memory():
    """Ten billion draws of 3 coordinates do not fit in this machine's memory, but with
    store= only a chunk is held: the check passes (no run is started here)."""
    from hmc.settings import check_memory

    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="store=PATH"):
        check_memory("diag", 4, 3, 10**10, torch.float64, cpu)
    check_memory("diag", 4, 3, 10**10, torch.float64, cpu, stored=True)
    with pytest.raises(ValueError, match="GiB available"):  # the chains themselves
        check_memory("diag", 10**9, 3, 10, torch.float64, cpu, stored=True)


def test_a_half_precision_output_does_not_suggest_a_dtype_runs_cannot_use():
    with pytest.raises(TypeError, match=r"uses torch.float64$"):
        run(lambda q: (-(q**2).sum()).half())


# ---------------------------------------------------------------------- the run's output
def scalar_model(**kwargs) -> hmc.Model:
    return hmc.Model(lambda p: -(p["a"] ** 2).sum(), {"a": hmc.Param(2)}, **kwargs)


@pytest.mark.parametrize(
    ("model", "error", "match"),
    [
        (
            hmc.Model(
                lambda p: -(p["chain"] ** 2) - (p["draw"] ** 2).sum(),
                {"chain": hmc.Param(), "draw": hmc.Param(2)},
            ),
            ValueError,
            r"\['chain', 'draw'\] would vanish",
        ),
        (
            hmc.Model(
                lambda p: -(p["a"] ** 2).sum() - (p["a_dim_0"] ** 2).sum(),
                {"a": hmc.Param(2), "a_dim_0": hmc.Param(2)},
            ),
            ValueError,
            r"\['a_dim_0'\] would vanish",
        ),
        (scalar_model(derived=lambda p: {"a": p["a"]}), ValueError, "has a parameter's name"),
        (scalar_model(derived=lambda p: 3), TypeError, "derived must return a dict"),
        (scalar_model(derived=lambda p: {"b/c": p["a"]}), ValueError, "'/'"),
        (scalar_model(derived=lambda p: {"b": p["a"][5]}), IndexError, "out of bounds"),
        (scalar_model(coords={"k": ["x", "y", "z"]}, dims={"a": ["k"]}), ValueError, "k"),
        (scalar_model(dims={"a": ["k", "l"]}), ValueError, "dims"),
    ],
)
def test_the_output_is_built_from_the_initial_points_before_any_work(model, error, match):
    """What would fail when the run's DataTree is built fails at the start, with the
    error of the part at fault, after no more than the initial points' evaluations."""
    calls = [0]
    log_prob = model.log_prob

    def counted(q):
        calls[0] += 1
        return log_prob(q)

    model.log_prob = counted
    with pytest.raises(error, match=match):
        hmc.sample(model, chains=2, warmup=200, draws=200, seed=1, progress=False)
    assert calls[0] < 10  # the checks of log_prob and the initial points only


@pytest.mark.parametrize(
    ("constraint", "match"),
    [
        (torch.distributions.constraints.interval(5.0, 1.0), "lower bound 5.0 must be below"),
        (torch.distributions.constraints.interval(0.0, 0.0), "empty or a point"),
        (torch.distributions.constraints.interval(0.0, math.inf), "an upper bound that is not"),
        (torch.distributions.constraints.greater_than(-math.inf), "a lower bound that is not"),
    ],
)
def test_a_support_that_leaves_no_room_is_refused_by_param(constraint, match):
    with pytest.raises(ValueError, match=match):
        hmc.Param(2, constraint)
    hmc.Param(2, torch.distributions.constraints.interval(0.0, 1.0))  # room: accepted


def test_dims_may_not_use_the_datatrees_own_dimensions():
    with pytest.raises(ValueError, match=r"dims of 'a' use \['draw'\]"):
        hmc.Model(lambda p: -(p["a"] ** 2).sum(), {"a": hmc.Param(2)}, dims={"a": ["draw"]})


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan])
def test_adapted_from_with_an_inverse_metric_that_is_not_positive_is_refused(bad):
    """Every transition under it would diverge: refused before sampling."""
    previous = run(warmup=30, draws=5)
    previous["adaptation"]["inverse_metric"].values[1, 0] = bad
    with pytest.raises(ValueError, match="inverse metric that is not finite and positive"):
        run(warmup=0, adapted_from=previous)


def test_trajectories_and_warmups_too_long_to_run_are_refused():
    with pytest.raises(ValueError, match=r"num_steps \(1000000000\) exceeds max_steps \(1024\)"):
        hmc.HMC(num_steps=10**9)
    assert hmc.HMC(num_steps=2000, max_steps=2000).num_steps == 2000
    with pytest.raises(ValueError, match=r"warmup must be at most 1e\+09 iterations"):
        run(warmup=10**12)
