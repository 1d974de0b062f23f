"""Command line: ``python -m hmc COMMAND [options]`` (also installed as ``hmc``).

Each command is a subparser with its own ``--help``; add one by writing an ``_add_NAME``
function that registers its parser and sets ``func`` to the function that runs it.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from typing import Any

from hmc.progress import (
    LINE_SECONDS,
    DisplayFactory,
    ProgressLines,
    end_line,
    print_now,
    start_line,
)

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


def _seconds(text: str) -> float:
    """An argparse type: a number of seconds ``>= 0``."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown, and names such as ``eight_schools-eight_schools_noncentered`` never
    broken at their hyphens."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:  # a switch whose default is "decide by itself"
            return action.help
        return super()._get_help_string(action)


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options ``demo`` and ``sample`` share: sizes, seed, kernel, progress."""
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
        default="nuts",
        help=(
            "transition kernel: 'nuts' (the No-U-Turn sampler) or 'hmc' (static HMC with a "
            "random number of leapfrog steps)"
        ),
    )
    parser.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        default=None,
        help=(
            "never show the progress (by default a progress bar on a terminal, plain lines "
            "otherwise)"
        ),
    )
    parser.add_argument(
        "--progress-every",
        type=_seconds,
        default=LINE_SECONDS,
        metavar="SECONDS",
        help=(
            "the most seconds between two progress lines when standard error is not a "
            "terminal (a log file); 0 writes one whenever an iteration ends"
        ),
    )


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
        formatter_class=_Formatter,
    )
    parser.add_argument(
        "--out", default="out", metavar="DIR", help="folder for the plots and run.nc"
    )
    _add_run_options(parser)
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


def _add_sample(commands: argparse._SubParsersAction) -> None:
    import hmc.models

    parser = commands.add_parser(
        "sample",
        help="sample a built-in posterior or a model file; print the summary, save the run",
        description=(
            "Sample MODEL with hmc.sample, print the ArviZ summary and write the run (an "
            "ArviZ DataTree in netCDF) to --out. MODEL is a built-in posteriordb posterior "
            "(its posteriordb name, or a model name only one posterior uses, or "
            "eight_schools: " + ", ".join(hmc.models.names()) + ") or a Python file that "
            "defines `model`: an hmc.Model, or a log density of one position together with "
            "`dim`, its dimension."
        ),
        formatter_class=_Formatter,
    )
    parser.add_argument("model", metavar="MODEL", help="a built-in posterior or a .py file")
    parser.add_argument(
        "--out", default="run.nc", metavar="FILE", help="where to write the run (netCDF)"
    )
    _add_run_options(parser)
    parser.set_defaults(func=_run_sample)


def _run_sample(args: argparse.Namespace) -> int:
    import arviz as az

    import hmc
    from hmc.atomic import check_writable_file, write_atomically

    target, options, (label, description, dim) = _load_model(args.model)
    try:
        check_writable_file(args.out, "--out")
    except ValueError as error:
        raise SystemExit(str(error)) from None
    print_now(
        start_line(
            label, description, dim, args.chains, args.warmup, args.draws, args.kernel, args.seed
        )
    )
    started = time.perf_counter()
    dt = hmc.sample(
        target,
        chains=args.chains,
        warmup=args.warmup,
        draws=args.draws,
        seed=args.seed,
        kernel=args.kernel,
        progress=_progress(args),
        **options,
    )
    print_now(end_line(dt, time.perf_counter() - started))
    write_atomically(args.out, lambda path: dt.to_netcdf(path, engine="h5netcdf"))
    print_now(az.summary(dt).to_string())
    print_now(f"wrote {args.out}")
    return 0


def _progress(args: argparse.Namespace) -> bool | DisplayFactory | None:
    """``hmc.sample``'s ``progress``: none with ``--no-progress``; the bar on a terminal
    (None: as ``hmc.sample`` decides); else plain lines every ``--progress-every``
    seconds."""
    if args.progress is False:
        return False
    if sys.stderr.isatty():
        return None
    return functools.partial(ProgressLines, every=args.progress_every)


def _load_model(name: str) -> tuple[Any, dict[str, Any], tuple[str, str, int]]:
    """The target and ``hmc.sample`` options of MODEL (a built-in posterior, or a file),
    and what the start line says of it: its name, a few words and its dimension."""
    import runpy

    import hmc.models

    if name.endswith(".py"):
        if not os.path.isfile(name):
            raise SystemExit(f"no such model file: {name}")
        namespace = runpy.run_path(name)
        if "model" not in namespace:
            raise SystemExit(f"{name} defines no `model` (an hmc.Model or a log density)")
        model = namespace["model"]
        if isinstance(model, hmc.Model):
            return model, {}, (name, "an hmc.Model", model.dim)
        if "dim" not in namespace:
            raise SystemExit(f"{name}: a log density `model` needs `dim`, its dimension")
        dim = namespace["dim"]
        return model, {"dim": dim}, (name, "a log density", dim)
    try:
        posterior = hmc.models.resolve(name)
        model = hmc.models.load(posterior)
    except KeyError as error:
        raise SystemExit(str(error.args[0])) from None
    return model, {}, (posterior, "posteriordb posterior", model.dim)


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
        progress=_progress(args),
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``hmc`` argument parser with one subparser per command."""
    from hmc import __version__

    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    parser = argparse.ArgumentParser(
        prog="hmc" if script == "hmc" else "python -m hmc",
        description=(
            "Hamiltonian Monte Carlo for PyTorch log densities. "
            "Run 'python -m hmc COMMAND --help' for a command's options."
        ),
    )
    parser.add_argument("--version", action="version", version=f"hmc {__version__}")
    commands = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    _add_demo(commands)
    _add_sample(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m hmc`` and the ``hmc`` script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except (ValueError, TypeError) as error:  # hmc's refusals of a model or a setting
        print(f"hmc {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
