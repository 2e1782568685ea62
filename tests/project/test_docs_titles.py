"""No two pages of the docs site share a title: a reader choosing from the navigation or a
search result must be able to tell pages apart by their titles alone."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from tests.paths import REPO

DOCS = REPO / "docs"


def page_title(path: Path) -> str | None:
    """The page's first level-one Markdown heading (outside code fences), or None."""
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("# "):
            return line[2:].strip()
    return None


def test_no_two_pages_share_a_title() -> None:
    pages: dict[str, list[str]] = defaultdict(list)
    for path in sorted(DOCS.rglob("*.md")):
        if "_build" in path.parts:
            continue
        title = page_title(path)
        if title:
            pages[title.lower()].append(str(path.relative_to(DOCS)))
    shared = {title: paths for title, paths in pages.items() if len(paths) > 1}
    assert not shared, f"pages that share a title (rename one): {shared}"


def test_the_title_finder_skips_code(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("```bash\n# a comment\n```\n# The title\n")
    assert page_title(page) == "The title"
