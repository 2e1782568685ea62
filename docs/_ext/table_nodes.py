"""A docutils table from rows of cells, each cell plain text or ready nodes. Text that comes
from the code is not parsed as reST (a ``*`` or ``|`` in a help string stays what it is); only
its `backticked` spans become inline code."""

from __future__ import annotations

import re
from collections.abc import Sequence

from docutils import nodes

Cell = str | Sequence[nodes.Node]


def code_spans(text: str) -> list[nodes.Node]:
    """Plain text from the code, with its `backticked` spans as inline code (nothing else of
    the text is interpreted)."""
    out: list[nodes.Node] = []
    for index, part in enumerate(re.split(r"`([^`]+)`", text)):
        if part:
            out.append(nodes.literal(part, part) if index % 2 else nodes.Text(part))
    return out


def _entry(cell: Cell) -> nodes.entry:
    paragraph = nodes.paragraph()
    if isinstance(cell, str):
        paragraph.extend(code_spans(cell))
    else:
        paragraph.extend(cell)
    return nodes.entry("", paragraph)


def table(headers: Sequence[str], rows: Sequence[Sequence[Cell]],
          widths: Sequence[int] | None = None) -> nodes.table:
    """A table with one header row; ``widths`` are relative column widths."""
    group = nodes.tgroup(cols=len(headers))
    for width in widths or [1] * len(headers):
        group += nodes.colspec(colwidth=width)
    head = nodes.thead()
    head += nodes.row("", *(_entry(h) for h in headers))
    body = nodes.tbody()
    for row in rows:
        body += nodes.row("", *(_entry(cell) for cell in row))
    group += head
    group += body
    return nodes.table("", group)


def literal(text: str) -> list[nodes.Node]:
    """``text`` as inline code."""
    return [nodes.literal(text, text)]
