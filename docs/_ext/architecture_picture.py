"""The architecture picture, drawn from the code each time the docs build.

``scan()`` reads every module of ``fedleak/`` with :mod:`ast` (nothing is imported), puts it in
its *room* — a package or module directly under ``fedleak/``, or directly under
``fedleak/harness/``, which holds the processes — and records which room imports which (every
``import``, at module level or inside a function, as ``tests/project/test_architecture.py`` counts
them). ``draw()`` lays the rooms out in layers, each room above every room it imports, and
writes a PNG with matplotlib (Agg). The Sphinx hook writes ``docs/img/architecture.png``
(git-ignored) before any page is read, so docs/architecture.md always shows the rooms the code
has now, whatever they are called.

By hand: ``python docs/_ext/architecture_picture.py OUT.png``.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: the package whose children are rooms of their own (and not one room)
SPLIT = ("fedleak", "harness")


@dataclasses.dataclass
class Room:
    """One room: a dotted name, the modules in it and their lines of code."""

    name: str
    modules: list[str] = dataclasses.field(default_factory=list)
    lines: int = 0
    is_package: bool = False

    @property
    def label(self) -> str:
        """The room as a path under fedleak/: ``harness/victim/``, ``registry.py``, and
        ``__init__.py``, ``harness/__init__.py`` for the two packages' own modules."""
        parts = self.name.split(".")[1:]
        if self.name in ("fedleak", ".".join(SPLIT)):
            return "/".join([*parts, "__init__.py"])
        return "/".join(parts) + ("/" if self.is_package else ".py")


@dataclasses.dataclass
class Architecture:
    rooms: dict[str, Room]
    #: (importer room, imported room) → how many of the importer's modules import it
    edges: dict[tuple[str, str], int]


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room_name(module: str) -> str:
    """``fedleak.X`` for anything under fedleak/X, ``fedleak.harness.Y`` under harness/Y;
    the two packages' own ``__init__`` are rooms ``fedleak`` and ``fedleak.harness``."""
    parts = module.split(".")
    depth = len(SPLIT) + 1 if tuple(parts[: len(SPLIT)]) == SPLIT else 2
    return ".".join(parts[:depth])


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> Iterable[str]:
    """Every fedleak module ``tree`` imports (``from a import b`` gives ``a.b`` too, which the
    caller keeps only where it is a module)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "fedleak")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                head = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(head + ([base] if base else []))
            if base.split(".")[0] == "fedleak":
                yield base
                yield from (f"{base}.{a.name}" for a in node.names)


def scan(root: Path) -> Architecture:
    """The rooms of the package at ``root`` (a ``fedleak/`` folder) and their imports."""
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    modules = {module_name(p, root): p for p in files}
    rooms: dict[str, Room] = {}
    for module, path in modules.items():
        room = rooms.setdefault(room_name(module), Room(room_name(module)))
        room.modules.append(module)
        room.lines += len(path.read_text(encoding="utf-8").splitlines())
        if path.name == "__init__.py" and module == room.name:
            room.is_package = True
    edges: dict[tuple[str, str], int] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        source = room_name(module)
        targets = {room_name(m) for m in imported_modules(tree, module, path.name == "__init__.py")
                   if m in modules}
        for target in targets - {source}:
            edges[source, target] = edges.get((source, target), 0) + 1
    return Architecture(rooms, edges)


def layers(arch: Architecture) -> list[list[str]]:
    """Rooms in layers, top first: a room sits above every room it imports (longest path;
    an import cycle between rooms, should one appear, is cut where the walk meets it)."""
    below: dict[str, set[str]] = {r: set() for r in arch.rooms}
    for source, target in arch.edges:
        below[source].add(target)
    depth: dict[str, int] = {}
    on_path: set[str] = set()

    def height(room: str) -> int:
        if room in depth:
            return depth[room]
        on_path.add(room)
        h = 1 + max((height(t) for t in below[room] if t not in on_path), default=-1)
        on_path.discard(room)
        depth[room] = h
        return h

    for room in sorted(arch.rooms):
        height(room)
    top = max(depth.values(), default=0)
    out: list[list[str]] = [[] for _ in range(top + 1)]
    for room in sorted(arch.rooms):
        out[top - depth[room]].append(room)
    return _order(out, arch)


def _order(rows: list[list[str]], arch: Architecture) -> list[list[str]]:
    """Fewer crossings: each row sorted by the mean position of its neighbours (barycentres),
    a few sweeps down and up."""
    neighbours: dict[str, set[str]] = {r: set() for r in arch.rooms}
    for source, target in arch.edges:
        neighbours[source].add(target)
        neighbours[target].add(source)
    for sweep in range(6):
        position = {room: i / max(len(row) - 1, 1) for row in rows for i, room in enumerate(row)}
        sequence = range(1, len(rows)) if sweep % 2 == 0 else range(len(rows) - 2, -1, -1)
        for i in sequence:
            rows[i] = sorted(rows[i], key=lambda room, row=rows[i], at=position:
                             _barycentre(room, row, at, neighbours))
            position.update({room: j / max(len(rows[i]) - 1, 1) for j, room in enumerate(rows[i])})
    return rows


def _barycentre(room: str, row: list[str], position: dict[str, float],
                neighbours: dict[str, set[str]]) -> float:
    known = [position[n] for n in neighbours[room] if n not in row]
    return sum(known) / len(known) if known else position[room]


def draw(arch: Architecture, out: Path) -> None:
    """Boxes for rooms (harness rooms shaded apart), arrows importer → imported."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    rows = layers(arch)
    box_w, box_h, gap_x, gap_y = 2.3, 0.75, 0.45, 0.95
    width = max(len(row) for row in rows) * (box_w + gap_x)
    centre: dict[str, tuple[float, float]] = {}
    for i, row in enumerate(rows):
        span = len(row) * (box_w + gap_x) - gap_x
        for j, room in enumerate(row):
            x = (width - span) / 2 + j * (box_w + gap_x) + box_w / 2
            centre[room] = (x, -i * (box_h + gap_y))
    height = len(rows) * (box_h + gap_y)
    fig, ax = plt.subplots(figsize=(max(width, 6) * 0.95, height * 0.95 + 0.6))
    # Each room's arrows leave (and arrive) spread along its edge, in the order of the room at
    # the other end, so a bundle can be followed; they are drawn over the boxes, thin and
    # translucent, so one that passes a room is not read as ending there.
    leaving: dict[str, list[str]] = {r: [] for r in arch.rooms}
    arriving: dict[str, list[str]] = {r: [] for r in arch.rooms}
    for source, target in arch.edges:
        leaving[source].append(target)
        arriving[target].append(source)

    def anchor(room: str, others: list[str], other: str, dy: float) -> tuple[float, float]:
        ordered = sorted(others, key=lambda o: (centre[o][0], -centre[o][1]))
        k, n = ordered.index(other), len(ordered)
        x, y = centre[room]
        return x - 0.4 * box_w + 0.8 * box_w * (k + 1) / (n + 1), y + dy

    for (source, target), count in sorted(arch.edges.items()):
        start = anchor(source, leaving[source], target, -box_h / 2)
        end = anchor(target, arriving[target], source, box_h / 2)
        if centre[source][1] == centre[target][1]:  # same layer: only where a cycle was cut
            start, end = centre[source], centre[target]
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=8,
                                     lw=0.4 + 0.2 * min(count, 6), color="#3a3a3a", alpha=0.45,
                                     shrinkA=0, shrinkB=0, zorder=3.5))
    for name, room in arch.rooms.items():
        x, y = centre[name]
        harness = tuple(name.split(".")[: len(SPLIT)]) == SPLIT
        ax.add_patch(FancyBboxPatch((x - box_w / 2, y - box_h / 2), box_w, box_h,
                                    boxstyle="round,pad=0.02,rounding_size=0.08",
                                    fc="#dbe8f6" if harness else "#f6e7d2", ec="#333333", lw=0.8,
                                    zorder=3))
        count = len(room.modules)
        ax.text(x, y + 0.12, room.label, ha="center", va="center", fontsize=8.5,
                fontweight="bold", zorder=4)
        ax.text(x, y - 0.18, f"{count} module{'s' * (count != 1)}, {room.lines} lines",
                ha="center", va="center", fontsize=7, color="#333333", zorder=4)
    ax.set_xlim(-0.2, width + 0.2)
    ax.set_ylim(-height + gap_y / 2, box_h)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("fedleak/: rooms (blue: under harness/) and who imports whom (arrow: importer → "
                 "imported)", fontsize=9)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)


def _write_picture(app: Any) -> None:
    docs = Path(app.srcdir)
    draw(scan(docs.parent / "fedleak"), docs / "img" / "architecture.png")


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", _write_picture)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("architecture.png")
    draw(scan(Path(__file__).resolve().parents[2] / "fedleak"), target)
    print(target)
