"""Sphinx configuration of fedleak's documentation site (``make docs``).

The Markdown pages render through MyST; the API reference is generated from docstrings
(autodoc + autosummary, which also render the reST roles the docstrings use), the CLI reference
from click (sphinx-click), and the wire and sweep-spec references by the extensions in
``docs/_ext`` from the code itself. Why Sphinx and not MkDocs: ``docs/docs-site.md``.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from importlib import metadata
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
# The checkout's fedleak first (as the tests run it), then the extensions of this site.
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]

project = "fedleak"
author = "the fedleak developers"
copyright = "the fedleak developers, Apache-2.0"
try:
    release = metadata.version("fedleak")
except metadata.PackageNotFoundError:  # a checkout that is not installed
    release = "unreleased"
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "sphinx_click",
    "api_exports",
    "registry_tables",
    "proto_reference",
    "sweep_schema",
    "bibliography_check",
    "architecture_picture",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]
templates_path = ["_templates"]
# "--out" in a docstring or a click help stays two hyphens, not an en dash.
smartquotes = False

# --- MyST: the existing pages are GitHub-flavoured Markdown -------------------------------
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath", "fieldlist"]
myst_heading_anchors = 4  # [text](page.md#a-heading) links, as GitHub renders them

# --- API reference --------------------------------------------------------------------------
# autosummary writes one stub per module into reference/api/generated/ (git-ignored). Start from
# none, so a module that was renamed or removed leaves no stale stub behind (a stale stub fails
# the build on a developer's machine while CI's fresh clone passes).
shutil.rmtree(DOCS / "reference" / "api" / "generated", ignore_errors=True)
autosummary_generate = True
autosummary_imported_members = False
# A module's page documents what the module defines; a package's page lists what it exports
# (``__all__``, the fedleak-exports directive) and links there, so nothing is documented twice.
autodoc_default_options = {"members": True, "show-inheritance": True, "ignore-module-all": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
# numpy sections (Parameters, Returns, Raises with dashed underlines) are the convention ruff's
# D rules enforce (pyproject.toml); Google sections ("Args:") in rooms not yet converted still read
napoleon_google_docstring = True
napoleon_numpy_docstring = True
# Names the docstrings mention without a role (``Observation``) stay literal text.
default_role = "literal"
# A type in a signature that names an attribute two classes share (``rows``) links to the first;
# Sphinx warns that it found more than one. The link is right either way.
suppress_warnings = ["ref.python"]

# --- HTML -------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"fedleak {release}"
html_static_path: list[str] = []
html_show_sourcelink = False

# --- Pages that wait for code -----------------------------------------------------------------
# The auditing library's API page builds once the package exists (the API index takes every
# page of reference/api/ by glob, so nothing else needs to change when it lands).
if importlib.util.find_spec("fedleak.auditing") is None:
    exclude_patterns.append("reference/api/auditing.md")


def _owner_of_docstring(name: str) -> str | None:
    """The module whose code holds the docstring autodoc shows for ``name`` (a method inherits
    its docstring from the first class up the MRO that has one)."""
    import importlib
    import inspect

    module_name, _, rest = name.rpartition(".")
    parts = rest.split(".")
    while module_name:
        try:
            owner: object = importlib.import_module(module_name)
            break
        except ImportError:
            module_name, _, head = module_name.rpartition(".")
            parts.insert(0, head)
    else:
        return None
    for part in parts[:-1]:
        owner = getattr(owner, part)
    if not inspect.isclass(owner):
        return None
    for klass in owner.__mro__:
        member = vars(klass).get(parts[-1])
        if member is not None and getattr(member, "__doc__", None):
            return klass.__module__
    return None


def _drop_foreign_docstrings(app, what, name, obj, options, lines) -> None:  # noqa: ANN001
    """A method without its own docstring shows nothing rather than torch's (whose reST
    refers to labels of torch's docs, e.g. ``Function.forward``)."""
    if what in ("method", "attribute", "property"):
        owner = _owner_of_docstring(name)
        if owner is not None and not owner.startswith("fedleak"):
            lines.clear()


def setup(app) -> None:  # noqa: ANN001
    app.connect("autodoc-process-docstring", _drop_foreign_docstrings)
