"""``fedleak sweep --help`` lists the presets of the preset folder, each with the one-line
``description`` of its ``[sweep]`` table: a toml added to the folder shows up, unedited code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from fedleak.harness.cli.main import main
from fedleak.harness.sweep.grid import spec


def help_text() -> str:
    """``fedleak sweep --help`` on one line (click's wrapping undone, hyphens joined)."""
    result = CliRunner().invoke(main, ["sweep", "--help"])
    assert result.exit_code == 0, result.output
    return re.sub(r"-\s+", "-", " ".join(result.output.split()))


def test_every_bundled_preset_is_listed_with_its_description() -> None:
    described = spec.preset_descriptions()
    assert set(described) == {p.name[:-5] for p in Path(spec.__file__).parent.parent.joinpath(
        "presets").iterdir() if p.name.endswith(".toml")}
    text = help_text()
    for name, description in described.items():
        assert description, name  # every bundled preset says what it measures
        assert f"{name} ({' '.join(description.split())})" in text, (name, text)


def test_a_new_toml_in_the_preset_folder_shows_up(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "quick.toml").write_text(spec.preset_text("quick"))
    mine = re.sub(r'(?m)^description = .*$', "", spec.preset_text("quick"))
    (tmp_path / "mine.toml").write_text(mine.replace(
        'name = "quick"', 'name = "mine"\ndescription = "my own grid, on digits"', 1))
    monkeypatch.setattr(spec, "preset_folder", lambda: tmp_path)
    text = help_text()
    assert "mine (my own grid, on digits)" in text, text
    assert "text-quick" not in text  # the list is the folder's, not a string in the code
    assert spec.load_preset("mine").name == "mine"
