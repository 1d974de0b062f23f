"""The machine a benchmark ran on, reported with every result.

Standard library only, so that the anchor samplers' worker processes (other venvs) can
import it too. The core count is ``os.cpu_count()``: GNU ``nproc`` reports
``OMP_NUM_THREADS`` when that is set, which the benchmarks set to 1.
"""

from __future__ import annotations

import os
import platform
import subprocess

__all__ = ["machine"]


def machine() -> dict[str, str]:
    """CPU model (from ``lscpu``), logical core count and Python version."""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        lscpu = ""
    model = next(
        (ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if "Model name" in ln),
        platform.processor() or "unknown CPU",
    )
    return {"cpu": model, "nproc": str(os.cpu_count()), "python": platform.python_version()}
