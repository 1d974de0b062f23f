"""BoTorch's fully Bayesian Gaussian processes fitted with ``hmc``.

:func:`fit_fully_bayesian_model_hmc` is BoTorch's ``fit_fully_bayesian_model_nuts`` with
``hmc``'s NUTS in place of Pyro's: the model's own Pyro model (``model.pyro_model.sample``,
a ``SaasPyroModel`` for ``SaasFullyBayesianSingleTaskGP``) goes through
:func:`hmc.from_pyro`, is sampled with BoTorch's defaults (512 warmup iterations, 256
draws, one chain, a dense metric as ``full_mass=True``, maximum tree depth 6), and the
draws go back into the model the way BoTorch's fit puts them there: through
``pyro_model.postprocess_mcmc_samples``, thinned by 16, then ``model.load_mcmc_samples``,
and the model is left in eval mode.

BoTorch is an optional dependency (``pip install "hmc[botorch]"``), imported when the
function is called. Its releases from 0.18 on write the Pyro model in NumPyro (JAX) and
fit it with NumPyro's NUTS; there is no Pyro model in them to hand to ``hmc``, so this
module needs a BoTorch before 0.18 and says so otherwise.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

import torch

from hmc.kernels import NUTS
from hmc.pyro import from_pyro
from hmc.sampler import sample

__all__ = ["fit_fully_bayesian_model_hmc"]

#: The first BoTorch release whose fully Bayesian models are NumPyro models.
NUMPYRO_BOTORCH = (0, 18)


def _botorch_models() -> tuple[type, ...]:
    """The fully Bayesian model classes, after checking BoTorch is there and Pyro-based."""
    try:
        version = metadata.version("botorch")
        from botorch.models.fully_bayesian import AbstractFullyBayesianSingleTaskGP
        from botorch.models.fully_bayesian_multitask import SaasFullyBayesianMultiTaskGP
    except (ImportError, metadata.PackageNotFoundError) as error:
        raise ImportError(
            f"hmc.botorch needs BoTorch, which is not installed ({error}); install it "
            'with: pip install "hmc[botorch]"'
        ) from None
    release = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    if release >= NUMPYRO_BOTORCH:
        raise ImportError(
            f"BoTorch {version} writes its fully Bayesian models in NumPyro, which hmc cannot "
            'sample; install a BoTorch before 0.18: pip install "hmc[botorch]"'
        )
    return AbstractFullyBayesianSingleTaskGP, SaasFullyBayesianMultiTaskGP


def fit_fully_bayesian_model_hmc(
    model: Any,
    max_tree_depth: int = 6,
    warmup_steps: int = 512,
    num_samples: int = 256,
    thinning: int = 16,
    *,
    chains: int = 1,
    seed: int = 0,
    compile: bool | str = "auto",
    progress: bool = False,
) -> Any:
    """Fit a fully Bayesian BoTorch GP with ``hmc``'s NUTS and load the draws into it.

    The arguments before ``*`` are those of BoTorch's ``fit_fully_bayesian_model_nuts``,
    with its defaults.

    Parameters
    ----------
    model : BoTorch model
        A ``SaasFullyBayesianSingleTaskGP``, another ``AbstractFullyBayesianSingleTaskGP``
        or a ``SaasFullyBayesianMultiTaskGP``.
    max_tree_depth : NUTS's maximum tree depth.
    warmup_steps, num_samples : warmup iterations and kept draws per chain.
    thinning : every ``thinning``-th draw is loaded into the model, ``num_samples``
        divided by ``thinning`` per chain (16 by default): the model's batch of GPs.
    chains : chains, run batched; their thinned draws are loaded one chain after another.
    seed, compile, progress : as in :func:`hmc.sample`.

    Returns
    -------
    xarray.DataTree
        The run (every draw, before thinning), for diagnostics; the model itself now holds
        the thinned draws and is in eval mode.

    Raises
    ------
    ImportError
        Without BoTorch (``pip install "hmc[botorch]"``), or with a BoTorch from 0.18 on.
    TypeError
        When ``model`` is not one of BoTorch's fully Bayesian models.
    ValueError
        When ``thinning`` is not a positive integer.
    """
    classes = _botorch_models()
    if not isinstance(model, classes):
        raise TypeError(
            "model must be a fully Bayesian BoTorch model (SaasFullyBayesianSingleTaskGP, "
            f"SaasFullyBayesianMultiTaskGP, ...), got {type(model).__name__}"
        )
    if isinstance(thinning, bool) or not isinstance(thinning, int) or thinning < 1:
        raise ValueError(f"thinning must be a positive integer, got {thinning!r}")
    model.train()
    posterior = from_pyro(model.pyro_model.sample)
    run = sample(
        posterior,
        chains=chains,
        warmup=warmup_steps,
        draws=num_samples,
        kernel=NUTS(max_tree_depth=max_tree_depth),
        metric="dense",
        seed=seed,
        compile=compile,
        progress=progress,
    )
    like = model.pyro_model.train_X
    draws = {
        name: torch.as_tensor(run["posterior"][name].values, dtype=like.dtype, device=like.device)
        for name in posterior.names  # the latent sites, as Pyro's MCMC.get_samples() has
    }
    mcmc_samples = model.pyro_model.postprocess_mcmc_samples(
        mcmc_samples={name: value[:, ::thinning].flatten(0, 1) for name, value in draws.items()}
    )
    model.load_mcmc_samples(mcmc_samples)
    model.eval()
    return run
