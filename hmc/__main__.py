"""Command line: ``python -m hmc COMMAND [options]`` (also installed as ``hmc``).

Each command is a subparser with its own ``--help``; add one by writing an ``_add_NAME``
function that registers its parser and sets ``func`` to the function that runs it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

__all__ = ["build_parser", "main"]


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer ``>= minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _add_demo(commands: argparse._SubParsersAction) -> None:
    from hmc.demo import DEFAULT_MODEL

    parser = commands.add_parser(
        "demo",
        help="sample the eight schools model, print its summary, save plots and the run",
        description=(
            "Sample the non-centred eight schools model (10 parameters: mu, log tau and "
            "eight standardised school effects) with hmc.sample, print the ArviZ summary, "
            "and write OUT/trace.png (trace and marginal densities), OUT/rank.png (rank "
            "plots), OUT/energy.png (energy distributions and E-BFMI) and OUT/run.nc (the "
            "whole run as an ArviZ DataTree in netCDF, read back with arviz.from_netcdf)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--out", default="out", metavar="DIR", help="folder for the plots and run.nc"
    )
    parser.add_argument(
        "--chains", type=_positive_int, default=4, metavar="N", help="number of chains"
    )
    parser.add_argument(
        "--draws", type=_positive_int, default=1000, metavar="N", help="kept draws per chain"
    )
    parser.add_argument(
        "--warmup",
        type=_non_negative_int,
        default=1000,
        metavar="N",
        help="warmup (adaptation) iterations per chain, discarded",
    )
    parser.add_argument(
        "--seed",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="random seed; the same seed gives bit-identical output on the CPU",
    )
    parser.add_argument(
        "--kernel",
        choices=("nuts", "hmc"),
        default=None,
        help=(
            "transition kernel: 'nuts' (the No-U-Turn sampler) or 'hmc' (static HMC with a "
            "random number of leapfrog steps); default: hmc.sample's default"
        ),
    )
    parser.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        default=None,
        help="never show the progress bar (by default it is shown on a terminal)",
    )
    import hmc.models
    from hmc.demo import MODELS

    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        choices=sorted(MODELS) + hmc.models.names(),
        metavar="NAME",
        help=(
            "the model: eight_schools (the flat non-centred eight schools) or a built-in "
            "posteriordb posterior: " + ", ".join(hmc.models.names())
        ),
    )
    parser.set_defaults(func=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    from hmc.demo import run_demo

    run_demo(
        args.out,
        model=args.model,
        chains=args.chains,
        warmup=args.warmup,
        draws=args.draws,
        seed=args.seed,
        kernel=args.kernel,
        progress=args.progress,
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``hmc`` argument parser with one subparser per command."""
    from hmc import __version__

    parser = argparse.ArgumentParser(
        prog="python -m hmc",
        description=(
            "Hamiltonian Monte Carlo for PyTorch log densities. "
            "Run 'python -m hmc COMMAND --help' for a command's options."
        ),
    )
    parser.add_argument("--version", action="version", version=f"hmc {__version__}")
    commands = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    _add_demo(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m hmc`` and the ``hmc`` script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
