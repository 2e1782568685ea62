"""Where the repository's parts lie, for tests at any depth of ``tests/``."""

from __future__ import annotations

from pathlib import Path

#: the repository's root (the folder holding ``fedleak/``, ``tests/``, ``docs/``)
REPO = Path(__file__).resolve().parents[1]
#: the tests' own folder
TESTS = REPO / "tests"
