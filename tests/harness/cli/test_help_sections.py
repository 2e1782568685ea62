"""``--help`` by concern: a :class:`SectionedCommand` lists each concern's options under its
heading, in the order given, and the lone ones first; ``fedleak victim serve`` reads so."""

from __future__ import annotations

import re
from dataclasses import dataclass

import click
import pytest
from click.testing import CliRunner

from fedleak.harness.cli.help_sections import SectionedCommand, section_names
from fedleak.harness.cli.main import main
from fedleak.harness.cli.options import packed


@dataclass(frozen=True)
class Colour:
    hue: int
    shade: str


@dataclass(frozen=True)
class Size:
    width: int


def headed(text: str) -> dict[str, list[str]]:
    """Help text → {heading: the flags listed under it}, headings in order of appearance."""
    out: dict[str, list[str]] = {}
    heading = None
    for line in text.splitlines():
        if re.fullmatch(r"[A-Z][^:]*:", line):
            heading = line[:-1]
            out[heading] = []
        elif heading and (match := re.match(r"\s{2}(-\w, )?(--[\w-]+)", line)):
            out[heading].append(match.group(2))
    return out


def test_options_are_listed_under_their_concern_in_order() -> None:
    @click.command(cls=SectionedCommand, sections=[("Size", Size), ("Colour", Colour)])
    @click.option("--verbose", is_flag=True, help="Say more.")
    @packed(Colour, "colour", [click.option("--hue", default=1, help="Hue."),
                               click.option("--shade", default="dark", help="Shade.")])
    @packed(Size, "size", [click.option("--width", default=2, help="Width.")])
    def paint(verbose: bool, colour: Colour, size: Size) -> None:
        click.echo(f"{colour.hue} {colour.shade} {size.width} {verbose}")

    runner = CliRunner()
    result = runner.invoke(paint, ["--help"])
    assert result.exit_code == 0, result.output
    assert headed(result.output) == {"Options": ["--verbose", "--help"], "Size": ["--width"],
                                     "Colour": ["--hue", "--shade"]}
    assert runner.invoke(paint, ["--hue", "3", "--width", "4"]).output == "3 dark 4 False\n"


def test_an_option_in_two_sections_is_refused() -> None:
    with pytest.raises(AssertionError, match="hue"):
        SectionedCommand("x", sections=[("A", Colour), ("B", Colour)])


def test_victim_serve_help_reads_by_concern() -> None:
    command = main.commands["victim"].commands["serve"]  # type: ignore[attr-defined]
    result = CliRunner().invoke(main, ["victim", "serve", "--help"])
    assert result.exit_code == 0, result.output
    listed = headed(result.output)
    titles = [title for title, _ in command.sections]
    assert list(listed) == ["Options", *titles]
    assert listed["Options"] == ["--settings", "--help"]
    for title, into in command.sections:
        params = {p.name: p for p in command.params}
        assert listed[title] == [params[name].opts[0] if params[name].opts[0].startswith("--")
                                 else params[name].opts[1] for name in section_names(into)]
    assert {"Private data", "Model", "Protocol", "Defenses", "Audit games",
            "Wire limits"} <= set(titles)
