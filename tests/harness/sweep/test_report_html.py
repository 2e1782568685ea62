"""The sweep report as a person sees it: ``report.html`` rendered by headless Chromium.

A tiny sweep (two points, two attacked rounds each, real victim processes) is reported, then:

1. Chromium dumps the page's DOM; every ``<img>`` it lists must resolve, relative to the page,
   to an existing non-empty PNG, and the charts, one grid per point and the results table must
   be there;
2. Chromium loads the page inside a checking page (file access allowed) whose script records,
   for every image, whether the browser decoded it and its natural size: all must be loaded;
3. a screenshot of the page is taken (kept in the test's tmp folder to look at).

Needs Debian's Chromium: ``apt-get install -y --no-install-recommends chromium``; the test is
skipped with that hint when no Chromium is installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from fedleak.harness.sweep.grid.spec import parse_spec
from fedleak.harness.sweep.report.folder import write_report
from fedleak.harness.sweep.runner import SweepOptions, run_sweep
from tests.helpers import tiny_spec

pytestmark = pytest.mark.e2e
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")
SPEC = tiny_spec('[[sweep.defense]]\nname = "dpsgd"\nparam = "noise-multiplier"\nvalues = [1.0]',
                 rounds=2, name="html")
CHECK_PAGE = """<!doctype html><html><body>
<iframe id="page" src="report.html" width="1200" height="900"></iframe>
<pre id="result">pending</pre>
<script>
document.getElementById("page").addEventListener("load", function () {
  var images = Array.prototype.slice.call(this.contentDocument.images);
  document.getElementById("result").textContent = JSON.stringify(images.map(function (i) {
    return [i.getAttribute("src"), i.complete, i.naturalWidth, i.naturalHeight];
  }));
});
</script></body></html>
"""


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.sources.append(dict(attrs).get("src") or "")


@pytest.fixture(scope="module")
def browser() -> str:
    """The Chromium executable (the test is skipped, with the install line, without one)."""
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no Chromium to render the report: install it with "
                "`apt-get update && apt-get install -y --no-install-recommends chromium`")


def _chromium(browser: str, profile: Path, *args: str) -> str:
    done = subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.fixture(scope="module")
def report(browser: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("sweep") / "run"
    outcome = run_sweep(parse_spec(SPEC), run_dir, SweepOptions(show_progress=False),
                        echo=lambda _: None)
    assert not outcome.failed, outcome.failed
    dp = next(p for p in parse_spec(SPEC).points() if p.defenses)
    return write_report(run_dir, audited={dp.point_id: 0.25})  # an audit's ε_LB (optional)


def test_report_renders_in_headless_chromium_with_every_image(browser: str, report: Path,
                                                               tmp_path: Path) -> None:
    dom = _chromium(browser, tmp_path / "profile-dom", "--dump-dom", report.as_uri())
    parser = _Images()
    parser.feed(dom)
    sources = parser.sources
    assert "report/privacy-utility.png" in sources and "report/strength.png" in sources
    assert "report/bounds.png" in sources and "DP points from both sides" in dom
    bounds = (report.parent / "report" / "bounds.csv").read_text().splitlines()
    assert len(bounds) == 2 and ",0.25," in bounds[1]  # the audited ε_LB, drawn and listed
    assert sum(s.startswith("report/grids/") for s in sources) == 2  # one grid per point
    for source in sources:
        path = report.parent / source
        assert path.is_file(), f"<img src={source!r}> does not resolve"
        data = path.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 1000, source
    assert re.search(r"<table>.*no defense.*dpsgd noise-multiplier=1\.0.*</table>", dom, re.S)
    assert "results.csv" in dom

    checker = report.parent / "check-images.html"
    checker.write_text(CHECK_PAGE)
    dom = _chromium(browser, tmp_path / "profile-check", "--allow-file-access-from-files",
                    "--virtual-time-budget=15000", "--dump-dom", checker.as_uri())
    found = re.search(r'<pre id="result">(.*?)</pre>', dom, re.S)
    assert found and found.group(1) != "pending", "the report page did not load in Chromium"
    loaded = json.loads(found.group(1))
    assert [src for src, *_ in loaded] == sources
    broken = [src for src, complete, width, height in loaded
              if not (complete and width > 0 and height > 0)]
    assert not broken, f"images Chromium could not show: {broken}"

    screenshot = tmp_path / "report.png"
    _chromium(browser, tmp_path / "profile-shot", "--window-size=1280,3000",
              f"--screenshot={screenshot}", report.as_uri())
    assert screenshot.read_bytes().startswith(PNG_SIGNATURE)
    assert screenshot.stat().st_size > 20_000  # a rendered page, not a blank one
