"""The architecture picture of the docs (docs/_ext/architecture_picture.py) is drawn from the
code: every room under fedleak/ is in it, with an arrow for an import the code makes."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.paths import REPO

ROOT = REPO
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import architecture_picture as picture  # noqa: E402


def rooms_on_disk() -> set[str]:
    """What the picture must show: each package or module directly under fedleak/ (harness/
    split into its own children), read from the file system, not from the scanner."""
    package = ROOT / "fedleak"
    harness = package / "harness"
    rooms = {"fedleak"}
    for parent, prefix in ((package, "fedleak"), (harness, "fedleak.harness")):
        for child in sorted(parent.iterdir()) if parent.is_dir() else []:
            if child.name in ("__init__.py", "__pycache__") or child == harness:
                continue
            if child.suffix == ".py" or (child.is_dir() and any(child.rglob("*.py"))):
                rooms.add(f"{prefix}.{child.name.removesuffix('.py')}")
    if (harness / "__init__.py").exists():
        rooms.add("fedleak.harness")
    return rooms


def test_every_room_is_in_the_picture_with_its_imports(tmp_path: Path) -> None:
    arch = picture.scan(ROOT / "fedleak")
    assert set(arch.rooms) == rooms_on_disk()
    # known imports: attacks register through fedleak.registry; the CLI starts the victim
    assert ("fedleak.attacks", "fedleak.registry") in arch.edges
    assert ("fedleak.harness.cli", "fedleak.harness.victim") in arch.edges
    # every module is in exactly one room, and nothing imports itself
    modules = [m for room in arch.rooms.values() for m in room.modules]
    assert len(modules) == len(set(modules)) == len(list((ROOT / "fedleak").rglob("*.py")))
    assert all(source != target for source, target in arch.edges)
    # every room is drawn in one layer, above the rooms it imports
    rows = picture.layers(arch)
    layer = {room: i for i, row in enumerate(rows) for room in row}
    assert set(layer) == set(arch.rooms)
    assert all(layer[s] < layer[t] for s, t in arch.edges)
    out = tmp_path / "architecture.png"
    picture.draw(arch, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rooms_follow_new_packages(tmp_path: Path) -> None:
    """A room that did not exist when the picture was written appears with its imports."""
    package = tmp_path / "fedleak"
    for folder in ("", "harness", "harness/newroom", "zoo"):
        (package / folder).mkdir(parents=True, exist_ok=True)
        (package / folder / "__init__.py").write_text("")
    (package / "harness" / "newroom" / "semantics.py").write_text(
        "from ...zoo import models\n\ndef f():\n    import fedleak.zoo\n")
    (package / "zoo" / "models.py").write_text("X = 1\n")
    arch = picture.scan(package)
    assert set(arch.rooms) == {"fedleak", "fedleak.harness", "fedleak.harness.newroom",
                               "fedleak.zoo"}
    assert arch.edges == {("fedleak.harness.newroom", "fedleak.zoo"): 1}
