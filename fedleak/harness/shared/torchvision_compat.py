"""Import torchvision even when its compiled operators do not match the installed torch.

torchvision registers fake (meta) kernels for its C++ operators at import time. When its
compiled extension cannot load (for instance a CUDA build of torchvision next to a CPU-only
torch), those operators were never defined and ``import torchvision`` fails with
``RuntimeError: operator torchvision::nms does not exist``. The data sets and models used here
need none of those operators, so we define their schemas ourselves (no kernels) and import
again. Every use of torchvision in fedleak goes through :func:`import_torchvision`.
"""

from __future__ import annotations

import sys
from types import ModuleType

import torch

_MISSING_OPERATOR = "operator torchvision::nms does not exist"
_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)

# Kept referenced for the life of the process: dropping a Library object deregisters its ops.
_LIBRARY: torch.library.Library | None = None


def import_torchvision() -> ModuleType:
    """Return the ``torchvision`` module, defining its missing operator schemas if needed."""
    try:
        import torchvision
    except RuntimeError as error:
        if _MISSING_OPERATOR not in str(error):
            raise
        _define_missing_operators()
        _forget_partial_import()
        import torchvision
    return torchvision


def _define_missing_operators() -> None:
    """Define ``torchvision::nms`` and ``torchvision::qnms`` schemas (no kernels)."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    library = torch.library.Library("torchvision", "DEF")
    for schema in _SCHEMAS:
        library.define(schema)
    _LIBRARY = library


def _forget_partial_import() -> None:
    """Drop the half-initialised ``torchvision`` modules a failed import left behind."""
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        del sys.modules[name]
