"""The CLI reference (docs/reference/cli.md) lists every command and every option of `fedleak`.

The page is sphinx-click's rendering of the click group, so this renders the page's own click
directive with sphinx-click (text builder, a temporary project holding only that directive) and
looks for each command's usage line and each option's flags in the section of that command. A
hidden command or option, a `:commands:` filter on the directive, or a command whose parameters
sphinx-click cannot render all fail here. (`make docs`, run by `make test`, builds the whole
site with warnings as errors.)
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import click
import pytest

from fedleak.harness.cli.main import main
from tests.paths import REPO

# sphinx-click 6.2 reads BuildEnvironment.app, which Sphinx 9 deprecates (for Sphinx 11)
pytestmark = pytest.mark.filterwarnings(
    "ignore:'sphinx.environment.BuildEnvironment.app' is deprecated")

CLI_PAGE = REPO / "docs" / "reference" / "cli.md"
PROG = "fedleak"


def click_directive() -> str:
    """The ``.. click::`` directive of the CLI page, as the page writes it."""
    match = re.search(r"```\{eval-rst\}\n(\.\. click::.*?)```", CLI_PAGE.read_text(), re.S)
    assert match, f"{CLI_PAGE} has no ```{{eval-rst}} block with a `.. click::` directive"
    return match.group(1)


def commands(group: click.Command, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], click.Command]]:
    """Every command under ``group`` (the group itself first) with its path of names."""
    yield path, group
    if isinstance(group, click.Group):
        for name, command in sorted(group.commands.items()):
            yield from commands(command, (*path, name))


def flags(param: click.Parameter) -> list[str]:
    """What the reference must show of a parameter: an option's flags, an argument's metavar
    (its name in capitals when it sets none)."""
    if isinstance(param, click.Option):
        return [*param.opts, *param.secondary_opts]
    return [param.metavar or (param.name or "").upper()]


def sections(text: str) -> dict[str, str]:
    """sphinx-click's text output cut per command: usage line ``fedleak a b [...]`` → the
    text of that command up to the next usage block."""
    parts = text.split("-[ Usage ]-")[1:]
    out = {}
    for part in parts:
        usage = part.strip().splitlines()[0].strip()
        words = usage.split()
        command = " ".join(w for w in words if re.fullmatch(r"[a-z][a-z0-9-]*", w))
        out[command] = part
    return out


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    sphinx_application = pytest.importorskip(
        "sphinx.application", reason="the docs extra (pip install -e '.[docs]') builds the docs")
    pytest.importorskip("sphinx_click", reason="the docs extra installs sphinx-click")
    root = tmp_path_factory.mktemp("cli-docs")
    (root / "conf.py").write_text('extensions = ["sphinx_click"]\n')
    (root / "index.rst").write_text("CLI\n===\n\n" + click_directive())
    app = sphinx_application.Sphinx(str(root), str(root), str(root / "out"), str(root / "tree"),
                                    "text", status=None, warning=None, freshenv=True)
    app.build()
    return sections((root / "out" / "index.txt").read_text())


def test_every_command_has_a_section(rendered: dict[str, str]) -> None:
    missing = [" ".join((PROG, *path)) for path, _ in commands(main)
               if " ".join((PROG, *path)) not in rendered]
    assert not missing, f"commands missing from the CLI reference: {', '.join(missing)}"


def test_every_option_appears_under_its_command(rendered: dict[str, str]) -> None:
    missing = []
    for path, command in commands(main):
        name = " ".join((PROG, *path))
        section = rendered.get(name, "")
        # entries start at column 0: an option's flags ("-o, --option <option>"), an
        # argument's metavar ("[SPEC.toml]")
        entries = [line for line in section.splitlines() if line and not line[0].isspace()]
        defined = {*entries, *(token for line in entries if line.startswith("-")
                               for token in re.split(r"[,/ ]+", line) if token)}
        for param in command.params:
            if param.name == "help":
                continue
            missing += [f"{name} {flag}" for flag in flags(param) if flag not in defined]
    assert not missing, f"options missing from the CLI reference: {', '.join(missing)}"


def test_the_tree_walked_is_the_whole_cli() -> None:
    """The walk above sees the subcommands of groups (e.g. ``victim serve``), so a command
    added to any group is checked."""
    paths = {path for path, _ in commands(main)}
    assert ("victim", "serve") in paths and ("attack",) in paths
    assert len(paths) >= 10
