"""Docs figures agree with the result files they are rendered from (bench/doc_figures.py).

Every ``<!-- figures: RENDERER results/FILE -->`` block of every docs page must read exactly
what its renderer writes from the committed result file; a figure edited by hand, or a result
file replaced without re-rendering, fails here and names the block.
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers import load_bench_script

FIGURES = load_bench_script("doc_figures")


def test_every_docs_figure_block_matches_its_result_file() -> None:
    pages = [page for page in FIGURES.DOCS.rglob("*.md") if FIGURES.blocks(page)]
    assert len(pages) >= 3, "the figure blocks of honest_batches.md, bounds.md, sweeps.md"
    assert FIGURES.check() == []


def test_a_figure_that_drifts_from_its_file_is_named(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    source = FIGURES.DOCS / "results" / "informed-game.json"
    (results / "informed-game.json").write_text(source.read_text())
    right = FIGURES.rendered("informed-game", results / "informed-game.json")
    page = tmp_path / "page.md"
    page.write_text(f"<!-- figures: informed-game results/informed-game.json -->\n{right}"
                    "<!-- /figures -->\n")
    assert FIGURES.check(tmp_path) == []
    page.write_text(page.read_text().replace(right.split()[0], "60/200", 1))
    assert any("differs" in p for p in FIGURES.check(tmp_path))
    FIGURES.write(tmp_path)
    assert FIGURES.check(tmp_path) == []
    (results / "informed-game.json").unlink()
    assert any("not committed" in p for p in FIGURES.check(tmp_path))
