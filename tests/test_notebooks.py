"""The tutorial notebooks open in Jupyter as they are.

Each ``notebooks/NAME.ipynb`` is paired with ``notebooks/NAME.py`` (jupytext's percent
format): the same cells, a kernelspec, and the outputs of a run of every code cell, so
that it reads on a code host without running. In the slow tier each ``.ipynb`` is also run
top to bottom, small (``HMC_SMALL=1``), by Jupyter's own command line (``jupyter
execute``). The documentation build (``tests/test_docs.py``) runs none: it shows the
committed outputs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "notebooks").glob("*.py"))


def cells(notebook) -> list[tuple[str, str]]:
    """``(type, source)`` of each cell, trailing blank lines dropped."""
    return [(cell.cell_type, cell.source.rstrip()) for cell in notebook.cells]


def test_there_are_tutorials():
    assert len(SCRIPTS) >= 6, [s.name for s in SCRIPTS]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_each_script_has_its_notebook_with_the_same_cells(script):
    ipynb = script.with_suffix(".ipynb")
    assert ipynb.is_file(), f"{script.name} has no {ipynb.name}: jupytext --sync {script}"
    paired = jupytext.read(script)
    notebook = nbformat.read(ipynb, as_version=4)
    assert cells(notebook) == cells(paired), (
        f"{ipynb.name} and {script.name} differ: jupytext --sync the one you edited"
    )
    assert paired.metadata["jupytext"]["formats"] == "ipynb,py:percent"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_each_notebook_carries_its_kernel_and_outputs(script):
    notebook = nbformat.read(script.with_suffix(".ipynb"), as_version=4)
    nbformat.validate(notebook)
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    counts = [cell.execution_count for cell in code]
    assert counts == list(range(1, len(code) + 1)), f"not one run top to bottom: {counts}"
    outputs = [output for cell in code for output in cell.outputs]
    assert outputs, "no outputs: run it (jupyter execute --inplace) before committing"
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    plots = any(re.search(r"plt\.|plot_\w+\(", cell.source) for cell in code)
    assert images or not plots, "a notebook that plots shows no figure"


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_each_notebook_runs_in_jupyter(script, tmp_path):
    """``jupyter execute`` on a copy (the committed outputs stay as they are)."""
    copy = tmp_path / script.with_suffix(".ipynb").name
    shutil.copy(script.with_suffix(".ipynb"), copy)
    env = dict(os.environ, HMC_SMALL="1", MPLBACKEND="Agg", CI="true")
    command = [sys.executable, "-m", "jupyter", "execute", "--timeout=600", str(copy)]
    result = subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=ROOT / "notebooks", timeout=900
    )
    assert result.returncode == 0, f"{copy.name} failed in Jupyter:\n{result.stderr[-6000:]}"
