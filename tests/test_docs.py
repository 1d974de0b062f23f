"""The documentation builds offline with warnings as errors.

The tutorial pages are the notebooks ``notebooks/*.ipynb`` with the outputs of their
full-size run, as committed (``tests/test_notebooks.py`` checks those outputs against the
scripts and runs every notebook, small, with ``jupyter execute``).

In the slow tier (``pytest -m slow``). Skipped when the documentation tools (the ``test``
extra, or ``requirements-docs.txt``) are not installed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

for module in ("sphinx", "myst_nb", "pydata_sphinx_theme", "numpydoc", "jupytext", "ipykernel"):
    pytest.importorskip(module)

import hmc  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

pytestmark = pytest.mark.slow


def failure_report(output: str) -> str:
    """Sphinx's output, plus the failing notebook cell from the traceback file it saved."""
    saved = re.search(r"traceback has been saved in:\s*(\S+)", output)
    if saved is None or not Path(saved.group(1)).is_file():
        return output
    log = re.sub(r"\x1b\[[0-9;]*m", "", Path(saved.group(1)).read_text())
    cell = re.search(r"CellExecutionError:.*?(?=The above exception|\Z)", log, re.DOTALL)
    return output + "\n" + (cell.group(0) if cell else log[-6000:])


def test_docs_build_with_warnings_as_errors(tmp_path):
    html = tmp_path / "html"
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
    command += ["-d", str(tmp_path / "doctrees"), str(ROOT / "docs"), str(html)]
    result = subprocess.run(
        command, capture_output=True, text=True, env=dict(os.environ), timeout=1800
    )
    output = f"{result.stdout}\n{result.stderr}"
    assert result.returncode == 0, f"sphinx-build failed:\n{failure_report(output)}"

    for page in (
        "index",
        "getting-started",
        "how-it-works",
        "from-other-libraries",
        "pyro",
        "botorch",
        "api",
    ):
        assert (html / f"{page}.html").is_file(), page
    api = (html / "api.html").read_text()
    for name in hmc.__all__:
        if not name.startswith("_"):
            anchors = (f'id="hmc.{name}"', f'id="module-hmc.{name}"')  # object or module
            assert any(a in api for a in anchors), f"hmc.{name} is missing from the API page"
    assert NOTEBOOKS, "no notebooks/*.ipynb found: the build rendered no tutorial"
    for notebook in NOTEBOOKS:
        page = html / "tutorials" / f"{notebook.stem}.html"
        assert page.is_file(), f"{notebook.name} was not rendered"
        assert 'class="cell_output' in page.read_text(), f"{notebook.name} shows no output"
