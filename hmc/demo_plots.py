"""The demo's figures: the plots a statistician looks at first, readable at a glance.

- ``trace``: one row per scalar (each element of a vector on its own row, named by its
  coordinate, such as ``theta[Choate]``): each chain's histogram on the left, each
  chain's draws on the right.
- ``rank``: rank histograms (Vehtari et al. 2021): each chain's draws ranked among all
  chains' draws, in 20 bins; chains that sample the same distribution give flat bars
  inside the grey band, where 99 % of bins fall when they do. No p-values, so no test that
  flags one variable in a hundred on a healthy run.
- ``energy``: the marginal energy and the energy transitions (centred), whose widths
  E-BFMI compares, and E-BFMI per chain against the 0.3 threshold.

Every panel is titled and its axes labelled; chains are numbered by integers.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

__all__ = ["energy_figure", "rank_figure", "scalars", "trace_figure"]

#: bins of a rank histogram
RANK_BINS = 20


def scalars(posterior: Any, names: list[str] | None = None) -> list[tuple[str, np.ndarray]]:
    """``(label, draws (chain, draw))`` for every scalar of ``posterior``'s variables
    ``names`` (all of them when None): a vector's elements labelled by their coordinates."""
    out = []
    for name in names or list(posterior.data_vars):
        variable = posterior[name]
        extra = [dim for dim in variable.dims if dim not in ("chain", "draw")]
        if not extra:
            out.append((name, variable.values))
            continue
        coords = [variable[dim].values for dim in extra]
        for index in itertools.product(*(range(len(c)) for c in coords)):
            label = ", ".join(str(c[i]) for c, i in zip(coords, index, strict=True))
            out.append(
                (f"{name}[{label}]", variable.isel(dict(zip(extra, index, strict=True))).values)
            )
    return out


def trace_figure(posterior: Any, names: list[str] | None = None):
    """Histogram and trace of each chain, one row per scalar."""
    import matplotlib.pyplot as plt

    rows = scalars(posterior, names)
    fig, axes = plt.subplots(
        len(rows), 2, figsize=(10, 1.5 * len(rows) + 0.6), squeeze=False, layout="constrained"
    )
    for (label, draws), (left, right) in zip(rows, axes, strict=True):
        bins = np.histogram_bin_edges(draws, bins=40)
        for chain, values in enumerate(draws):
            left.hist(values, bins=bins, histtype="step", density=True, label=f"chain {chain}")
            right.plot(values, linewidth=0.5, alpha=0.8)
        left.set_title(label, loc="left")
        left.set_ylabel("density")
        right.set_title(f"{label}: draws", loc="left")
        right.set_ylabel("value")  # the title names it; a long name here would overlap
    axes[-1, 0].set_xlabel("value")
    axes[-1, 1].set_xlabel("draw")
    _chain_legend(fig, axes[0, 0])
    return fig


def rank_figure(posterior: Any, names: list[str] | None = None, columns: int = 4):
    """Rank histograms, one panel per scalar."""
    import matplotlib.pyplot as plt

    rows = scalars(posterior, names)
    grid = -(-len(rows) // columns)
    fig, axes = plt.subplots(
        grid, columns, figsize=(3 * columns, 2.4 * grid + 0.8), squeeze=False,
        layout="constrained",
    )  # fmt: skip
    for ax, (label, draws) in zip(axes.flat, rows, strict=False):
        chains, n = draws.shape
        ranks = np.argsort(np.argsort(draws.ravel(), kind="stable"), kind="stable")
        ranks = ranks.reshape(chains, n)
        edges = np.linspace(0, chains * n, RANK_BINS + 1)
        expected = n / RANK_BINS
        spread = 2.576 * np.sqrt(expected * (1 - 1 / RANK_BINS))  # 99 % of bins
        ax.axhspan(expected - spread, expected + spread, color="0.9")
        ax.axhline(expected, color="0.5", linestyle="--", linewidth=0.8)
        for chain in range(chains):
            counts, _ = np.histogram(ranks[chain], bins=edges)
            ax.stairs(counts, np.arange(RANK_BINS + 1), baseline=None, label=f"chain {chain}")
        ax.set_title(label)
        ax.set_xlabel("rank bin")
        ax.set_ylabel("draws")
        ax.set_xticks([0, RANK_BINS])
    for ax in axes.flat[len(rows) :]:
        ax.set_visible(False)
    _chain_legend(fig, axes.flat[0])
    fig.suptitle(
        "Rank histograms: flat bars inside the grey band when the chains agree", fontsize="medium"
    )
    return fig


def _chain_legend(fig: Any, ax: Any) -> None:
    """One legend of the chains for the whole figure, below its panels."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(8, len(labels)))


def energy_figure(dt: Any):
    """The energy distributions of a run's DataTree ``dt`` and its E-BFMI per chain
    (ArviZ's)."""
    import arviz_stats
    import matplotlib.pyplot as plt

    energy = dt["sample_stats"]["energy"].values  # (chain, draw)
    centred = energy - energy.mean(axis=1, keepdims=True)
    transitions = np.diff(energy, axis=1)
    bfmi = arviz_stats.bfmi(dt)["energy"].values
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(10, 3.2), width_ratios=(3, 1), layout="constrained"
    )
    bins = np.histogram_bin_edges(np.concatenate((centred.ravel(), transitions.ravel())), 50)
    left.hist(centred.ravel(), bins=bins, density=True, alpha=0.5, label="marginal energy")
    left.hist(transitions.ravel(), bins=bins, density=True, alpha=0.5, label="energy transition")
    left.set_title("Energy: the transitions should be about as wide as the marginal")
    left.set_xlabel("energy minus its chain's mean (marginal), or its change per draw")
    left.set_ylabel("density")
    left.legend(fontsize="small")
    chains = np.arange(len(bfmi))
    right.barh(chains, bfmi, color="tab:blue")
    right.axvline(0.3, color="tab:red", linestyle="--", label="0.3: too low below")
    right.set_yticks(chains)
    right.set_ylabel("chain")
    right.set_xlabel("E-BFMI")
    right.set_title("E-BFMI per chain")
    right.legend(fontsize="small", loc="lower right")
    return fig
