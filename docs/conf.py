"""Sphinx configuration for the hmc documentation.

Build (from the repository root, offline, warnings as errors)::

    sphinx-build -W -b html docs docs/_build/html

Two pages are completed at build time, so that they never go stale:

- ``api.md``: the marker ``HMC_API`` becomes one autodoc entry per public name in
  ``hmc.__all__``, then the public names of a few submodules not already listed;
- ``tutorials/index.md``: the marker ``HMC_TUTORIALS`` becomes a toctree of the notebooks
  ``notebooks/*.ipynb``, which are copied into ``docs/tutorials/`` (git-ignored) and shown
  with the outputs of their full-size run, as committed.

The build executes no notebook (``nb_execution_mode = "off"``). ``tests/test_notebooks.py``
checks that each notebook carries the outputs of one run of every code cell and, in the
slow tier, runs each one small (``HMC_SMALL=1``) with ``jupyter execute`` on a copy;
``tests/test_docs.py``, in the slow tier too, runs this build with warnings as errors.
"""

from __future__ import annotations

import importlib
import inspect
import shutil
import sys
from pathlib import Path

from sphinx.application import Sphinx

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
NOTEBOOKS = ROOT / "notebooks"
TUTORIALS = DOCS / "tutorials"
sys.path.insert(0, str(ROOT))

import hmc  # noqa: E402

project = "hmc"
author = "the hmc developers"
copyright = "the hmc developers"
release = version = hmc.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_nb",
]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "conf.py", "**.ipynb_checkpoints"]

html_theme = "pydata_sphinx_theme"
html_title = f"hmc {release}"
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2}
# No left sidebar on single pages (it would only say "Section Navigation"); the
# tutorials keep theirs.
html_sidebars = {
    page: [] for page in ("index", "getting-started", "how-it-works", "from-other-libraries", "api")
}

toc_object_entries = False  # the API page has one heading per name instead
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the numpydoc sections give shapes and types
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False

myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3
nb_execution_mode = "off"  # the committed outputs of a full-size run
nb_merge_streams = True

# Submodules whose public names are documented after hmc.__all__ (names already listed
# there are not repeated).
API_SUBMODULES = ["hmc.autodiff", "hmc.adapt", "hmc.distributed", "hmc.botorch"]


def copy_notebooks() -> list[str]:
    """Mirror ``notebooks/*.ipynb`` into ``docs/tutorials/``; return the page names."""
    TUTORIALS.mkdir(exist_ok=True)
    sources = sorted(NOTEBOOKS.glob("*.ipynb"))
    wanted = {path.name for path in sources}
    for stale in [*TUTORIALS.glob("*.ipynb"), *TUTORIALS.glob("*.py")]:
        if stale.name not in wanted:
            stale.unlink()
    for source in sources:
        target = TUTORIALS / source.name
        if not target.exists() or target.read_bytes() != source.read_bytes():
            shutil.copyfile(source, target)
    return [path.stem for path in sources]


TUTORIAL_PAGES = copy_notebooks()


def tutorials_toctree(pages: list[str]) -> str:
    if not pages:
        return "No tutorials yet: they are the notebooks in `notebooks/`.\n"
    return "```{toctree}\n:maxdepth: 1\n\n" + "\n".join(pages) + "\n```\n"


def _directive(qualified: str, obj: object) -> str:
    if inspect.ismodule(obj):
        return f"```{{eval-rst}}\n.. automodule:: {qualified}\n   :members:\n```\n"
    if inspect.isclass(obj):
        return f"```{{eval-rst}}\n.. autoclass:: {qualified}\n   :members:\n```\n"
    if callable(obj):
        return f"```{{eval-rst}}\n.. autofunction:: {qualified}\n```\n"
    return f"```{{eval-rst}}\n.. autodata:: {qualified}\n   :no-value:\n```\n"


def api_entries() -> str:
    """Summary table and autodoc entries for ``hmc.__all__`` and ``API_SUBMODULES``."""
    entries: list[tuple[str, object]] = []
    seen: set[int] = set()
    for name in hmc.__all__:
        if name.startswith("_"):
            continue
        obj = getattr(hmc, name)
        entries.append((f"hmc.{name}", obj))
        seen.add(id(obj))
    for module_name in API_SUBMODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if id(obj) not in seen:
                entries.append((f"{module_name}.{name}", obj))
                seen.add(id(obj))
    table = "```{eval-rst}\n.. autosummary::\n   :nosignatures:\n\n" + "".join(
        f"   {qualified}\n" for qualified, _ in entries
    )
    sections = "".join(f"\n## `{q}`\n\n{_directive(q, obj)}" for q, obj in entries)
    return table + "```\n" + sections


def fill_markers(app: Sphinx, docname: str, source: list[str]) -> None:
    if docname == "api":
        source[0] = source[0].replace("HMC_API", api_entries())
    elif docname == "tutorials/index":
        source[0] = source[0].replace("HMC_TUTORIALS", tutorials_toctree(TUTORIAL_PAGES))


def skip_namedtuple_fields(app: Sphinx, what: str, name: str, obj, skip: bool, options) -> bool:
    """Leave out the "Alias for field number N" entries of NamedTuple fields."""
    return skip or (getattr(obj, "__doc__", None) or "").startswith("Alias for field number")


def always_reread(app: Sphinx, env, added, changed, removed) -> list[str]:
    """The generated pages depend on the package and the notebook list, not their files."""
    return ["api", "tutorials/index"]


def setup(app: Sphinx) -> None:
    app.connect("source-read", fill_markers)
    app.connect("env-get-outdated", always_reread)
    app.connect("autodoc-skip-member", skip_namedtuple_fields)
