"""Benchmark: hmc's NUTS against Stan (pystan), NumPyro, BlackJAX and Pyro.

Five targets, each a log density on a flat unconstrained vector that every sampler gets in
the same parameterisation (so ESS is computed on the same coordinates everywhere):

- ``gauss2d``: 2-D Gaussian, precision ``[[10.25, -9.74], [-9.74, 10.25]]`` (correlation 0.95);
- ``diag100``: 100-D Gaussian with independent coordinates, sds log-spaced 0.01 .. 1;
- ``funnel10``: Neal's funnel, centred, 10-D: ``v ~ N(0, 3)``, ``x_i ~ N(0, exp(v/2))``, i=1..9;
- ``eight_schools``: non-centred eight schools ``(mu, log tau, theta_tilde[8])``,
  ``mu ~ N(0, 5)``, ``tau ~ HalfCauchy(5)`` (with the log Jacobian),
  ``theta_tilde ~ N(0, 1)``, ``y_j ~ N(mu + tau theta_tilde_j, sigma_j)``;
- ``logistic``: logistic regression, N=5000, D=50, synthetic data from a fixed seed
  (``benchmarks.throughput.logistic_data``'s generator), N(0, 1) prior (Stan:
  ``bernoulli_logit_glm``).

Every sampler: NUTS with a diagonal metric, target acceptance 0.8, max tree depth 10,
1000 warmup and 1000 kept draws per chain, 4 chains, float64, uniform(-2, 2) inits.
Each run happens in its own subprocess: hmc with this interpreter, the anchors with the
interpreter of ``--anchors-python`` (a venv made from ``benchmarks/requirements-anchors.txt``)
so that torch and jax never share a process. The parent computes bulk and tail ESS with
``arviz_stats.ess`` on the draws every worker saves, so all samplers are scored alike.

Timing per run: start-up (compilation, initialisation), warmup and sampling wall time,
as each library reports or as measured around its calls:

- hmc: ``dt.attrs`` ``warmup_time``, ``sampling_time``; start-up = ``total_time`` minus
  both (initial points, the initial step-size search); gradients: ``n_gradient_evaluations``
  (all), ``sum(n_steps)`` over the kept draws (sampling phase);
- Stan: start-up = ``stan.build`` (C++ compilation; cached by httpstan after the first
  build); warmup/sampling split of ``fit = posterior.sample(...)`` by Stan's own per-chain
  elapsed times (chains run in parallel processes); gradients = ``n_leapfrog__`` summed
  (the step-size heuristic's few evaluations are not counted);
- NumPyro: ``MCMC(NUTS(potential_fn=...), chain_method="sequential")``, ``warmup()`` then
  ``run()`` timed; NumPyro compiles inside both calls (for every chain), so a tiny run
  (2 + 2 draws) with the same settings measures that fixed cost: start-up = the tiny
  run's time, and the full run's phases are reported less the tiny run's phases;
- BlackJAX: ``window_adaptation(nuts)`` and a ``lax.scan`` of ``nuts.step``, each jitted
  and compiled ahead of time (start-up = compile time), chains one after another;
- Pyro: ``NUTS(potential_fn=...)``, chains one after another (``num_chains=1`` each;
  Pyro's multiprocess chains are avoided), warmup/sampling split by a ``hook_fn`` time
  stamp, gradients counted by a wrapper of the potential.

``torch.set_num_threads(1)``; JAX with ``--xla_cpu_multi_thread_eigen=false``. Pyro is
slow (hundreds of µs per gradient), so by default it runs fewer draws (``--pyro-draws``).
Extra hmc runs with more chains (``--hmc-chains``, fewer draws each) show the time to
1000 bulk ESS when chains are batched. ``hmc-ensemble`` (NUTS) and ``hmc-chees`` (ChEES)
run many short chains with the pooled warmup (``--ensemble``, by default 64 chains, at
most 200 warmup iterations, 50 draws each); the report compares ChEES's ESS per gradient
with NUTS's (4 chains, Stan's warmup).

Run from the repository root::

    python -m benchmarks.nuts_anchors --out nuts-section.md
    python -m benchmarks.nuts_anchors --samplers hmc --targets gauss2d   # hmc alone
    python -m benchmarks.nuts_anchors --samplers hmc,hmc-ensemble,hmc-chees --hmc-chains ""
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

try:
    from benchmarks.machine import machine
except ModuleNotFoundError:  # run as a plain file: its folder is on sys.path
    from machine import machine

TARGETS = ("gauss2d", "diag100", "funnel10", "eight_schools", "logistic")
SAMPLERS = ("hmc", "hmc-ensemble", "hmc-chees", "stan", "numpyro", "blackjax", "pyro")
#: hmc's configurations: NUTS with Stan's warmup, NUTS with the pooled warmup, ChEES
HMC_VARIANTS = {
    "hmc": ("nuts", "stan"),
    "hmc-ensemble": ("nuts", "ensemble"),
    "hmc-chees": ("chees", "ensemble"),
}
ANCHORS_PYTHON = ".venv-anchors/bin/python"  # relative to the repository root
DATA_SEED = 20261202

EIGHT_Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
EIGHT_SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
PRECISION = np.array([[10.25, -9.74], [-9.74, 10.25]])
SDS100 = np.logspace(-2, 0, 100)


def dims(target: str) -> int:
    return {"gauss2d": 2, "diag100": 100, "funnel10": 10, "eight_schools": 10, "logistic": 50}[
        target
    ]


def logistic_data(n: int = 5000, d: int = 50, seed: int = DATA_SEED):
    """The same data as ``benchmarks.throughput.logistic_data`` (numpy only)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    beta = 0.3 * rng.standard_normal(d)
    p = 1.0 / (1.0 + np.exp(-(X @ beta)))
    y = (rng.uniform(size=n) < p).astype(np.float64)
    return X, y, beta


def inits(target: str, chains: int, seed: int) -> np.ndarray:
    """uniform(-2, 2) starts on the unconstrained scale (Stan's default), ``(chains, D)``."""
    rng = np.random.default_rng(seed + 7919)
    return rng.uniform(-2.0, 2.0, size=(chains, dims(target)))


# ====================================================================== log densities
def torch_log_prob(target: str):
    """Batched ``(C, D) -> (C,)`` log density in torch (hmc and Pyro); the same function
    takes one position ``(D,) -> ()``."""
    import torch

    f64 = torch.float64
    if target == "gauss2d":
        P = torch.tensor(PRECISION, dtype=f64)
        return lambda q: -0.5 * ((q @ P) * q).sum(-1)
    if target == "diag100":
        inv_var = torch.tensor(1.0 / SDS100**2, dtype=f64)
        return lambda q: -0.5 * (q * q * inv_var).sum(-1)
    if target == "funnel10":

        def funnel(q):
            v, x = q[..., 0], q[..., 1:]
            return -v * v / 18.0 - 0.5 * (x * x).sum(-1) * torch.exp(-v) - 4.5 * v

        return funnel
    if target == "eight_schools":
        y = torch.tensor(EIGHT_Y, dtype=f64)
        sigma = torch.tensor(EIGHT_SIGMA, dtype=f64)

        def schools(q):
            mu, log_tau, tt = q[..., 0], q[..., 1], q[..., 2:]
            tau = torch.exp(log_tau)
            lp = -mu * mu / 50.0 - torch.log1p((tau / 5.0) ** 2) + log_tau
            lp = lp - 0.5 * (tt * tt).sum(-1)
            theta = mu.unsqueeze(-1) + tau.unsqueeze(-1) * tt
            return lp - 0.5 * (((y - theta) / sigma) ** 2).sum(-1)

        return schools
    if target == "logistic":
        X_np, y_np, _ = logistic_data()
        X = torch.as_tensor(X_np)
        yy = torch.as_tensor(y_np)

        def logistic(b):
            logits = b @ X.T
            loglik = (yy * logits - torch.nn.functional.softplus(logits)).sum(-1)
            return loglik - 0.5 * (b * b).sum(-1)

        return logistic
    raise ValueError(target)


def jax_log_prob(target: str):
    """Single-position ``(D,) -> ()`` log density in JAX (NumPyro and BlackJAX)."""
    import jax
    import jax.numpy as jnp

    if target == "gauss2d":
        P = jnp.asarray(PRECISION)
        return lambda q: -0.5 * q @ P @ q
    if target == "diag100":
        inv_var = jnp.asarray(1.0 / SDS100**2)
        return lambda q: -0.5 * jnp.sum(q * q * inv_var)
    if target == "funnel10":
        return lambda q: (
            -(q[0] ** 2) / 18.0 - 0.5 * jnp.sum(q[1:] ** 2) * jnp.exp(-q[0]) - 4.5 * q[0]
        )
    if target == "eight_schools":
        y = jnp.asarray(EIGHT_Y)
        sigma = jnp.asarray(EIGHT_SIGMA)

        def schools(q):
            mu, log_tau, tt = q[0], q[1], q[2:]
            tau = jnp.exp(log_tau)
            lp = -mu * mu / 50.0 - jnp.log1p((tau / 5.0) ** 2) + log_tau - 0.5 * jnp.sum(tt * tt)
            return lp - 0.5 * jnp.sum(((y - mu - tau * tt) / sigma) ** 2)

        return schools
    if target == "logistic":
        X_np, y_np, _ = logistic_data()
        X = jnp.asarray(X_np)
        yy = jnp.asarray(y_np)

        def logistic(b):
            logits = X @ b
            return jnp.sum(yy * logits - jax.nn.softplus(logits)) - 0.5 * jnp.sum(b * b)

        return logistic
    raise ValueError(target)


STAN_CODE = {
    "gauss2d": """
data { matrix[2, 2] P; }
parameters { vector[2] x; }
model { target += -0.5 * quad_form(P, x); }
""",
    "diag100": """
data { vector[100] sds; }
parameters { vector[100] x; }
model { x ~ normal(0, sds); }
""",
    "funnel10": """
parameters { real v; vector[9] x; }
model { v ~ normal(0, 3); x ~ normal(0, exp(v / 2)); }
""",
    "eight_schools": """
data { array[8] real y; array[8] real<lower=0> sigma; }
parameters { real mu; real log_tau; vector[8] theta_tilde; }
model {
  real tau = exp(log_tau);
  mu ~ normal(0, 5);
  target += cauchy_lpdf(tau | 0, 5) + log_tau;
  theta_tilde ~ std_normal();
  y ~ normal(mu + tau * theta_tilde, sigma);
}
""",
    "logistic": """
data { int<lower=0> N; int<lower=1> D; matrix[N, D] X; array[N] int<lower=0, upper=1> y; }
parameters { vector[D] beta; }
model { beta ~ std_normal(); y ~ bernoulli_logit_glm(X, 0, beta); }
""",
}


def stan_data(target: str) -> dict:
    if target == "gauss2d":
        return {"P": PRECISION.tolist()}
    if target == "diag100":
        return {"sds": SDS100.tolist()}
    if target == "eight_schools":
        return {"y": EIGHT_Y.tolist(), "sigma": EIGHT_SIGMA.tolist()}
    if target == "logistic":
        X, y, _ = logistic_data()
        return {"N": X.shape[0], "D": X.shape[1], "X": X.tolist(), "y": y.astype(int).tolist()}
    return {}


# ====================================================================== workers
def worker_hmc(target, chains, warmup, draws, seed, variant="hmc"):
    import torch

    import hmc

    torch.set_num_threads(1)
    kernel, adapt = HMC_VARIANTS[variant]
    init = torch.as_tensor(inits(target, chains, seed))
    started = time.perf_counter()
    dt = hmc.sample(
        torch_log_prob(target),
        init,
        chains=chains,
        warmup=warmup,
        draws=draws,
        kernel=kernel,
        adapt=adapt,
        seed=seed,
        progress=False,
        batched=True,
    )
    wall = time.perf_counter() - started
    a = dt.attrs
    stats = dt["sample_stats"]
    return dt["posterior"]["x"].values, {
        "startup": a["total_time"] - a["warmup_time"] - a["sampling_time"],
        "warmup": a["warmup_time"],
        "sampling": a["sampling_time"],
        "wall": wall,
        "grads": int(a["n_gradient_evaluations"]),
        "grads_sampling": int(stats["n_steps"].values.sum()),
        "divergences": int(stats["diverging"].values.sum()),
        "step_size": float(np.median(dt["adaptation"]["step_size"].values)),
        "mean_tree_depth": float(stats["tree_depth"].values.mean())
        if "tree_depth" in stats
        else math.nan,
        "warmup_iterations": int(a["tuning_steps"]),
        "chain_utilization": float(a["chain_utilization"]),
        "kernel": a["kernel"],
        "engine": a["engine"],
    }


def worker_stan(target, chains, warmup, draws, seed):
    import stan

    started = time.perf_counter()
    posterior = stan.build(STAN_CODE[target], data=stan_data(target), random_seed=seed)
    built = time.perf_counter()
    fit = posterior.sample(
        num_chains=chains, num_warmup=warmup, num_samples=draws, save_warmup=True
    )
    finished = time.perf_counter()
    warm_s, samp_s = [], []
    for out in fit.stan_outputs:
        text = out.decode() if isinstance(out, bytes) else str(out)
        w = re.search(r"Elapsed Time: ([0-9.e+-]+) seconds \(Warm-up\)", text)
        s = re.search(r"([0-9.e+-]+) seconds \(Sampling\)", text)
        warm_s.append(float(w.group(1)) if w else math.nan)
        samp_s.append(float(s.group(1)) if s else math.nan)
    # fit._draws: (sampler params + flat constrained params, warmup + draws, chains)
    table = np.asarray(fit._draws)
    sampler_names = list(fit.sample_and_sampler_param_names)
    k = len(sampler_names)
    x = table[k:].transpose(2, 1, 0)  # (chains, warmup + draws, D), flat names in our order
    n_leap = table[sampler_names.index("n_leapfrog__")].T  # (chains, warmup + draws)
    div = table[sampler_names.index("divergent__")].T
    depth = table[sampler_names.index("treedepth__")].T
    run_wall = finished - built
    frac = sum(warm_s) / max(sum(warm_s) + sum(samp_s), 1e-12)
    return x[:, warmup:], {
        "startup": built - started,
        "warmup": run_wall * frac,
        "sampling": run_wall * (1 - frac),
        "wall": finished - started,
        "stan_chain_warmup_s": warm_s,
        "stan_chain_sampling_s": samp_s,
        "grads": int(n_leap.sum()),
        "grads_sampling": int(n_leap[:, warmup:].sum()),
        "divergences": int(div[:, warmup:].sum()),
        "step_size": float(np.median(table[sampler_names.index("stepsize__")][-1])),
        "mean_tree_depth": float(depth[:, warmup:].mean()),
        "param_names": list(fit.constrained_param_names),
    }


def _jax_setup():
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
    import jax

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_platforms", "cpu")
    return jax


def worker_numpyro(target, chains, warmup, draws, seed):
    jax = _jax_setup()
    import jax.numpy as jnp
    from numpyro.infer import MCMC, NUTS

    lp = jax_log_prob(target)
    init = jnp.asarray(inits(target, chains, seed))

    def timed(n_warmup, n_draws, key):
        mcmc = MCMC(
            NUTS(potential_fn=lambda q: -lp(q), target_accept_prob=0.8, max_tree_depth=10),
            num_warmup=n_warmup,
            num_samples=n_draws,
            num_chains=chains,
            chain_method="sequential",
            progress_bar=False,
        )
        t0 = time.perf_counter()
        mcmc.warmup(key, init_params=init, collect_warmup=True, extra_fields=("num_steps",))
        warm_steps = int(np.asarray(mcmc.get_extra_fields()["num_steps"]).sum())
        t1 = time.perf_counter()
        mcmc.run(mcmc.post_warmup_state.rng_key, extra_fields=("num_steps", "diverging"))
        jax.block_until_ready(mcmc.get_samples())
        t2 = time.perf_counter()
        return mcmc, t1 - t0, t2 - t1, warm_steps

    # NumPyro compiles inside warmup() and run() (per chain with chain_method="sequential"):
    # a tiny run with the same settings measures that fixed cost, which the full run's
    # phases are then charged without.
    _, c_w, c_s, _ = timed(2, 2, jax.random.PRNGKey(seed + 1000))
    mcmc, w, s, warm_steps = timed(warmup, draws, jax.random.PRNGKey(seed))
    fields = mcmc.get_extra_fields(group_by_chain=True)
    x = np.asarray(mcmc.get_samples(group_by_chain=True))
    steps = np.asarray(fields["num_steps"])
    return x, {
        "startup": c_w + c_s,
        # a phase shorter than the timing noise of the compile estimate is reported as nan
        "warmup": w - c_w if w > c_w else math.nan,
        "sampling": s - c_s if s > c_s else math.nan,
        "wall": w + s,
        "full_run_phases_s": [w, s],
        "tiny_run_phases_s": [c_w, c_s],
        "grads": int(warm_steps + steps.sum()),
        "grads_sampling": int(steps.sum()),
        "divergences": int(np.asarray(fields["diverging"]).sum()),
    }


def worker_blackjax(target, chains, warmup, draws, seed):
    jax = _jax_setup()
    import blackjax
    import jax.numpy as jnp

    lp = jax_log_prob(target)
    adapt = blackjax.window_adaptation(blackjax.nuts, lp, target_acceptance_rate=0.8)

    def run_warmup(key, position):
        (state, params), info = adapt.run(key, position, num_steps=warmup)
        return state, params, info.info.num_integration_steps

    def run_sampling(key, state, params):
        nuts = blackjax.nuts(lp, **params)

        def one(state, k):
            state, info = nuts.step(k, state)
            return state, (state.position, info.num_integration_steps, info.is_divergent)

        _, out = jax.lax.scan(one, state, jax.random.split(key, draws))
        return out

    init = jnp.asarray(inits(target, chains, seed))
    keys = jax.random.split(jax.random.PRNGKey(seed), 2 * chains)
    t0 = time.perf_counter()
    warm_c = jax.jit(run_warmup).lower(keys[0], init[0]).compile()
    t1 = time.perf_counter()
    state0, params0, _ = warm_c(keys[0], init[0])
    samp_c = jax.jit(run_sampling).lower(keys[1], state0, params0).compile()
    t2 = time.perf_counter()
    # the compile of the sampling scan needed one warmup run's output; time it separately
    compile_s = (t1 - t0) + (t2 - t1)
    warm_time = samp_time = 0.0
    xs, steps_w, steps_s, divs = [], 0, 0, 0
    for c in range(chains):
        a = time.perf_counter()
        state, params, n_w = warm_c(keys[2 * c], init[c])
        jax.block_until_ready(state)
        b = time.perf_counter()
        pos, n_s, div = samp_c(keys[2 * c + 1], state, params)
        jax.block_until_ready(pos)
        d = time.perf_counter()
        warm_time += b - a
        samp_time += d - b
        xs.append(np.asarray(pos))
        steps_w += int(np.asarray(n_w).sum())
        steps_s += int(np.asarray(n_s).sum())
        divs += int(np.asarray(div).sum())
    return np.stack(xs), {
        "startup": compile_s,
        "startup_note": "includes one warmup run needed to trace the sampling scan",
        "warmup": warm_time,
        "sampling": samp_time,
        "wall": t2 - t0 + warm_time + samp_time,
        "grads": steps_w + steps_s,
        "grads_sampling": steps_s,
        "divergences": divs,
    }


def worker_pyro(target, chains, warmup, draws, seed):
    import pyro
    import torch
    from pyro.infer.mcmc import MCMC, NUTS

    torch.set_num_threads(1)
    batched = torch_log_prob(target)
    calls = [0]

    def potential(params):
        calls[0] += 1
        return -batched(params["x"].unsqueeze(0))[0]

    init = torch.as_tensor(inits(target, chains, seed))
    xs, warm_time, samp_time, g_total, g_samp, divs = [], 0.0, 0.0, 0, 0, 0
    startup = 0.0
    for c in range(chains):
        pyro.set_rng_seed(seed + c)
        stamps = {}

        def hook(kernel, samples, stage, i, stamps=stamps):
            if stage == "Sample" and "sample" not in stamps:
                stamps["sample"] = time.perf_counter()
                stamps["grads_at_sample"] = calls[0]
            if stage == "Warmup" and "warmup" not in stamps:
                stamps["warmup"] = time.perf_counter()

        kernel = NUTS(
            potential_fn=potential,
            adapt_step_size=True,
            adapt_mass_matrix=True,
            full_mass=False,
            target_accept_prob=0.8,
            max_tree_depth=10,
        )
        mcmc = MCMC(
            kernel,
            num_samples=draws,
            warmup_steps=warmup,
            initial_params={"x": init[c]},
            num_chains=1,
            hook_fn=hook,
            disable_progbar=True,
        )
        before = calls[0]
        t0 = time.perf_counter()
        mcmc.run()
        t1 = time.perf_counter()
        xs.append(mcmc.get_samples()["x"].numpy())
        first = stamps.get("warmup", t0)
        startup += first - t0
        warm_time += stamps["sample"] - first
        samp_time += t1 - stamps["sample"]
        g_total += calls[0] - before
        g_samp += calls[0] - stamps["grads_at_sample"]
        diag = mcmc.diagnostics()
        d = diag.get("divergences", {})
        divs += sum(len(v) for v in d.values()) if isinstance(d, dict) else 0
    return np.stack(xs), {
        "startup": startup,
        "warmup": warm_time,
        "sampling": samp_time,
        "wall": startup + warm_time + samp_time,
        "grads": g_total,
        "grads_sampling": g_samp,
        "divergences": divs,
    }


WORKERS = {
    **{name: functools.partial(worker_hmc, variant=name) for name in HMC_VARIANTS},
    "stan": worker_stan,
    "numpyro": worker_numpyro,
    "blackjax": worker_blackjax,
    "pyro": worker_pyro,
}


def worker_main(args) -> None:
    x, info = WORKERS[args.worker](args.target, args.chains, args.warmup, args.draws, args.seed)
    info["versions"] = _versions(args.worker)
    np.savez(args.result, x=np.asarray(x, dtype=np.float64), info=json.dumps(info))


def _versions(sampler: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    names = {
        **{name: ["hmc", "torch"] for name in HMC_VARIANTS},
        "stan": ["pystan", "httpstan"],
        "numpyro": ["numpyro", "jax"],
        "blackjax": ["blackjax", "jax"],
        "pyro": ["pyro-ppl", "torch"],
    }[sampler]
    out = {}
    for n in names:
        try:
            out[n] = version(n)
        except PackageNotFoundError:
            out[n] = "?"
    return out


# ====================================================================== parent
def run_worker(
    sampler, target, chains, warmup, draws, seed, python, timeout
) -> tuple[np.ndarray | None, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.npz")
        cmd = [
            python,
            os.path.abspath(__file__),
            "--worker",
            sampler,
            "--target",
            target,
            "--chains",
            str(chains),
            "--warmup",
            str(warmup),
            "--draws",
            str(draws),
            "--seed",
            str(seed),
            "--result",
            result,
        ]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
        env["OMP_NUM_THREADS"] = "1"
        usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False
            )
        except subprocess.TimeoutExpired:
            return None, {"error": f"timed out after {timeout} s"}
        elapsed = time.perf_counter() - started
        usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
        if proc.returncode != 0 or not os.path.exists(result):
            tail = (proc.stderr or proc.stdout)[-2000:]
            return None, {"error": f"exit {proc.returncode}: {tail}"}
        data = np.load(result)
        info = json.loads(str(data["info"]))
        info["process_wall"] = elapsed
        info["process_cpu"] = cpu
        return data["x"], info


def score(x: np.ndarray, info: dict) -> dict:
    import arviz_stats as azs

    bulk = [float(azs.ess(x[:, :, j], method="bulk")) for j in range(x.shape[-1])]
    # arviz_stats 1.3.3 needs prob for tail ESS on a bare array (0.05/0.95 is its default)
    tail = [
        float(azs.ess(x[:, :, j], method="tail", prob=(0.05, 0.95))) for j in range(x.shape[-1])
    ]
    ess_b, ess_t = min(bulk), min(tail)
    # second moments: the bulk ESS of the squared deviations from the pooled mean (what
    # the ChEES criterion optimises; variances and intervals depend on them)
    centred = x - x.reshape(-1, x.shape[-1]).mean(0)
    square = min(float(azs.ess(centred[:, :, j] ** 2, method="bulk")) for j in range(x.shape[-1]))
    per_grad_square = 1000 * square / info["grads_sampling"]
    startup, warm, samp = info["startup"], info["warmup"], info["sampling"]
    if math.isnan(warm) or math.isnan(samp):  # NumPyro: below the noise of its compile time
        total = info["wall"]
        return {
            "ess_bulk": ess_b,
            "ess_tail": ess_t,
            "ess_per_s_sampling": math.nan,
            "ess_per_s_total": ess_b / total,
            "ess_per_1000_grads": 1000 * ess_b / info["grads_sampling"],
            "square_ess_per_1000_grads": per_grad_square,
            "us_per_grad": math.nan,
            "total": total,
            "time_to_1000": total,  # the sampling phase is negligible next to compiling
            "mean": x.reshape(-1, x.shape[-1]).mean(0),
            "var": x.reshape(-1, x.shape[-1]).var(0),
        }
    total = startup + warm + samp
    return {
        "ess_bulk": ess_b,
        "ess_tail": ess_t,
        "ess_per_s_sampling": ess_b / samp,
        "ess_per_s_total": ess_b / total,
        "ess_per_1000_grads": 1000 * ess_b / info["grads_sampling"],
        "square_ess_per_1000_grads": per_grad_square,
        "us_per_grad": 1e6 * samp / info["grads_sampling"],
        "total": total,
        "time_to_1000": startup + warm + samp * 1000.0 / ess_b,
        "mean": x.reshape(-1, x.shape[-1]).mean(0),
        "var": x.reshape(-1, x.shape[-1]).var(0),
    }


def truth_check(target: str, s: dict) -> str:
    """A coarse sanity check of the draws against known moments."""
    if target == "gauss2d":
        var = np.diag(np.linalg.inv(PRECISION))
        return f"var {np.round(s['var'], 3).tolist()} (truth {np.round(var, 3).tolist()})"
    if target == "diag100":
        ratio = s["var"] / SDS100**2
        return f"var/truth in [{ratio.min():.2f}, {ratio.max():.2f}]"
    if target == "funnel10":
        return f"mean v {s['mean'][0]:.2f}, var v {s['var'][0]:.2f} (truth 0, 9)"
    if target == "eight_schools":
        mu, log_tau = s["mean"][0], s["mean"][1]
        return f"mean mu {mu:.2f}, mean log tau {log_tau:.2f} (posterior ~4.4, ~0.8)"
    return f"mean beta[0:3] {np.round(s['mean'][:3], 3).tolist()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=SAMPLERS, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--target", default="gauss2d", help=argparse.SUPPRESS)
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--samplers", default=",".join(SAMPLERS))
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--pyro-draws", type=int, default=500, help="warmup and draws per chain for Pyro (slow)"
    )
    parser.add_argument(
        "--hmc-chains",
        default="16:250",
        help="extra hmc runs, CHAINS:DRAWS[,CHAINS:DRAWS] (1000 warmup)",
    )
    parser.add_argument(
        "--ensemble",
        default="64:200:50",
        help="chains, (at most) warmup and draws of the pooled-warmup runs, CHAINS:WARMUP:DRAWS",
    )
    parser.add_argument(
        "--anchors-python",
        default=os.environ.get("ANCHORS_PYTHON", ANCHORS_PYTHON),
        help=f"the anchors' interpreter (default: $ANCHORS_PYTHON, else {ANCHORS_PYTHON})",
    )
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--out", default=None)
    parser.add_argument("--json", default=None, help="also dump raw numbers here (per row)")
    parser.add_argument(
        "--merge",
        nargs="+",
        default=None,
        help="only write the report from the rows of these --json files",
    )
    args = parser.parse_args()
    if args.worker:
        worker_main(args)
        return
    if args.merge:
        rows = []
        for path in args.merge:
            with open(path) as handle:
                rows += json.load(handle)
        info = next((r["machine"] for r in rows if "machine" in r), None) or machine()
        if "torch" not in info:
            from importlib.metadata import version

            info["torch"] = version("torch")
        text = report(rows, info, args)
        print(text)
        if args.out:
            with open(args.out, "w") as handle:
                handle.write(text)
        return

    info = machine()
    import torch

    info["torch"] = torch.__version__
    torch_version = torch.__version__
    del torch
    samplers = args.samplers.split(",")
    extra = [tuple(map(int, s.split(":"))) for s in args.hmc_chains.split(",") if s]
    rows = []
    for target in args.targets.split(","):
        configs = []
        for sampler in samplers:
            if sampler == "hmc":
                configs.append(("hmc", args.chains, args.warmup, args.draws))
                configs += [("hmc", c, args.warmup, d) for c, d in extra]
            elif sampler in HMC_VARIANTS:
                configs.append((sampler, *map(int, args.ensemble.split(":"))))
            elif sampler == "pyro":
                configs.append(("pyro", args.chains, args.pyro_draws, args.pyro_draws))
            else:
                configs.append((sampler, args.chains, args.warmup, args.draws))
        for sampler, chains, warmup, draws in configs:
            python = sys.executable if sampler in HMC_VARIANTS else args.anchors_python
            if sampler not in HMC_VARIANTS and not os.path.exists(python):
                rows.append(
                    {
                        "target": target,
                        "sampler": sampler,
                        "chains": chains,
                        "error": f"{python} not found",
                    }
                )
                continue
            x, meta = run_worker(
                sampler, target, chains, warmup, draws, args.seed, python, args.timeout
            )
            row = {
                "target": target,
                "sampler": sampler,
                "chains": chains,
                "warmup_n": warmup,
                "draws_n": draws,
                **meta,
            }
            if x is not None:
                s = score(x, meta)
                row.update(s)
                row["check"] = truth_check(target, s)
                print(
                    f"{target:14s} {sampler:8s} C={chains:<3d} startup {meta['startup']:.1f}s "
                    f"warmup {meta['warmup']:.1f}s sampling {meta['sampling']:.1f}s "
                    f"grads {meta['grads']} ESS b/t {s['ess_bulk']:.0f}/{s['ess_tail']:.0f} "
                    f"ESS/1000g {s['ess_per_1000_grads']:.1f} us/g {s['us_per_grad']:.1f} "
                    f"div {meta['divergences']} | {row['check']}",
                    flush=True,
                )
            else:
                print(
                    f"{target:14s} {sampler:8s} C={chains:<3d} ERROR {meta['error'][-500:]}",
                    flush=True,
                )
            row["machine"] = {**info, "torch": torch_version}
            rows.append(row)
            if args.json:  # after every row, so an interrupted run keeps what it measured
                _dump(rows, args.json)
    text = report(rows, info, args)
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)


def _dump(rows: list[dict], path: str) -> None:
    def plain(o):
        return o.tolist() if hasattr(o, "tolist") else str(o)

    with open(path, "w") as handle:
        json.dump(rows, handle, default=plain, indent=1)


def report(rows: list[dict], info: dict, args) -> str:
    versions = {}
    for r in rows:
        versions.update(r.get("versions", {}))
    lines = [
        "### NUTS: hmc against Stan, NumPyro, BlackJAX and Pyro",
        "",
        f"Machine: {info['cpu']}, nproc={info['nproc']}, Python {info['python']}, torch "
        f"{info['torch']}; "
        + ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
        + ". torch.set_num_threads(1); JAX with one intra-op thread; Stan runs its chains in "
        "parallel processes (it can use both cores), the others run in one thread. float64 "
        f"everywhere. {args.warmup} warmup + {args.draws} draws x {args.chains} chains unless "
        f"the row says otherwise (Pyro: {args.pyro_draws} + {args.pyro_draws}). The machine "
        "was shared with other jobs: wall times are noisy, ESS and gradient counts are not.",
        "",
        "Columns: start-up (compile, init), warmup and sampling wall seconds; gradients: all / "
        "sampling phase; min bulk and tail ESS over all coordinates (arviz_stats.ess); ESS/s "
        "over the sampling phase and over the total; ESS per 1000 sampling-phase gradients, "
        "of the draws and (x²) of their squared deviations from the mean (min bulk ESS); "
        "µs per gradient in the sampling phase; divergences in the kept draws; time to 1000 "
        "bulk ESS = start-up + warmup + sampling x 1000 / ESS; process CPU s (whole worker "
        "process, imports included).",
        "",
    ]
    for target in dict.fromkeys(r["target"] for r in rows):
        lines += [
            f"**{target}**",
            "",
            "| sampler | chains | start-up s | warmup s | sampling s | gradients (all / "
            "sampling) | bulk ESS | tail ESS | ESS/s sampling | ESS/s total | ESS / 1000 "
            "grads | x² ESS / 1000 grads | µs / grad | div. | s to 1000 ESS | CPU s | check |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            if r["target"] != target:
                continue
            warmup_n = r.get("warmup_iterations", r.get("warmup_n"))
            label = r["sampler"] + (
                f" ({warmup_n}+{r['draws_n']})"
                if (warmup_n, r.get("draws_n")) != (args.warmup, args.draws)
                else ""
            )
            if "error" in r:
                lines.append(
                    f"| {label} | {r['chains']} | failed: {r['error'][:200]!r} |" + " |" * 14
                )
                continue
            lines.append(
                f"| {label} | {r['chains']} | {r['startup']:.1f} | {r['warmup']:.1f} | "
                f"{r['sampling']:.1f} | {r['grads']} / {r['grads_sampling']} | "
                f"{r['ess_bulk']:.0f} | {r['ess_tail']:.0f} | {r['ess_per_s_sampling']:.0f} | "
                f"{r['ess_per_s_total']:.1f} | {r['ess_per_1000_grads']:.1f} | "
                f"{r.get('square_ess_per_1000_grads', math.nan):.1f} | {r['us_per_grad']:.1f} | "
                f"{r['divergences']} | {r['time_to_1000']:.1f} | "
                f"{r['process_cpu']:.0f} | {r['check']} |"
            )
        lines.append("")
    lines += verdicts(rows)
    return "\n".join(lines) + "\n"


def verdicts(rows: list[dict]) -> list[str]:
    out = ["**Targets**", ""]
    wins = 0
    targets = list(dict.fromkeys(r["target"] for r in rows))
    for target in targets:
        ok = [r for r in rows if r["target"] == target and "error" not in r]
        stan = [r for r in ok if r["sampler"] == "stan"]
        h4 = [r for r in ok if r["sampler"] == "hmc"]
        if not h4:
            continue
        base = min(h4, key=lambda r: r["chains"])
        parts = [f"- {target}:"]
        if stan:
            ratio = base["ess_per_1000_grads"] / stan[0]["ess_per_1000_grads"]
            parts.append(
                f"ESS/grad hmc/Stan = {ratio:.2f} ({'met' if ratio >= 0.9 else 'MISSED'}, "
                "target >= 0.9);"
            )
        chees = [r for r in ok if r["sampler"] == "hmc-chees"]
        if chees:
            ratio = chees[0]["ess_per_1000_grads"] / base["ess_per_1000_grads"]
            square = chees[0]["square_ess_per_1000_grads"] / base["square_ess_per_1000_grads"]
            parts.append(
                f"ESS/grad ChEES/NUTS = {ratio:.2f} ({'met' if ratio >= 1.5 else 'MISSED'}, "
                f"target >= 1.5), of x² {square:.2f};"
            )
        ours = [r for r in ok if r["sampler"] in HMC_VARIANTS]
        best = min(ours, key=lambda r: r["time_to_1000"])
        anchors = [r for r in ok if r["sampler"] not in HMC_VARIANTS]
        if anchors:
            fastest = min(anchors, key=lambda r: r["time_to_1000"])
            win = best["time_to_1000"] < fastest["time_to_1000"]
            wins += win
            parts.append(
                f"time to 1000 bulk ESS: {best['sampler']} {best['time_to_1000']:.1f} s "
                f"({best['chains']} chains) vs fastest anchor {fastest['sampler']} "
                f"{fastest['time_to_1000']:.1f} s ({'faster' if win else 'SLOWER'})."
            )
        out.append(" ".join(parts))
    out += [
        "",
        f"hmc fastest to 1000 bulk ESS on {wins} of {len(targets)} targets "
        "(target: at least 4 of 5).",
        "",
    ]
    return out


if __name__ == "__main__":
    main()
