"""One spelling of optimiser in the algorithm rooms' code: British in every identifier.

``optimizer`` stays only where it is a public name a user types or reads — the option
``-o optimizer=…`` (a config field), the parts registry's kind and the ``optimizer`` key of a
result's extras — and in third-party names (``torch.optim.Optimizer``, Opacus's
``DPOptimizer``).
"""

from __future__ import annotations

import ast

from tests.paths import REPO

ROOMS = [REPO / "fedleak" / room
         for room in ("attacks", "defenses", "auditing")]
#: the public option (config field) and the third-party names spelled the American way
PUBLIC = {"optimizer", "Optimizer", "DPOptimizer", "DPPerLayerOptimizer", "optimizers"}


def identifiers(tree: ast.AST) -> set[str]:
    """Every name the code defines or reads: variables, attributes, functions, classes,
    arguments, keywords."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            found.add(node.arg)
    return found


def test_optimiser_is_spelled_one_way_in_identifiers() -> None:
    american = {f"{path.relative_to(path.parents[2])}: {name}"
                for room in ROOMS for path in sorted(room.rglob("*.py"))
                for name in identifiers(ast.parse(path.read_text()))
                if "optimiz" in name.lower() and name not in PUBLIC}
    assert not american, "spell optimiser the British way in code:\n" + "\n".join(sorted(american))
