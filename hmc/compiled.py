"""The compiled energy: ``U(q)`` and its gradient for a batch of positions as one graph
built by ``torch.compile``.

What goes into the graph is everything between the positions ``(W, D)`` and the pair
``U`` ``(W,)``, ``dU/dq`` ``(W, D)``: the user's log density, the ``torch.func.vmap``
that batches a one-position function, an :class:`hmc.Model`'s constraining transforms,
priors and log-Jacobians (they are inside ``Model.log_prob``), the negation, the reverse
pass, and the replacement of a row whose value or gradient is not finite by ``U = +inf``
and a zero gradient. Nothing of it is kept between calls: no graph, no tensor.

**The reverse pass is traced into the graph.** ``torch.func.grad_and_value`` runs one
reverse pass (``torch.func`` asks ``torch.autograd.grad`` for it while the graph is
traced), so the compiled graph computes the value and the gradient in one call, with no
autograd bookkeeping at run time. Calling ``torch.autograd.grad`` at run time on a
compiled forward instead costs autograd's engine and the compiled backward's wrapper on
every evaluation: on the eight schools with 4 chains, 178 microseconds against 41 for the
traced pass (forward alone: 34). The eager energy module keeps its single
``torch.autograd.grad``.

**One batch shape, one graph per energy.** The graph is compiled for one width ``W``, the
widest batch seen (in ``hmc.sample``, all its chains, at the initial points). A narrower
batch (the chains still busy in a tick, a ragged static HMC step) is padded with copies of
its first row and the padding is dropped from the result: a finite position evaluated
once more and ignored. A wider batch compiles again for the new width. ``dynamic=False``
keeps torch from guessing a symbolic batch size, so one run compiles once per dtype and
device; each energy has a code object of its own, so the number of models compiled in a
process is not bounded by torch's recompile limit.

**Failure is not an error.** When compiling fails (no C++ compiler, an operation the
compiler cannot handle) and the eager evaluation of the same positions works, the energy
warns once, saying why, and is evaluated eagerly from then on. Graph breaks are allowed
(``fullgraph=False``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils._pytree

__all__ = ["RECOMPILED", "CompiledEnergy", "CompiledLoop", "compiled_graphs"]

Energy = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

#: Loggers that report, at warning level, things that are no fault of a CPU user's
#: (a CUDA build of torch that finds no CUDA runtime while it looks for a compiler).
_QUIET_LOGGERS = ("torch.utils.cpp_extension",)


class CompiledEnergy:
    """``torch.compile`` of a log density's energy and gradient at one batch width.

    Parameters
    ----------
    log_prob : the user's log density, ``(D,) -> ()`` or, with ``batched``,
        ``(C, D) -> (C,)``.
    batched : whether ``log_prob`` takes a batch of positions.
    width : the batch width to compile for (a wider batch later widens it).
    mode : ``torch.compile``'s mode; ``None`` for its default. ``"reduce-overhead"`` (CUDA
        graphs) returns tensors that the next call overwrites, so they are copied.

    Attributes
    ----------
    width : the batch width the graph is compiled for.
    seconds : wall time of the calls that compiled (the first call at each width).
    failure : why compiling failed, or why the graph is not to be used any more
        (:data:`RECOMPILED`), or None.
    """

    def __init__(
        self, log_prob: Callable, batched: bool, width: int, mode: str | None = None
    ) -> None:
        self.width = width
        self.seconds = 0.0
        self.failure: str | None = None
        self._compiled_width = 0  # the width of the graph torch holds (0: none yet)
        self._copy_outputs = mode == "reduce-overhead"
        self._function = torch.compile(
            _own_code(energy_function(log_prob, batched)), dynamic=False, fullgraph=False, mode=mode
        )

    def __call__(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``U`` ``(B,)`` and ``dU/dq`` ``(B, D)`` at positions ``q`` ``(B, D)``, with
        ``U = +inf`` and a zero gradient where either is not finite; ``q`` is padded to
        :attr:`width` with copies of its first row, and the padding dropped. Raises what
        ``log_prob`` raises (a call that compiles may raise the compiler's error:
        :meth:`compile` tells the two apart)."""
        rows = q.shape[0]
        self.width = width = max(self.width, rows)
        # a copy either way: log_prob never gets the caller's memory (hmc.potential)
        x = q.clone() if rows == width else torch.cat((q, q[:1].expand(width - rows, -1)))
        if width == self._compiled_width:
            before = compiled_graphs()
            U, grad = self._function(x)
            if compiled_graphs() != before:  # torch compiled again for the same inputs
                self.failure = RECOMPILED
        else:
            U, grad = self._compile(x)
        if self._copy_outputs:
            U, grad = U.clone(), grad.clone()
        return (U, grad) if rows == width else (U[:rows], grad[:rows])

    def compile(self, q: torch.Tensor, eager: Energy) -> bool:
        """Compile by evaluating ``q`` ``(B, D)`` once. If that fails and ``eager(q)``
        works, record why in :attr:`failure`, warn once and return False; if both fail,
        raise the eager error (the density's own trouble at ``q``)."""
        try:
            self(q)
        except Exception as error:  # any compiler failure means eager
            eager(q)  # raises when the density itself fails here
            self.failure = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}"
            warnings.warn(
                f"could not compile log_prob ({self.failure}); evaluating it eagerly. "
                "Pass compile=False to skip the attempt.",
                RuntimeWarning,
                stacklevel=3,
            )
            return False
        return True

    def _compile(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The first call at the width of ``x``, which compiles (timed, torch's log noise
        and its own deprecation warnings kept from the user)."""
        started = time.perf_counter()
        try:
            with _quiet(_QUIET_LOGGERS), warnings.catch_warnings():
                warnings.filterwarnings("ignore", category=FutureWarning, module="torch")
                U, grad = self._function(x)
        finally:
            self.seconds += time.perf_counter() - started
        self._compiled_width = x.shape[0]
        return U, grad


class CompiledLoop:
    """``torch.compile`` of a whole computation over the energy, its loop of evaluations
    inside: a static HMC transition, every leapfrog step in torch's ``while_loop``.

    ``function(energy, *tensors)`` is written in torch operations; ``energy`` is
    :func:`energy_function` of the log density, so the user's density, its reverse pass,
    the leapfrog steps, the Metropolis test and the statistics become one graph
    (``fullgraph=True``: a graph break is a failure here, not a slower graph). On the CPU
    inductor's C++ wrapper runs the loop, so no step returns to Python.

    The first call compiles and checks, on the tensors ``probe(tensors)`` (a transition of
    one leapfrog step: short enough that rounding is not amplified): the compiled result is
    compared with ``function`` run eagerly (a plain Python loop, no tracing), within
    :data:`LOOP_RTOL` of the dtype, as a guard against a compiler that computes a wrong
    gradient without an error. A compile that raises (whether the compiler or the density
    at those points) or a mismatch is recorded in :attr:`failure`, and every call from
    then on returns None (the caller runs its eager path). A later call that raises (the
    density's own trouble, such as a failed Cholesky) returns None too, for that call
    alone.

    Attributes
    ----------
    seconds : wall time of the calls that compiled.
    failure : why the compiled loop is not used, or None.
    checked : whether the first call's comparison with eager has been made.
    """

    def __init__(
        self,
        function: Callable,
        probe: Callable[[tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]],
        log_prob: Callable,
        batched: bool,
        device: str,
    ) -> None:
        self.seconds = 0.0
        self.failure: str | None = None
        self.checked = False
        self._function, self._probe = function, probe
        self._energy = energy_function(log_prob, batched)
        energy, loop = self._energy, function

        def graph(*tensors: torch.Tensor) -> Any:
            return loop(energy, *tensors)

        options = {"cpp_wrapper": True} if device == "cpu" else None
        self._graph = torch.compile(
            _own_code(graph), fullgraph=True, dynamic=False, options=options
        )

    def __call__(self, *tensors: torch.Tensor) -> Any:
        """``function(energy, *tensors)`` through the graph, or None where it is not to
        be used (see the class docstring)."""
        if not self.checked and self.failure is None:
            self._check(self._probe(tensors))
        if self.failure is not None:
            return None
        before = compiled_graphs()
        try:
            result = self._graph(*tensors)
        except Exception:  # the density raised: this call runs eagerly
            return None
        if compiled_graphs() != before:  # torch compiled again for the same shapes
            self.failure = RECOMPILED
        return result

    def _check(self, tensors: tuple[torch.Tensor, ...]) -> None:
        """Compile on ``tensors`` and compare with the eager result there."""
        started = time.perf_counter()
        try:
            with _quiet(_QUIET_LOGGERS), warnings.catch_warnings():
                warnings.filterwarnings("ignore", category=FutureWarning, module="torch")
                result = self._graph(*tensors)
        except Exception as error:  # the compiler's, or the density's at these points
            self.failure = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}"
            return
        finally:
            self.seconds += time.perf_counter() - started
        try:
            eager = self._function(self._energy, *tensors)
        except Exception:  # the density raised at these points: check at the next call
            return
        self.checked = True
        mismatch = _mismatch(result, eager)
        if mismatch is not None:
            self.failure = f"its result differs from the eager one by {mismatch:.1e} relative"


#: the relative difference between a compiled loop's first result and the eager one above
#: which the compiled loop is not used, by dtype
LOOP_RTOL = {torch.float64: 1e-8, torch.float32: 1e-3}


def _mismatch(compiled: Any, eager: Any) -> float | None:
    """The largest relative difference between two results (pytrees of tensors) where it
    exceeds :data:`LOOP_RTOL`, else None. Floating tensors are compared relative to their
    largest finite magnitude; integer and boolean ones must be equal."""
    worst = 0.0
    for a, b in zip(
        torch.utils._pytree.tree_leaves(compiled), torch.utils._pytree.tree_leaves(eager),
        strict=True,
    ):  # fmt: skip
        if not a.dtype.is_floating_point:
            if not torch.equal(a, b):
                return math.inf
            continue
        finite = torch.isfinite(b)
        if not torch.equal(finite, torch.isfinite(a)):
            return math.inf
        if not finite.any():
            continue
        scale = float(b[finite].abs().max()) or 1.0
        difference = float((a[finite] - b[finite]).abs().max()) / scale
        if difference > LOOP_RTOL[a.dtype]:
            worst = max(worst, difference)
    return worst or None


#: why a graph that torch compiled again for inputs of the same shape is given up: its
#: guards failed on something other than the positions, which is Python state that
#: ``log_prob`` reads or writes (a call counter, a list it appends to), and every later
#: call would compile again (up to torch's recompile limit, then run eagerly unannounced)
RECOMPILED = (
    "torch compiled log_prob again for positions of the same shape: it reads or writes "
    "Python state (a call counter, a list it appends to), which changes between calls"
)


def compiled_graphs() -> int:
    """Graphs dynamo has captured in this process (its own counter; a ``while_loop``'s
    traced body counts too)."""
    import torch._dynamo.utils  # here: importing dynamo imports SymPy, 1 s

    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def energy_function(log_prob: Callable, batched: bool) -> Energy:
    """The eager function that is compiled: ``(W, D)`` positions to ``U`` ``(W,)`` and
    ``dU/dq`` ``(W, D)``, non-finite rows replaced by ``+inf`` and zeros."""
    if batched:

        def total_energy(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            U = -log_prob(x)
            return U.sum(), U

        grad_and_total = torch.func.grad_and_value(total_energy, has_aux=True)

        def energy(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            grad, (_, U) = grad_and_total(x)
            return _finite(U, grad)

        return energy

    batch = torch.func.vmap(torch.func.grad_and_value(lambda q: -log_prob(q)))

    def energy(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        grad, U = batch(x)
        return _finite(U, grad)

    return energy


def _own_code(function: Callable) -> Callable:
    """``function`` with a code object of its own. torch keeps compiled graphs per code
    object and compiles one code object at most ``recompile_limit`` (8) times: without a
    copy, every energy made in a process would share ``energy``'s code, and the ninth model
    sampled would fall back to eager with torch's recompile warning."""
    return types.FunctionType(
        function.__code__.replace(),
        function.__globals__,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )


def _finite(U: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    finite = torch.isfinite(U + grad.sum(-1))
    return torch.where(finite, U, torch.inf), torch.where(finite.unsqueeze(-1), grad, 0.0)


@contextlib.contextmanager
def _quiet(names: tuple[str, ...]) -> Iterator[None]:
    """Raise the given loggers to error level for a block."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
