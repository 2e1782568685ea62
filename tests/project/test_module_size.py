"""No module in ``fedleak/`` is over :data:`MAX_LINES` lines: a room a maintainer can read whole.

A module that grows past it is split by what it holds (one idea per file, named in the field's
words), not trimmed. The one exception is the generated gRPC code in ``fedleak/v1``
(``*_pb2.py``, ``*_pb2.pyi``, ``*_pb2_grpc.py``): ``grpc_tools.protoc`` writes it from
``protos/`` and nobody edits it by hand (``tests/harness/wire/test_protos.py`` checks it matches the
``.proto``), so its length is the proto's, not a maintainer's choice.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.paths import REPO

PACKAGE = REPO / "fedleak"
MAX_LINES = 400


def generated(path: Path) -> bool:
    """gRPC code protoc writes from protos/ into fedleak/v1 (regenerated, never edited)."""
    return path.parent == PACKAGE / "v1" and "_pb2" in path.name


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if not generated(p))


def length(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_the_package_has_modules() -> None:
    assert len(modules()) > 100


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_over_the_limit(path: Path) -> None:
    lines = length(path)
    assert lines <= MAX_LINES, (
        f"{path.relative_to(PACKAGE.parent)} has {lines} lines, over {MAX_LINES}: split it by "
        "what it holds (one idea per module, named in the field's words)")
