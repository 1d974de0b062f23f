"""The energy module: potential energy U(q) = -log p(q) and its gradient.

Every evaluation runs the user's log density once on the batch and calls
``torch.autograd.grad`` once: no ``retain_graph``, no ``create_graph``, no ``.backward()``,
no ``.data``. The returned tensors are detached, so no graph outlives a call.

A log density may be written for one position ``(D,) -> ()``; it is batched over chains
with ``torch.func.vmap`` (called directly when there is a single chain, which is cheaper),
and falls back to a loop over rows, with one warning, when vmap cannot run it. Users who
can write ``(C, D) -> (C,)`` themselves pass ``batched=True``.

``log_prob`` always receives a copy of the positions, never the sampler's own memory: a
density that writes into its input where autograd cannot see it (under ``torch.no_grad``)
changes its own copy only, not the chains' positions.

Numerical trouble never escapes as NaN: a row whose value or gradient is not finite gets
``U = +inf`` and a zero gradient, which the kernels turn into a rejection or a divergence.
A log density that raises in the middle of a run (a failed Cholesky, say) is evaluated row
by row and the rows that raise get ``U = +inf`` too (with one warning naming the error).

The gradient of ``U`` is the negated gradient of ``log p`` (of its sum over the rows when
batched), a new tensor or array that owns its memory: the integrators write into rows of
it. Negating is exact. Differentiating ``log p`` with a cotangent of ``-1`` per row
instead would save the sum and the negation, a few microseconds, but torch's handling of
an explicit cotangent imports SymPy at a process's first gradient, half a second, which is
most of the start-up of a short run.

``compile=`` evaluates the energy through :class:`hmc.compiled.CompiledEnergy`, one graph
for value and gradient built by ``torch.compile`` (that module says what is in it and why
its reverse pass is traced rather than asked of ``autograd.grad`` at run time). ``True``
compiles at the first evaluation; ``"auto"`` (the default) evaluates eagerly and compiles
at the :data:`AUTO_COMPILE_CALLS`-th evaluation: a loop that long has spent about as long
on eager gradients as compiling takes. The switch is decided by counting, never by timing,
so a seeded loop gives the same numbers on a fast machine and a slow one.

A kernel compiles more than the energy: with ``compiled_loop="transition"`` (static HMC,
ChEES) its whole transition, every leapfrog step, the Metropolis test and the statistics,
and with ``compiled_loop="trees"`` (NUTS) every chain's whole tree, run as one graph
through :meth:`Potential.loop` (:class:`hmc.compiled.CompiledLoop`), under the same
``compile`` rule, and the energy alone is never compiled (its few evaluations outside
transitions, at the initial points and in the step-size search, stay eager).
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import torch

from hmc._torch_compat import distribution_validation_off, validation_enabled
from hmc.compiled import RECOMPILED, CompiledEnergy, CompiledLoop
from hmc.memo import MemoCache

#: the dtypes a run may sample in
_DTYPES = (torch.float32, torch.float64)

__all__ = ["AUTO_COMPILE_CALLS", "COMPILE_CHOICES", "Potential", "compile_choice"]

LogProb = Callable[[torch.Tensor], torch.Tensor]

#: Evaluation calls after which ``compile="auto"`` compiles where no run has decided
#: (:meth:`Potential.decide_compile`): at a typical 500 microseconds per eager evaluation,
#: about the 5 s compiling a posteriordb model takes on a 2-core CPU.
AUTO_COMPILE_CALLS = 10_000
COMPILE_CHOICES = (True, False, "auto")
#: what a kernel compiles whole with the energy (:class:`Potential`'s ``compiled_loop``)
COMPILED_LOOPS = (None, "transition", "trees")


def compile_choice(value: Any) -> bool | str:
    """``value`` as one of :data:`COMPILE_CHOICES` (True and False themselves, not 1 and
    0; any string equal to ``"auto"``, such as one read back from a checkpoint); raises
    naming ``compile`` otherwise."""
    if value is True or value is False or (isinstance(value, str) and value == "auto"):
        return value if isinstance(value, bool) else "auto"
    raise ValueError(f"compile must be True, False or 'auto', got {value!r}")


#: What :meth:`Potential.decide_compile` expects compiling to cost, in seconds, and the
#: least speed-up of the evaluations it expects from it: the energy's graph (cold, and
#: with torch's on-disk cache, which holds it across processes), a static kernel's whole
#: transition and NUTS's trees (torch caches no ``while_loop`` graph on disk, so always
#: cold). The low ends of what the built-in posteriors measure on a 2-core CPU
#: (``benchmarks/RESULTS.md``): energy 12-36 s cold, 3-7 s warm, 3.2-5.9 times faster;
#: transitions 4-8 s, 10-29 times faster; NUTS's trees 17-20 s (up to 60 s on a machine
#: loaded threefold), 7 times faster on the non-centred eight schools at 4 chains.
COMPILE_COST = {"energy": 15.0, "energy, cached": 6.0, "transition": 7.0, "trees": 20.0}
COMPILED_SPEEDUP = {"energy": 3.0, "transition": 9.0, "trees": 3.0}


class Potential:
    """Potential energy and gradient of a log density, batched over chains.

    Parameters
    ----------
    log_prob : callable
        ``log_prob(q)`` with ``q`` of shape ``(D,)`` returning a 0-d tensor, or with
        ``batched=True``, ``q`` of shape ``(C, D)`` returning ``(C,)``.
    batched : bool
        Whether ``log_prob`` already takes a batch of positions.
    cache : MemoCache, True or None
        A position-keyed memo cache (``True`` makes one of the default size).
    compile : True, False or "auto"
        Evaluate through a compiled graph (see the module docstring): from the first
        evaluation, never, or from the :data:`AUTO_COMPILE_CALLS`-th.
    reduce : callable, optional
        ``reduce(U, grad) -> (U, grad)`` applied to every evaluation's result (arrays of
        the kind of ``q``, after the non-finite rows are set): a sum over the processes of
        a group for a likelihood over sharded data (:class:`hmc.distributed.ShardedPotential`).
    compiled_loop : "transition", "trees" or None
        What the kernel the energy serves compiles whole with it (:meth:`loop`): a static
        transition, NUTS's trees, or nothing (None: the energy compiles alone); with a
        loop (and no memo cache or ``reduce``) the energy alone is never compiled.

    Attributes
    ----------
    evaluations : int
        Rows whose value and gradient were computed by running ``log_prob`` (cache hits
        are not counted).
    compiled : bool
        Whether evaluations now run through the compiled graph.
    compile_seconds : float
        Wall time spent compiling.
    compile_note : str or None
        Why the energy is not compiled although asked to be (the compiler's error), or
        None.
    compile_decision : str or None
        How ``compile="auto"`` was settled for a run (:meth:`decide_compile`), or None.
    on_compile : callable or None
        Called with True when compiling starts and False when it ends (a progress bar's
        hook).

    Examples
    --------
    >>> potential = Potential(lambda q: -0.5 * (q**2).sum())
    >>> U, grad = potential.value_and_grad(torch.ones(4, 2))
    >>> U.shape, grad.shape
    (torch.Size([4]), torch.Size([4, 2]))
    """

    def __init__(
        self,
        log_prob: LogProb,
        *,
        batched: bool = False,
        cache: MemoCache | bool | None = None,
        compile: bool | str = "auto",
        reduce: Callable[[Any, Any], tuple[Any, Any]] | None = None,
        compiled_loop: str | None = None,
    ) -> None:
        if not callable(log_prob):
            raise TypeError(f"log_prob must be callable, got {type(log_prob).__name__}")
        if cache is True:
            cache = MemoCache()
        elif cache is False:
            cache = None
        if cache is not None and not isinstance(cache, MemoCache):
            raise TypeError(f"cache must be a MemoCache, True or None, got {cache!r}")
        self.log_prob = log_prob
        self.reduce = reduce
        self.batched = bool(batched)
        self.cache: MemoCache | None = cache
        self.evaluations = 0
        self._use_vmap = True
        self._warned_raise = False
        self._checked = False
        self.compiled = False
        self.compile_seconds = 0.0
        self.compile_note: str | None = None
        self.on_compile: Callable[[bool], None] | None = None
        self._compile = compile_choice(compile)
        self._graph: CompiledEnergy | None = None
        if compiled_loop not in COMPILED_LOOPS:
            raise ValueError(
                f"compiled_loop must be one of {COMPILED_LOOPS}, got {compiled_loop!r}"
            )
        self.compiled_loop = compiled_loop
        self._loops: dict[Hashable, CompiledLoop] = {}
        self._calls = 0
        self._eager_seconds = 0.0
        self.compile_decision: str | None = None
        self._widest = 0

    # ------------------------------------------------------------------ public API
    def value_and_grad[A: (torch.Tensor, np.ndarray)](self, q: A) -> tuple[A, A]:
        """Potential energy and its gradient.

        Parameters
        ----------
        q : ``(C, D)`` positions, or one position ``(D,)``: a tensor, or a NumPy array
            (the CPU engine; ``log_prob`` still receives a tensor sharing its memory).

        Returns
        -------
        U : ``(C,)`` (or 0-d) potential energies, ``+inf`` where not finite.
        grad : ``(C, D)`` (or ``(D,)``) gradients of U, zero where U is ``+inf``.
        Arrays of the same kind as ``q``.
        """
        if q.ndim not in (1, 2) or not q.shape[-1]:
            raise ValueError(f"q must have shape (C, D) or (D,) with D >= 1, got {tuple(q.shape)}")
        if not (q.dtype.kind == "f" if isinstance(q, np.ndarray) else q.dtype.is_floating_point):
            raise TypeError(f"q must hold floating-point positions, got {q.dtype}")
        if q.ndim == 2 and not q.shape[0]:  # no positions: nothing to evaluate
            empty = q if isinstance(q, np.ndarray) else q.detach()
            return empty[:, 0] * 0, empty * 0
        if not self._checked:  # the first call names a wrong output (later calls trust it)
            self.check(torch.as_tensor(q).reshape(-1, q.shape[-1]))
        U, grad = self._compiled_or_eager(q)
        return (U, grad) if self.reduce is None else self.reduce(U, grad)

    def _compiled_or_eager[A: (torch.Tensor, np.ndarray)](self, q: A) -> tuple[A, A]:
        """This process's value and gradient, through the compiled graph once ``compile``
        says so."""
        if self._compile is False:
            return self._value_and_grad(q)
        if self._loop_runs:  # counted towards compile="auto"; loops compile, not this
            self._calls += 1
            return self._timed(q)
        if q.ndim == 2:
            self._widest = max(self._widest, q.shape[0])
        if self._compile == "auto":
            self._calls += 1
            if self._calls < AUTO_COMPILE_CALLS:
                return self._timed(q)
        if not self.compiled:
            self._compile_now(q)
        return self._value_and_grad(q)

    def _timed[A: (torch.Tensor, np.ndarray)](self, q: A) -> tuple[A, A]:
        """An eager evaluation, its wall time added to the eager seconds
        :meth:`decide_compile` weighs."""
        started = time.perf_counter()
        try:
            return self._value_and_grad(q)
        finally:
            self._eager_seconds += time.perf_counter() - started

    def decide_compile(self, done: int, left: int) -> bool:
        """Settle ``compile="auto"`` for the rest of a run from what its eager evaluations
        cost: ``done`` iterations (of all chains together) spent the measured eager
        seconds, so the ``left`` ones are expected to spend ``left / done`` times as
        much; compiling pays where that, less its expected share once compiled
        (:data:`COMPILED_SPEEDUP`), exceeds what compiling is expected to cost
        (:data:`COMPILE_COST`). The energy then compiles at its next evaluation (a
        kernel's loop at its next call); otherwise it stays eager
        for the run. The figures and the outcome go to :attr:`compile_decision`. Returns
        whether it compiles; a Potential that is not ``"auto"`` changes nothing."""
        if self._compile != "auto":
            return bool(self._compile)
        what = self.compiled_loop if self._loop_runs else "energy"
        expected = self._eager_seconds / max(done, 1) * left
        saving = expected * (1 - 1 / COMPILED_SPEEDUP[what])
        cost = COMPILE_COST[what]
        if what == "energy" and saving > COMPILE_COST["energy, cached"] and _cache_used():
            cost = COMPILE_COST["energy, cached"]  # (a look at the cache imports inductor)
        self._compile = saving > cost
        self.compile_decision = (
            f"{'compiled' if self._compile else 'eager'}: {left} iterations left, expected "
            f"to spend {expected:.1f} s in eager evaluations ({self._eager_seconds:.2f} s "
            f"over {done}), compiling to save {saving:.1f} s for about {cost:.0f} s"
        )
        return self._compile

    def _value_and_grad[A: (torch.Tensor, np.ndarray)](self, q: A) -> tuple[A, A]:
        if isinstance(q, np.ndarray):
            if q.ndim != 2:
                U, grad = self._value_and_grad(torch.from_numpy(q))
                return U.numpy(), grad.numpy()
            return self._value_and_grad_arrays(q)
        if q.dim() == 1:
            U, grad = self._value_and_grad(q.unsqueeze(0))
            return U[0], grad[0]
        if q.dim() != 2:
            raise ValueError(f"q must have shape (C, D) or (D,), got {tuple(q.shape)}")
        if self.cache is None:
            return self._evaluate(q)
        return self._evaluate_cached(q)

    def _value_and_grad_arrays(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`value_and_grad` for NumPy positions ``q`` ``(C, D)``, returning NumPy
        ``U`` ``(C,)`` and ``grad`` ``(C, D)`` (the NumPy engine's path).

        The contract is the same (one run of ``log_prob``, one ``autograd.grad``, counted;
        ``U = +inf`` and a zero gradient where not finite or where ``log_prob`` raises).
        A batched density, or a single row of an unbatched one, takes the shortest path
        there is when uncached: the positions become a leaf (a copy), ``log_p``
        itself is differentiated (its sum, when batched) and both are negated and checked
        in NumPy, so no tensor operation runs beyond the user's function and its backward
        pass.
        """
        if self.cache is not None or self.compiled or not (self.batched or q.shape[0] == 1):
            U, grad = self._value_and_grad(torch.from_numpy(q))
            return U.numpy(), grad.numpy()
        if validation_enabled():  # called outside a sampler run
            with distribution_validation_off():
                return self._value_and_grad_arrays(q)
        try:
            x = torch.tensor(q if self.batched else q[0]).requires_grad_(True)  # a copy
            log_p = self.log_prob(x)
            (grad,) = torch.autograd.grad(log_p.sum() if self.batched else log_p, x)
        except (RuntimeError, ValueError, ArithmeticError) as error:
            if q.shape[0] > 1:  # find the rows that raise, one at a time
                U, grad = self._evaluate_rows(torch.from_numpy(q))
                return U.numpy(), grad.numpy()
            self._warn_raise(error)
            self.evaluations += 1
            return np.full(1, np.inf, dtype=q.dtype), np.zeros_like(q)
        self.evaluations += q.shape[0]
        if self.batched:
            U = -log_p.detach().numpy().reshape(q.shape[0])
            total = np.add.reduce(U)
        else:  # one row: its value as a float, without a detached copy of the tensor
            total = -log_p.item()
            U = np.array([total], dtype=q.dtype)
        g = np.negative(grad.numpy()).reshape(q.shape)
        if not math.isfinite(total + np.add.reduce(g, None)):  # a NaN or an infinity
            finite = np.isfinite(U + g.sum(-1))
            U = np.where(finite, U, np.inf)
            g = np.where(finite[:, None], g, 0.0)
        return U, g

    @property
    def _loop_runs(self) -> bool:
        """Whether the kernel's loop compiles with the energy (a ``compiled_loop``, no memo
        cache, no ``reduce``); otherwise the energy compiles alone."""
        return bool(self.compiled_loop) and not self.cache and self.reduce is None

    @property
    def compiles_loops(self) -> bool:
        """Whether :meth:`loop` would run a compiled graph now (a ``compiled_loop``, compiling by
        the ``compile`` rule, no memo cache, no ``reduce``): a caller checks this before
        preparing a loop's tensors."""
        if not self._loop_runs or self._compile is False:
            return False
        return not (self._compile == "auto" and self._calls < AUTO_COMPILE_CALLS)

    def loop(
        self,
        key: Hashable,
        function: Callable[..., Any],
        probe: Callable[[tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]],
        tensors: tuple[torch.Tensor, ...],
        rows: int,
    ) -> Any:
        """``function(energy, *tensors)`` through its compiled graph, or None where this
        call is to run eagerly (the caller's own path).

        ``function`` is written in torch operations over ``energy``, ``(W, D) -> (U (W,),
        grad (W, D))`` (:class:`hmc.compiled.CompiledLoop`, compiled and checked at its
        first call on ``probe(tensors)``); ``key`` names it (one graph per key), ``rows``
        is the number of positions its loop evaluates, added to :attr:`evaluations`. It
        is None unless the energy was made with a ``compiled_loop`` and compiles (the
        ``compile`` rule; no memo cache, no ``reduce``), and after a failed compile,
        which warns once and leaves every later call eager."""
        if not self.compiles_loops:
            return None
        graph = self._loops.get(key)
        if graph is None:
            device = tensors[0].device.type
            graph = CompiledLoop(function, probe, self.log_prob, self.batched, device)
            self._loops[key] = graph
        if graph.failure is not None:
            return None
        compiling, seconds = not graph.checked, graph.seconds
        if compiling and self.on_compile is not None:
            self.on_compile(True)
        try:
            with distribution_validation_off():
                result = graph(*tensors)
        finally:
            self.compile_seconds += graph.seconds - seconds
            if compiling and self.on_compile is not None:
                self.on_compile(False)
        if graph.failure is not None:
            self._loop_failed(graph.failure)
            return None
        if result is not None:
            self.compiled = True
            self.evaluations += rows
        return result

    def _loop_failed(self, failure: str) -> None:
        """Run every later transition eagerly, warning why."""
        if failure == RECOMPILED:
            self._give_up_graph(failure)
            return
        self._compile, self.compiled, self.compile_note = False, False, failure
        warnings.warn(
            f"could not compile the transition with log_prob ({failure}); running it "
            "eagerly. Pass compile=False to skip the attempt.",
            RuntimeWarning,
            stacklevel=4,
        )

    def evaluate_uncounted(self, q: torch.Tensor) -> None:
        """One eager evaluation at ``q`` ``(C, D)`` that no counter sees (for timing: see
        :mod:`hmc.threads`); where ``log_prob`` raises there, nothing happens."""
        try:
            with distribution_validation_off():
                self._eager_energy(q)
        except (RuntimeError, ValueError, ArithmeticError):
            pass

    def check(self, q: torch.Tensor) -> bool:
        """Run ``log_prob`` on ``q`` ``(C, D)`` and raise a clear error if its output has
        the wrong type, shape, dtype or device, or no gradient path to the input.

        Points where ``log_prob`` raises are points of zero density, not errors: the first
        row (or, batched, the whole batch, then each row alone) where it does not raise is
        checked. Returns False when it raised everywhere (nothing could be checked)."""
        self._checked = True
        rows = list(q.detach().split(1)) if self.batched else list(q.detach().unbind(0))
        if self.batched and q.shape[0] > 1:
            rows.insert(0, q.detach())
        probes = [row.clone().requires_grad_(True) for row in rows]  # leaves of their own
        with distribution_validation_off():
            for probe in probes:
                try:
                    out = self.log_prob(probe)
                except (RuntimeError, ValueError, ArithmeticError) as error:
                    if "in-place operation" in str(error) or "modified inplace" in str(error):
                        raise ValueError(
                            "log_prob modifies its input in place; compute from the "
                            "position without writing to it (q * 2, not q.mul_(2))"
                        ) from None
                    continue
                self._check_output(probe, out)
                if self.batched and probe.shape[0] > 1:  # a (D,) output can pass for (C,)
                    try:
                        single = self.log_prob(probe[:1].detach().requires_grad_(True))
                    except (RuntimeError, ValueError, ArithmeticError):
                        single = None
                    if single is not None:
                        self._check_output(probe[:1], single)
                    _check_rows_apart(probe, out)
                return True
        return False

    def _check_output(self, x: torch.Tensor, out: Any) -> None:
        """Raise naming what is wrong with ``out``, ``log_prob``'s output at ``x``."""
        q = x if self.batched else x.unsqueeze(0)
        expected = f"({q.shape[0]},)" if self.batched else "a 0-d tensor (a scalar)"
        if not isinstance(out, torch.Tensor):
            raise TypeError(
                f"log_prob must return a torch.Tensor, got {type(out).__name__}; "
                f"expected {expected}"
            )
        shape_ok = out.shape == (q.shape[0],) if self.batched else out.dim() == 0
        if not shape_ok:
            hint = "" if self.batched else " (pass batched=True for a (C, D) -> (C,) function)"
            raise ValueError(
                f"log_prob returned shape {tuple(out.shape)}; expected {expected}{hint}"
            )
        if not out.dtype.is_floating_point:
            raise TypeError(f"log_prob must return a floating-point tensor, got {out.dtype}")
        if out.dtype != q.dtype:
            other = f" (or sample with dtype={out.dtype})" if out.dtype in _DTYPES else ""
            raise TypeError(
                f"log_prob returned {out.dtype} for {q.dtype} positions: make the data it "
                f"uses {q.dtype}{other}"
            )
        if out.device != q.device:
            raise ValueError(
                f"log_prob returned a tensor on {out.device} for positions on {q.device}: "
                "keep the data it uses on the chains' device"
            )
        if not out.requires_grad:
            raise ValueError(
                "log_prob's output has no gradient path to its input: compute it from the "
                "position with differentiable torch operations (no .item(), .numpy() or .detach())"
            )

    def explain(self, q: torch.Tensor) -> str:
        """Why the energy at one position ``(D,)`` is not finite, in words."""
        x = q.detach().clone().unsqueeze(0).requires_grad_(True)
        try:
            with distribution_validation_off():
                lp = self._log_prob_batch(x)
                (g,) = torch.autograd.grad(lp.sum(), x, allow_unused=True)
        except (RuntimeError, ValueError, ArithmeticError) as error:
            return f"log_prob raised {type(error).__name__}: {error}"
        if not torch.isfinite(lp).all():
            return f"log_prob is {lp.item()}"
        if g is None:
            return "log_prob does not depend on the position"
        bad = (~torch.isfinite(g[0])).nonzero().flatten().tolist()
        if bad:
            return f"the gradient is not finite at coordinates {bad[:10]}"
        return "finite"

    # ------------------------------------------------------------------ internals
    def _log_prob_batch(self, x: torch.Tensor) -> torch.Tensor:
        """``(C,)`` log densities of ``(C, D)`` positions (graph kept for one grad)."""
        if self.batched:
            return self.log_prob(x)
        if x.shape[0] == 1:
            return self.log_prob(x[0]).unsqueeze(0)
        if self._use_vmap:
            try:
                return torch.func.vmap(self.log_prob)(x)
            except (RuntimeError, ValueError, TypeError, NotImplementedError) as error:
                rows = torch.stack([self.log_prob(row) for row in x.unbind(0)])
                self._use_vmap = False
                warnings.warn(
                    "torch.func.vmap cannot batch this log_prob "
                    f"({type(error).__name__}: {str(error).splitlines()[0][:200]}); "
                    "evaluating chains one at a time. Write a batched log_prob and pass "
                    "batched=True for speed.",
                    RuntimeWarning,
                    stacklevel=4,
                )
                return rows
        return torch.stack([self.log_prob(row) for row in x.unbind(0)])

    def _compile_now(self, q: torch.Tensor | np.ndarray) -> None:
        """Compile for the widest batch seen, from the positions ``q``. Afterwards
        ``_compile`` is True or False for good, unless the density itself fails at ``q``
        (then the next evaluation tries again)."""
        x = torch.as_tensor(q).detach()
        x = x.reshape(-1, x.shape[-1])
        if self.on_compile is not None:
            self.on_compile(True)
        started = time.perf_counter()
        graph = CompiledEnergy(
            self.log_prob,
            self.batched,
            max(self._widest, x.shape[0]),
            "reduce-overhead" if x.device.type == "cuda" else None,
        )
        try:
            with distribution_validation_off():
                ok = graph.compile(x, self._eager_energy)
        except (RuntimeError, ValueError, ArithmeticError):
            return
        finally:
            self.compile_seconds += time.perf_counter() - started
            if self.on_compile is not None:
                self.on_compile(False)
        self.compile_note = graph.failure
        self._compile = self.compiled = ok
        self._graph = graph if ok else None

    def _energy(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``U`` ``(C,)`` and ``dU/dq`` ``(C, D)``, compiled when :attr:`compiled`;
        raises what ``log_prob`` raises."""
        if self._graph is not None:
            U, grad = self._graph(q)
            if self._graph.failure is not None:  # compiled again: eager from now on
                self._give_up_graph(self._graph.failure)
            return U, grad
        return self._eager_energy(q)

    def _give_up_graph(self, why: str) -> None:
        """Evaluate eagerly from now on, warning once why (:data:`hmc.compiled.RECOMPILED`)."""
        self._graph, self._compile, self.compiled = None, False, False
        self.compile_note = why
        warnings.warn(f"{why}; evaluating it eagerly from now on.", RuntimeWarning, stacklevel=6)

    def _eager_energy(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``U`` ``(C,)`` and ``dU/dq`` ``(C, D)`` with one ``autograd.grad`` call; raises
        what ``log_prob`` raises. A single unbatched row is differentiated as a ``(D,)``
        leaf, which keeps the graph as small as the user's own function."""
        if q.shape[0] == 1 and not self.batched:
            x = q[0].detach().clone().requires_grad_(True)
            log_p = self.log_prob(x)
            (grad,) = torch.autograd.grad(log_p, x)
            return log_p.detach().neg().unsqueeze(0), grad.neg().unsqueeze(0)
        x = q.detach().clone().requires_grad_(True)
        log_p = self._log_prob_batch(x)
        (grad,) = torch.autograd.grad(log_p.sum(), x)
        return log_p.detach().neg(), grad.neg()

    def _evaluate(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if validation_enabled():  # called outside a sampler run
            with distribution_validation_off():
                return self._evaluate(q)
        try:
            U, grad = self._energy(q)
        except (RuntimeError, ValueError, ArithmeticError) as error:
            if q.shape[0] == 1:
                self._warn_raise(error)
                self.evaluations += 1
                return _infinite(q)
            return self._evaluate_rows(q)
        self.evaluations += q.shape[0]
        # On the CPU a host check lets the common all-finite case skip the row-wise
        # selects (a NaN or an infinity anywhere makes the sum non-finite). On
        # accelerators the selects always run, so that no evaluation waits for the device.
        # The compiled graph has done the selects already.
        if self.compiled or (
            q.device.type == "cpu" and math.isfinite(U.sum().item() + grad.sum().item())
        ):
            return U, grad
        finite = torch.isfinite(U + grad.sum(-1))
        U = torch.where(finite, U, torch.inf)
        grad = torch.where(finite.unsqueeze(-1), grad, 0.0)
        return U, grad

    def _evaluate_rows(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Row by row, after the batch raised: rows that raise get ``U = +inf``."""
        parts = [self._evaluate(row.unsqueeze(0)) for row in q.unbind(0)]
        return torch.cat([U for U, _ in parts]), torch.cat([g for _, g in parts])

    def _warn_raise(self, error: Exception) -> None:
        if not self._warned_raise:
            self._warned_raise = True
            warnings.warn(
                f"log_prob raised {type(error).__name__} ({str(error).splitlines()[0][:200]}); "
                "such positions are treated as having zero density (U = +inf).",
                RuntimeWarning,
                stacklevel=5,
            )

    def _evaluate_cached(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cache = self.cache
        assert cache is not None
        keys = cache.keys_for(q)
        found = cache.lookup(keys)
        missing = [i for i, entry in enumerate(found) if entry is None]
        if missing:
            index = torch.tensor(missing, device=q.device)
            U_new, g_new = self._evaluate(q.index_select(0, index))
            cache.store([keys[i] for i in missing], U_new, g_new)
            for j, i in enumerate(missing):
                found[i] = (U_new[j], g_new[j])
        U = torch.stack([entry[0] for entry in found])
        grad = torch.stack([entry[1] for entry in found])
        return U, grad


def _infinite(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full(q.shape[:1], torch.inf, dtype=q.dtype, device=q.device), torch.zeros_like(q)


def _cache_used() -> bool:
    """Whether torch's on-disk cache of compiled graphs holds any graph (this process's or
    an earlier one's): a hint that compiling is cheaper, since a graph compiled before
    comes from there."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir  # imports SymPy, 1 s

    graphs = os.path.join(cache_dir(), "fxgraph")
    return os.path.isdir(graphs) and bool(os.listdir(graphs))


def _check_rows_apart(q: torch.Tensor, out: torch.Tensor) -> None:
    """Raise if a batched ``log_prob``'s value ``out[0]`` at the rows ``q`` ``(C, D)``
    depends on another row (chains must not see each other: the gradient of the summed
    batch would mix them). Rows evaluated apart give exact zeros there."""
    if not torch.isfinite(out[0]):
        return
    try:
        (grad,) = torch.autograd.grad(out[0], q, allow_unused=True)
    except RuntimeError:  # a backward that fails (the density's own trouble) shows nothing
        return
    if grad is None:
        return
    others = grad[1:]
    coupled = (torch.isfinite(others) & (others != 0)).any(1).nonzero().flatten()
    if coupled.numel():
        raise ValueError(
            f"log_prob(q)[0] depends on row {int(coupled[0]) + 1} of q: with batched=True "
            "each row of q is one chain's position and must be evaluated on its own "
            "(no sums, means or normalisations across rows)"
        )
