"""Every paper the code or the docs cite is in the bibliography.

A citation is written ``Surname et al.``, ``Surname & Surname`` or ``Surname, Surname &
Surname`` in a docstring, a comment or a docs page. The check reads ``fedleak/``, ``bench/``,
``examples/`` and ``docs/`` and warns (an error under ``-W``), naming the file and line, for
every first author the bibliography page does not name, so a new attack cannot land without
its reference.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util import logging

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
BIBLIOGRAPHY = ROOT / "docs" / "reference" / "bibliography.md"
SOURCES = [("fedleak", "*.py"), ("bench", "*.py"), ("examples", "*.py"), ("docs", "*.md")]
GENERATED = ROOT / "fedleak" / "v1"
# "Surname et al.", "Surname & Surname", "Surname, Surname & Surname": the first author
CITATION = re.compile(r"\b([A-Z][a-zA-Z\-]+)(?: et al\b|(?:, [A-Z][a-zA-Z\-]+)* & [A-Z][a-z]+\b)")


def citations() -> dict[str, str]:
    """First author → where it is first cited (``path:line``)."""
    found: dict[str, str] = {}
    for folder, pattern in SOURCES:
        for path in sorted((ROOT / folder).rglob(pattern)):
            if path == BIBLIOGRAPHY or GENERATED in path.parents:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for match in CITATION.finditer(line):
                    found.setdefault(match.group(1), f"{path.relative_to(ROOT)}:{number}")
    return found


def check(app: Sphinx, env: BuildEnvironment) -> None:
    listed = BIBLIOGRAPHY.read_text(encoding="utf-8")
    for author, where in sorted(citations().items()):
        if not re.search(rf"\b{re.escape(author)}\b", listed):
            logger.warning("%s cites %s, whom docs/reference/bibliography.md does not list; "
                           "add the paper (with its arXiv id)", where, author)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("env-check-consistency", check)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
