"""README.md is the entrance: short, and every file it links to exists.

Issue 32: at most 200 lines; the details live in docs/ (the user guide, the measured figures,
the tutorials), so a link that points nowhere would strand a newcomer at the door.
"""

from __future__ import annotations

import re

from tests.paths import REPO

ROOT = REPO
README = ROOT / "README.md"
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_is_at_most_200_lines() -> None:
    assert len(README.read_text().splitlines()) <= 200


def test_every_relative_link_in_the_readme_exists() -> None:
    targets = [t.split("#", 1)[0] for t in _LINK.findall(README.read_text())
               if not t.startswith(("http://", "https://", "#"))]
    assert targets, "the README links to its docs"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_the_readme_names_the_test_command_ci_runs() -> None:
    assert "make test" in README.read_text()
    assert "make test" in (ROOT / ".ci" / "run").read_text()
