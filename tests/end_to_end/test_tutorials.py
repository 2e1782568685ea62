"""The tutorials' commands, run as the pages write them.

A page's fenced blocks are read in order: a ``python`` or ``text`` block whose first line is
``# path/to/file`` is a file the reader writes (the rest of the block), a ``console`` block
holds ``$ command`` lines, each followed by the output the page shows. Every command runs in a
fresh folder, ``.venv/bin/fedleak`` as ``python -m fedleak`` of this checkout, its leading
``VAR=value`` words as its environment (``PYTHONPATH`` folders resolved in that folder). What
a run must reproduce is what does not depend on the machine: its exit status (3 where the
page passes ``--fail-on-violation`` and shows a violation, else 0), an audit's ``coverage:``
and ``claimed:`` lines and the kind of its verdict, and every other command's output lines
verbatim (``...`` marks a cut). Figures that vary with the CPU are not compared.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
TUTORIALS = REPO / "docs" / "tutorials"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
#: generous: an audit took 2 minutes at a load average of 15 on 2 cores (victim start included)
COMMAND_TIMEOUT = 1800


@dataclass(frozen=True)
class File:
    path: str
    text: str


@dataclass(frozen=True)
class Command:
    words: tuple[str, ...]
    shown: tuple[str, ...]

    @property
    def env(self) -> dict[str, str]:
        return {k: v for k, _, v in (w.partition("=") for w in self.words[:self._start()])}

    @property
    def argv(self) -> tuple[str, ...]:
        return self.words[self._start():]

    def _start(self) -> int:
        return next(i for i, w in enumerate(self.words) if not re.match(r"[A-Z_]+=", w))


def steps(page: Path) -> list[File | Command]:
    """The page's files and commands, in the order a reader meets them."""
    out: list[File | Command] = []
    for language, body in FENCE.findall(page.read_text()):
        lines = body.splitlines()
        if language in ("python", "text") and lines and re.match(r"# [\w.-]+/", lines[0]):
            out.append(File(lines[0][2:].strip(), "\n".join(lines[1:]) + "\n"))
        elif language == "console":
            out += commands(lines)
    return out


def commands(lines: list[str]) -> list[Command]:
    """``$ command`` lines (with ``\\`` continuations) and the output shown under each."""
    found: list[tuple[list[str], list[str]]] = []
    continued = False
    for line in lines:
        if line.startswith("$ ") or continued:
            text = line[2:] if line.startswith("$ ") else line
            if not continued:
                found.append(([], []))
            found[-1][0].append(text.rstrip("\\").strip())
            continued = line.endswith("\\")
        elif found:
            found[-1][1].append(line)
    return [Command(tuple(shlex.split(" ".join(words))), tuple(shown))
            for words, shown in found]


def run(command: Command, folder: Path) -> subprocess.CompletedProcess[str]:
    assert command.argv[0] == ".venv/bin/fedleak", f"not a fedleak command: {command.argv}"
    extra = [str(folder / p) for p in command.env.get("PYTHONPATH", "").split(":") if p]
    env = {**os.environ, **command.env, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([*extra, str(REPO)])}
    return subprocess.run([sys.executable, "-m", "fedleak", *command.argv[1:]], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)


def check(command: Command, result: subprocess.CompletedProcess[str]) -> None:
    """What a run must reproduce of what the page shows (module docstring)."""
    said = f"{' '.join(command.argv)}\n{result.stdout}\n{result.stderr[-3000:]}"
    violation = any(line.startswith("VIOLATION") for line in command.shown)
    expected = 3 if violation and "--fail-on-violation" in command.argv else 0
    assert result.returncode == expected, said
    got = result.stdout.splitlines()
    if command.argv[1] == "audit":
        for prefix in ("coverage:", "claimed:"):
            assert [s for s in command.shown if s.startswith(prefix)] == \
                [g for g in got if g.startswith(prefix)], said
        verdict = "VIOLATION" if violation else "no violation found"
        assert any(g.startswith(verdict) for g in got), said
    else:
        missing = [s for s in command.shown if s.strip() and s != "..." and s not in got]
        assert not missing, f"{missing}\n{said}"


def test_the_audit_tutorial_runs_as_written(tmp_path: Path) -> None:
    page = steps(TUTORIALS / "audit-your-defense.md")
    assert [type(s) for s in page].count(Command) == 3 and any(isinstance(s, File) for s in page)
    for step in page:
        if isinstance(step, File):
            (tmp_path / step.path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / step.path).write_text(step.text)
        else:
            check(step, run(step, tmp_path))


def test_the_first_hour_runs_one_audit(tmp_path: Path) -> None:
    audits = [s for s in steps(TUTORIALS / "first-hour.md")
              if isinstance(s, Command) and s.argv[:2] == (".venv/bin/fedleak", "audit")]
    assert len(audits) == 1
    check(audits[0], run(audits[0], tmp_path))


def test_the_page_reader_finds_files_commands_and_their_output() -> None:
    page = (TUTORIALS / "audit-your-defense.md").read_text()
    first = steps(TUTORIALS / "audit-your-defense.md")[0]
    assert isinstance(first, File) and first.path == "my_defense/fedleak_my_noise.py"
    assert first.text.startswith('"""My defense') and first.text in page
    (listed,) = commands(["$ A=b .venv/bin/fedleak list \\", "      --x 'y z'", "out", "..."])
    assert listed.env == {"A": "b"} and listed.argv == (".venv/bin/fedleak", "list", "--x", "y z")
    assert listed.shown == ("out", "...")
