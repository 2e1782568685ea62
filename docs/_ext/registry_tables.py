"""``.. fedleak-registry:: attacks`` (or ``defenses``): every built-in attack or defense by the
name the CLI, the sweep spec and the wire use, linked to its class, with its options read from
its ``Config`` dataclass (type, default, help), so the table cannot drift from the code.

Plug-ins from other packages (entry points) are left out: they are not fedleak's to document.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from table_nodes import literal, table


def default_of(field: dataclasses.Field[Any]) -> str:
    """A config field's default as the CLI would take it (``required`` when there is none)."""
    if field.default is not dataclasses.MISSING:
        return repr(field.default)
    if field.default_factory is not dataclasses.MISSING:
        return repr(field.default_factory())
    return "required"


def type_of(field: dataclasses.Field[Any]) -> str:
    annotation = field.type
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__",
                                                                  str(annotation))


def registered(kind: str) -> list[tuple[str, type[Any], str]]:
    """``(name, class, what kind of thing it is)`` for fedleak's own attacks or defenses."""
    if kind == "attacks":
        from fedleak.attacks import attack_class, attack_names

        out = []
        for name in attack_names():
            cls = attack_class(name)
            role = getattr(cls, "server_role", "honest")
            target = "released model" if cls.threat_model == "release" else "updates"
            out.append((name, cls, f"{role} server, attacks {target}"))
    elif kind == "defenses":
        from fedleak.defenses import DEFENSES, defense_names

        out = [(name, DEFENSES.get(name), f"stage: {DEFENSES.get(name).stage}")
               for name in defense_names()]
    else:
        raise ValueError(f"fedleak-registry takes attacks or defenses, not {kind!r}")
    return [entry for entry in out if entry[1].__module__.startswith("fedleak.")]


class RegistryDirective(SphinxDirective):
    required_arguments = 1
    has_content = False

    def run(self) -> list[nodes.Node]:
        out: list[nodes.Node] = []
        for name, cls, what in registered(self.arguments[0]):
            target = f"{cls.__module__}.{cls.__qualname__}"
            heading = nodes.rubric("", "", *literal(name),
                                   ids=[nodes.make_id(f"{self.arguments[0]}-{name}")])
            out.append(heading)
            link = addnodes.pending_xref("", nodes.literal(cls.__qualname__, cls.__qualname__),
                                         refdomain="py", reftype="class", reftarget=target,
                                         refexplicit=True)
            out.append(nodes.paragraph("", "", link, nodes.Text(f" ({what})")))
            fields = dataclasses.fields(cls.Config)
            if fields:
                rows = [[literal(f.name.replace("_", "-")), type_of(f), default_of(f),
                         f.metadata.get("help", "")] for f in fields]
                out.append(table(["option", "type", "default", "meaning"], rows,
                                 [18, 12, 14, 56]))
            else:
                out.append(nodes.paragraph("", "No options."))
        return out


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("fedleak-registry", RegistryDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
