"""A command whose ``--help`` lists its options by concern, one heading each.

A concern is a typed options object (a dataclass whose fields are its options' parameter
names, handed to the command by :func:`~fedleak.harness.cli.options.packed`); the command
is declared with ``cls=SectionedCommand, sections=[("Private data", DataOptions), ...]``, and
``--help`` prints first what no concern holds (a lone option, ``--help`` itself) under
"Options", then each concern's options under its title, in that order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import click

#: One heading of ``--help``: its title and the typed options object whose fields it lists.
Section = tuple[str, type[Any]]


def section_names(into: type[Any]) -> tuple[str, ...]:
    """The parameter names a concern's options object holds (its dataclass fields)."""
    return tuple(field.name for field in dataclasses.fields(into))


class SectionedCommand(click.Command):
    """A :class:`click.Command` whose help lists options under their concern's heading."""

    def __init__(self, *args: Any, sections: Sequence[Section], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sections = tuple(sections)
        names = [name for _, into in self.sections for name in section_names(into)]
        twice = sorted({name for name in names if names.count(name) > 1})
        assert not twice, f"options in more than one section of --help: {twice}"

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records = {param.name: row for param in self.get_params(ctx)
                   if (row := param.get_help_record(ctx)) is not None}
        held = {name for _, into in self.sections for name in section_names(into)}
        headed = [("Options", [row for name, row in records.items() if name not in held])]
        headed += [(title, [records[name] for name in section_names(into) if name in records])
                   for title, into in self.sections]
        for title, rows in headed:
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)
