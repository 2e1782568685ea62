"""The package's rooms and the one direction imports may point, checked on the source with ``ast``.

The rule is written once, as data (:data:`MAY_IMPORT`): each room lists the rooms its modules
may import. Every import counts, at module level or inside a function. Also checked: every
module imports; no module imports a private (``_name``) from another module; no import cycle
between modules. docs/architecture.md draws the same picture, and names every module.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

from tests.paths import REPO

PACKAGE = REPO / "fedleak"

_BASE = {"fedleak", "fedleak.registry"}
_ALGORITHMS = _BASE | {"fedleak.attacks", "fedleak.defenses", "fedleak.auditing"}
_ZOO = _ALGORITHMS | {"fedleak.harness.zoo"}
#: process-free code both sides use: FL semantics, the zoo, metrics
_PROCESS_FREE = _ZOO | {"fedleak.harness.federated", "fedleak.harness.metrics"}
_WIRE = _PROCESS_FREE | {"fedleak.harness.wire", "fedleak.v1"}
_PROCESSES = {"fedleak.harness.victim", "fedleak.harness.attacker",
              "fedleak.harness.remote_defense"}

#: room → the rooms its modules may import (a room may always import itself).
MAY_IMPORT: dict[str, set[str]] = {
    # the package's short entry points (``fedleak.observe``), imported lazily
    "fedleak": {"fedleak.harness.federated"},
    "fedleak.__main__": {"fedleak.harness.cli"},
    # the Flower bridge's public names from a short path, imported lazily
    "fedleak.flower": {"fedleak.harness.flower"},
    "fedleak.registry": set(),
    "fedleak.v1": set(),
    "fedleak.attacks": _BASE,
    "fedleak.defenses": _BASE,
    "fedleak.auditing": _BASE,
    "fedleak.harness": set(),
    # the model and data zoo; federated learning's semantics; metrics (peers over the zoo)
    "fedleak.harness.zoo": _ALGORITHMS,
    "fedleak.harness.federated": _ZOO,
    "fedleak.harness.metrics": _ZOO,
    "fedleak.harness.wire": _PROCESS_FREE | {"fedleak.v1"},
    # the processes: none may import another
    "fedleak.harness.victim": _WIRE,
    "fedleak.harness.attacker": _WIRE,
    "fedleak.harness.remote_defense": _WIRE,
    "fedleak.harness.sweep": _WIRE | {"fedleak.harness.victim", "fedleak.harness.attacker"},
    # the Flower bridge: the only room that imports flwr (its attacker and victim sides)
    "fedleak.harness.flower": _WIRE | {"fedleak.harness.victim", "fedleak.harness.attacker"},
    "fedleak.harness.cli": _WIRE | _PROCESSES | {"fedleak.harness.sweep", "fedleak.harness.flower"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room_of(module: str) -> str:
    """The longest room name that is ``module`` or a package above it."""
    candidates = [r for r in MAY_IMPORT if module == r or module.startswith(r + ".")]
    assert candidates, f"{module} lies in no room: add it to MAY_IMPORT"
    return max(candidates, key=len)


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every fedleak import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path) if path.name == "__init__.py" else \
        module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names
                      if a.name.split(".")[0] == "fedleak"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            if base.split(".")[0] == "fedleak":
                found.append((base, [a.name for a in node.names], node.lineno))
    return found


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if "v1" not in p.relative_to(PACKAGE).parts)


def test_every_module_imports() -> None:
    for path in SOURCES:
        if path.name != "__main__.py":
            importlib.import_module(module_name(path))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path: Path) -> None:
    here = room_of(module_name(path))
    allowed = MAY_IMPORT[here] | {here}
    for target, names, line in imports(path):
        for full in [target] + [f"{target}.{n}" for n in names]:
            if importlib.util.find_spec(full.rsplit(".", 1)[0]) is None:
                continue
            there = room_of(full) if _is_module(full) else room_of(target)
            assert there in allowed, (f"{path.relative_to(PACKAGE)}:{line} ({here}) imports "
                                      f"{full} from room {there}, which it may not")


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_name_crosses_files(path: Path) -> None:
    for target, names, line in imports(path):
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        assert not private, (f"{path.relative_to(PACKAGE)}:{line} imports private {private} "
                             f"from {target}: make it a public function of that module")


def test_no_import_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for path in SOURCES:
        name = module_name(path)
        edges = set()
        for target, names, _ in imports(path):
            for full in [f"{target}.{n}" for n in names] + [target]:
                if _is_module(full):
                    edges.add(full)
                    break
        graph[name] = {e for e in edges if e != name and not name.startswith(e + ".")}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                cycle = trail[trail.index(nxt):] + [nxt] if nxt in trail else [node, nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def test_only_the_flower_room_imports_flwr() -> None:
    """flwr is an optional dependency (fedleak[flower]): every other room works without it."""
    flower = PACKAGE / "harness" / "flower"
    for path in SOURCES:
        if flower in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.split(".")[0] == "flwr" for n in names), \
                f"{path} imports flwr: only fedleak/harness/flower may"


def test_short_entry_points_are_the_harness_functions_imported_on_first_use() -> None:
    """``fedleak.observe`` is the federated room's ``observe``; importing ``fedleak`` alone does
    not import the federated room."""
    import subprocess
    import sys

    import fedleak
    from fedleak.harness.federated.observe import observe

    assert fedleak.observe is observe
    code = "import sys, fedleak; print('fedleak.harness.federated' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=PACKAGE.parent)
    assert done.stdout.strip() == "False"
    with pytest.raises(AttributeError):
        fedleak.no_such_entry_point  # noqa: B018


ARCHITECTURE_PAGE = PACKAGE.parent / "docs" / "architecture.md"


def documented_files() -> dict[str, set[str]]:
    """Room folder (``harness/zoo/``, ``fedleak/`` for the top) → the ``*.py`` files its rows of
    the architecture page's table name."""
    rooms: dict[str, set[str]] = {}
    for line in ARCHITECTURE_PAGE.read_text().splitlines():
        if not line.startswith("|"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 2:
            continue
        for folder in re.findall(r"`([\w/]+/)`", cells[0]):
            rooms.setdefault(folder, set()).update(re.findall(r"`(\w+\.py)`", cells[1]))
    return rooms


def test_every_module_is_named_on_the_architecture_page() -> None:
    """Each file under fedleak/ is in its room's row of docs/architecture.md: a new or renamed
    module is described where a newcomer looks, or this fails."""
    rooms = documented_files()
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        folder = "/".join(relative.parts[:-1]) + "/" if len(relative.parts) > 1 else "fedleak/"
        if path.name not in rooms.get(folder, set()):
            missing.append(f"{relative} (row `{folder}`)")
    assert not missing, "docs/architecture.md does not name: " + ", ".join(missing)
    stale = [f"{folder}{name}" for folder, names in rooms.items() for name in names
             if not (PACKAGE / folder / name if folder != "fedleak/" else PACKAGE / name).exists()]
    assert not stale, "docs/architecture.md names files that do not exist: " + ", ".join(stale)


def test_every_module_file_name_is_unique() -> None:
    """A file name found in a traceback or a search is one file (``__init__.py`` aside)."""
    seen: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            seen.setdefault(path.name, []).append(str(path.relative_to(PACKAGE.parent)))
    assert not {name: where for name, where in seen.items() if len(where) > 1}
