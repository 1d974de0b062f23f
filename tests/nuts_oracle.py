"""A slow, obviously correct, recursive single-chain transcription of Stan's NUTS
(``base_nuts.hpp``: ``transition`` and ``build_tree``), kept only as a test oracle for the
iterative batched kernel in :mod:`hmc.kernels.nuts`.

Everything is one chain, plain Python control flow, one leapfrog at a time. The leapfrog
step is injected: the tests pass the package's integrator (tested on its own in
tests/test_integrators.py) on a one-row batch, so that the oracle does the kernel's
floating-point operations and trajectories that amplify round-off (large steps on heavy
tails: a 1e-15 difference grows to O(1) within 80 steps) still match leaf for leaf.
Randomness is injected too: the initial momentum, and an iterator of uniforms consumed in
Stan's order (the direction of each doubling, one per subtree merge in post-order, one per
top-level merge; the last one is consumed on every valid doubling, see the kernel's
docstring).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

Vector = torch.Tensor


@dataclass
class Point:
    q: Vector
    U: float
    g: Vector
    p: Vector


@dataclass
class Result:
    q: Vector
    n_leapfrog: int
    depth: int
    divergent: bool
    accept_stat: float
    energy: float


class Oracle:
    """One NUTS transition, recursively, for a single chain.

    leapfrog : (point, signed step size) -> the point one leapfrog step on, with U = +inf
        where not finite.
    inverse_metric : ``(D,)`` diagonal or ``(D, D)`` dense.
    """

    def __init__(
        self,
        leapfrog: Callable[[Point, float], Point],
        inverse_metric: Vector,
        step_size: float,
        max_depth: int,
        max_delta_h: float = 1000.0,
    ) -> None:
        self.leapfrog = leapfrog
        self.inverse = inverse_metric
        self.eps = step_size
        self.max_depth = max_depth
        self.max_delta_h = max_delta_h
        self.n_leapfrog = 0
        self.sum_metro = 0.0
        self.divergent = False

    # Hamiltonian pieces
    def sharp(self, p: Vector) -> Vector:
        return self.inverse * p if self.inverse.dim() == 1 else self.inverse @ p

    def H(self, z: Point) -> float:
        return z.U + 0.5 * float(p_dot(z.p, self.sharp(z.p)))

    @staticmethod
    def criterion(ps_minus: Vector, ps_plus: Vector, rho: Vector) -> bool:
        return float(p_dot(ps_plus, rho)) > 0 and float(p_dot(ps_minus, rho)) > 0

    def transition(self, z0: Point, uniforms: Iterator[float]) -> Result:
        H0 = self.H(z0)
        z_fwd = z_bck = z0
        z_sample = z0
        sample_energy = H0
        p_fwd_fwd = p_fwd_bck = p_bck_fwd = p_bck_bck = z0.p
        ps = self.sharp(z0.p)
        ps_fwd_fwd = ps_fwd_bck = ps_bck_fwd = ps_bck_bck = ps
        rho = z0.p.clone()
        log_sum_weight = 0.0
        depth = 0
        while depth < self.max_depth:
            if next(uniforms) > 0.5:
                rho_bck, p_bck_fwd, ps_bck_fwd = rho, p_fwd_fwd, ps_fwd_fwd
                out = self.build_tree(depth, z_fwd, H0, +1, uniforms)
                if out is None:
                    break
                (
                    z_fwd,
                    z_propose,
                    h_propose,
                    ps_fwd_bck,
                    ps_fwd_fwd,
                    p_fwd_bck,
                    p_fwd_fwd,
                    rho_fwd,
                    lsw_subtree,
                ) = out
            else:
                rho_fwd, p_fwd_bck, ps_fwd_bck = rho, p_bck_bck, ps_bck_bck
                out = self.build_tree(depth, z_bck, H0, -1, uniforms)
                if out is None:
                    break
                (
                    z_bck,
                    z_propose,
                    h_propose,
                    ps_bck_fwd,
                    ps_bck_bck,
                    p_bck_fwd,
                    p_bck_bck,
                    rho_bck,
                    lsw_subtree,
                ) = out
            depth += 1
            u = next(uniforms)  # consumed on every valid doubling
            if lsw_subtree > log_sum_weight or u < math.exp(lsw_subtree - log_sum_weight):
                z_sample, sample_energy = z_propose, h_propose
            log_sum_weight = logaddexp(log_sum_weight, lsw_subtree)
            rho = rho_bck + rho_fwd
            persist = self.criterion(ps_bck_bck, ps_fwd_fwd, rho)
            persist &= self.criterion(ps_bck_bck, ps_fwd_bck, rho_bck + p_fwd_bck)
            persist &= self.criterion(ps_bck_fwd, ps_fwd_fwd, rho_fwd + p_bck_fwd)
            if not persist:
                break
        return Result(
            q=z_sample.q,
            n_leapfrog=self.n_leapfrog,
            depth=depth,
            divergent=self.divergent,
            accept_stat=self.sum_metro / self.n_leapfrog,
            energy=sample_energy,
        )

    def build_tree(self, depth: int, z: Point, H0: float, sign: int, uniforms: Iterator[float]):
        """Stan's build_tree. Returns None when the subtree is invalid, else
        (last point, proposal, its energy, ps_beg, ps_end, p_beg, p_end, rho, log_sum_weight)."""
        if depth == 0:
            z = self.leapfrog(z, sign * self.eps)
            self.n_leapfrog += 1
            h = self.H(z)
            if math.isnan(h):
                h = math.inf
            if h - H0 > self.max_delta_h:
                self.divergent = True
            self.sum_metro += 1.0 if H0 - h > 0 else math.exp(H0 - h)
            if self.divergent:
                return None
            ps = self.sharp(z.p)
            return z, z, h, ps, ps, z.p, z.p, z.p.clone(), H0 - h
        init = self.build_tree(depth - 1, z, H0, sign, uniforms)
        if init is None:
            return None
        z, z_propose, h_propose, ps_beg, ps_init_end, p_beg, p_init_end, rho_init, lsw_init = init
        final = self.build_tree(depth - 1, z, H0, sign, uniforms)
        if final is None:
            return None
        z, z_final, h_final, ps_final_beg, ps_end, p_final_beg, p_end, rho_final, lsw_final = final
        lsw_subtree = logaddexp(lsw_init, lsw_final)
        if lsw_final > lsw_subtree:
            z_propose, h_propose = z_final, h_final
        else:
            accept_prob = math.exp(lsw_final - lsw_subtree) if lsw_subtree > -math.inf else 0.0
            if next(uniforms) < accept_prob:
                z_propose, h_propose = z_final, h_final
        rho_subtree = rho_init + rho_final
        persist = self.criterion(ps_beg, ps_end, rho_subtree)
        persist &= self.criterion(ps_beg, ps_final_beg, rho_init + p_final_beg)
        persist &= self.criterion(ps_init_end, ps_end, rho_final + p_init_end)
        if not persist:
            return None
        return z, z_propose, h_propose, ps_beg, ps_end, p_beg, p_end, rho_subtree, lsw_subtree


def p_dot(a: Vector, b: Vector) -> Vector:
    return (a * b).sum()


def logaddexp(a: float, b: float) -> float:
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    m = max(a, b)
    return m + math.log(math.exp(a - m) + math.exp(b - m))
