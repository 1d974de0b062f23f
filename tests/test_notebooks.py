"""Every tutorial notebook runs top to bottom in small mode.

The notebooks are jupytext percent-format scripts (``notebooks/*.py``), which are plain
Python: each runs in a fresh interpreter with ``HMC_SMALL=1`` (tiny sizes), ``CI=1`` (no
progress bars) and the Agg backend for matplotlib, and must exit with status 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.py"))
TIMEOUT_S = 300


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 5, [path.name for path in NOTEBOOKS]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_notebook_runs_in_small_mode(notebook, tmp_path):
    env = dict(os.environ)
    env.update(HMC_SMALL="1", CI="1", MPLBACKEND="Agg", TQDM_DISABLE="1", OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, str(notebook)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, (
        f"{notebook.name} failed (exit {result.returncode}):\n"
        f"--- stdout (tail) ---\n{result.stdout[-3000:]}\n"
        f"--- stderr (tail) ---\n{result.stderr[-5000:]}"
    )
