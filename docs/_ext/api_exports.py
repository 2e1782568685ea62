"""``.. fedleak-exports:: package``: the names a package exports (its ``__all__``), each linked
to where it is defined and documented, with the first line of its docstring.

A package page lists what users import (``from fedleak.attacks import Attack``) without
documenting each object a second time: the object is documented once, on the page of the
module that defines it (autodoc's ``ignore-module-all``), so Sphinx sees no duplicate.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


def summary(obj: Any) -> str:
    """The first paragraph of a class's or function's docstring, on one line ('' for data)."""
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        return ""
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def reference(package: str, name: str, obj: Any) -> str:
    """A reST cross-reference to ``obj`` where it is defined, or its name as literal text."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if inspect.isclass(obj) and module and qualname:
        role = "py:exc" if issubclass(obj, BaseException) else "py:class"
        return f":{role}:`~{module}.{qualname}`"
    if inspect.isfunction(obj) and module and qualname:
        return f":py:func:`~{module}.{qualname}`"
    return f"``{name}``"


class ExportsDirective(SphinxDirective):
    required_arguments = 1
    has_content = False

    def run(self) -> list[nodes.Node]:
        package = self.arguments[0]
        module = importlib.import_module(package)
        exported = getattr(module, "__all__", None)
        if exported is None:
            return []
        rows = [".. list-table::", "   :header-rows: 1", "   :widths: 35 65", "",
                "   * - name", "     - what it is"]
        for name in exported:
            obj = getattr(module, name)
            text = summary(obj)
            rows += [f"   * - {reference(package, name, obj)}", f"     - {text}"]
        return self.parse_text_to_nodes("\n".join(rows))


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("fedleak-exports", ExportsDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
