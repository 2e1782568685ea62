"""Figures of the package's shape, read from its source with ``ast`` (nothing is imported).

    python bench/house_metrics.py                      # this checkout's fedleak/
    python bench/house_metrics.py --root OTHER/fedleak --top 8
    python bench/house_metrics.py --json               # one JSON object instead of text

What it counts (``fedleak/v1``, the generated gRPC code, left out):

- **modules per folder**: the ``.py`` files directly in each folder (``__init__.py`` included),
  the largest folders first;
- **rooms, arrows and floors of a package** (``--graph``, default ``attacks``), seen from its
  top: a room is a module directly in it or one of its sub-folders (all that folder's modules
  together); an arrow is one room importing another (``import`` and ``from ... import`` of a
  module of it, counted once per pair of rooms); a room stands one floor above the highest
  room it imports, floor 1 importing none. The same figures module by module follow
  (``modules``, ``module_arrows``, ``module_floors``);
- **long functions**: functions and methods of at least ``--long`` lines (50), from ``def`` to
  their last line, decorators left out;
- **many parameters**: functions and methods with more than ``--params`` (5) parameters,
  counting positional-only, ordinary and keyword-only ones, not ``*args``/``**kwargs``, nor a
  method's ``self``/``cls``;
- **Any**: every use of ``typing.Any`` (a name ``Any`` or an attribute ``.Any``) outside
  imports;
- **undocumented public definitions**: module-level functions and classes, and methods of
  public classes, whose name does not start with ``_`` and that have no docstring.
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "fedleak"
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def modules(root: Path) -> list[Path]:
    """Every module of the package but the generated gRPC code."""
    return sorted(p for p in root.rglob("*.py") if "v1" not in p.relative_to(root).parts[:1])


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def folder_sizes(root: Path) -> Counter[str]:
    """Folder (relative to the package's parent) → the ``.py`` files directly in it."""
    return Counter(str(p.parent.relative_to(root.parent)) for p in modules(root))


def imported(tree: ast.Module, name: str, is_package: bool) -> set[str]:
    """The modules (and module.name candidates) a module's imports name, absolute."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            out.add(base)
            out |= {f"{base}.{alias.name}" for alias in node.names}
    return out


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module → the modules of ``fedleak.<package>`` it imports (inside that package only)."""
    prefix = f"{root.name}.{package}"
    names = {module_name(root, p): p for p in modules(root)}
    inside = {n: p for n, p in names.items() if n == prefix or n.startswith(prefix + ".")}
    graph: dict[str, set[str]] = {}
    for name, path in inside.items():
        tree = ast.parse(path.read_text())
        targets = imported(tree, name, path.name == "__init__.py")
        graph[name] = {t for t in targets if t in inside and t != name}
    return graph


def rooms(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The module graph seen from the package's top: each sub-folder is one room."""
    def room(name: str) -> str:
        rest = name[len(package):].lstrip(".").split(".")
        return rest[0] if rest[0] else "__init__"

    folded: dict[str, set[str]] = {}
    for name, targets in graph.items():
        folded.setdefault(room(name), set()).update(room(t) for t in targets)
    return {name: targets - {name} for name, targets in folded.items()}


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Module → its floor (1 + the highest floor it imports).

    A cycle (folded rooms can make one) is cut where the walk, in name order, meets it again.
    """
    floor: dict[str, int] = {}

    def visit(node: str, path: frozenset[str]) -> int:
        if node not in floor:
            below = [visit(m, path | {node}) for m in sorted(graph[node]) if m not in path]
            floor[node] = 1 + max(below, default=0)
        return floor[node]

    for node in sorted(graph):
        visit(node, frozenset())
    return floor


Function = tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, bool]


def functions(root: Path) -> list[Function]:
    """(where, function, is a method) for every function of the package, nested ones too."""
    out: list[Function] = []
    for path in modules(root):
        where = str(path.relative_to(root.parent)) + ":"
        out += defined(ast.parse(path.read_text()), where, in_class=False)
    return out


def defined(node: ast.AST, prefix: str, in_class: bool) -> list[Function]:
    """The functions under ``node``, each once, named by where it is defined."""
    out: list[Function] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, FUNCTIONS):
            out.append((prefix + child.name, child, in_class))
            out += defined(child, f"{prefix}{child.name}.", in_class=False)
        elif isinstance(child, ast.ClassDef):
            out += defined(child, f"{prefix}{child.name}.", in_class=True)
        else:
            out += defined(child, prefix, in_class)
    return out


def length(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    return (function.end_lineno or function.lineno) - function.lineno + 1


def parameters(function: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> int:
    args = function.args
    named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    if method and named and named[0].arg in ("self", "cls"):
        named = named[1:]
    return len(named)


def any_uses(root: Path) -> int:
    count = 0
    for path in modules(root):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name) and node.id == "Any" \
                    or isinstance(node, ast.Attribute) and node.attr == "Any":
                count += 1
    return count


def undocumented(root: Path) -> tuple[int, int]:
    """(public definitions without a docstring, public definitions)."""
    missing = total = 0
    for path in modules(root):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (*FUNCTIONS, ast.ClassDef)) and not node.name.startswith("_"):
                total += 1
                missing += ast.get_docstring(node) is None
                if isinstance(node, ast.ClassDef):
                    for member in node.body:
                        if isinstance(member, FUNCTIONS) and not member.name.startswith("_"):
                            total += 1
                            missing += ast.get_docstring(member) is None
    return missing, total


def measure(root: Path, package: str, long: int, many: int, top: int) -> dict[str, object]:
    graph = import_graph(root, package)
    folded = rooms(graph, f"{root.name}.{package}")
    found = functions(root)
    longest = sorted(((length(f), w) for w, f, _ in found if length(f) >= long), reverse=True)
    widest = sorted(((parameters(f, m), w) for w, f, m in found if parameters(f, m) > many),
                    reverse=True)
    missing, public = undocumented(root)
    return {
        "modules": len(modules(root)),
        "largest_folders": folder_sizes(root).most_common(top),
        f"{package}_rooms": len(folded),
        f"{package}_arrows": sum(len(v) for v in folded.values()),
        f"{package}_floors": max(floors(folded).values(), default=0),
        f"{package}_modules": len(graph),
        f"{package}_module_arrows": sum(len(v) for v in graph.values()),
        f"{package}_module_floors": max(floors(graph).values(), default=0),
        f"functions_at_least_{long}_lines": len(longest),
        "longest_functions": longest[:top],
        f"functions_over_{many}_parameters": len(widest),
        "widest_functions": widest[:top],
        "any_uses": any_uses(root),
        "undocumented_public": f"{missing} of {public} ({100 * missing / max(public, 1):.0f} %)",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the package folder")
    parser.add_argument("--graph", default="attacks", help="sub-package whose imports to count")
    parser.add_argument("--long", type=int, default=50, help="a long function has this many lines")
    parser.add_argument("--params", type=int, default=5, help="more parameters than this is many")
    parser.add_argument("--top", type=int, default=5, help="rows of each list")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    figures = measure(args.root.resolve(), args.graph, args.long, args.params, args.top)
    if args.json:
        print(json.dumps(figures, indent=2, ensure_ascii=False))
        return
    for key, value in figures.items():
        if isinstance(value, list):
            print(f"{key}:")
            for count, where in value:
                print(f"  {count:5}  {where}")
        else:
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
