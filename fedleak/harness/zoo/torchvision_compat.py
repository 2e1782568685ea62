"""Import torchvision even when its compiled operators do not match the installed torch.

torchvision registers fake (meta) kernels for its C++ operators at import time. When its
compiled extension cannot load (PyPI's torchvision 0.28.0 is a CUDA build; beside the CPU-only
torch 2.13.0+cpu this project installs, its ``_C`` library does not load), those operators
were never defined and ``import torchvision`` fails with ``RuntimeError: operator
torchvision::nms does not exist``. The data sets, transforms and models people use need none
of those operators, so we define their schemas ourselves and import again; ``nms`` gets a
plain-torch kernel (:func:`nms_kernel`), so ``torchvision.ops.nms`` is callable too.

This module is the one place that knows how, reached two ways:

- :func:`import_torchvision`, which fedleak's own code calls;
- an import hook (:func:`install_import_hook`) that does the same for *everyone's* code — a
  ClientApp's ``from torchvision.transforms import ToTensor`` — without calling anything: the
  environment ``make`` builds carries ``fedleak-torchvision.pth`` in its site-packages
  (written by ``python -m fedleak.harness.zoo.torchvision_compat --install``), whose one
  line installs the hook at interpreter start-up. The hook is a meta-path finder that only
  acts on the top-level ``torchvision`` module: it lets the real import run and, only when it
  fails with the missing-operator error, defines the schemas and runs the module again. It
  imports nothing (torch included) until torchvision itself is imported, so start-up costs
  nothing, and where torchvision loads normally it never does anything.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

_MISSING_OPERATOR = "operator torchvision::nms does not exist"
_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
#: the file the environment carries in its site-packages, and its one line (an ``import`` line
#: of a ``.pth`` file runs at start-up; any failure, e.g. an older fedleak, is silent)
PTH_NAME = "fedleak-torchvision.pth"
PTH_LINE = ('import sys; exec("try:\\n from fedleak.harness.zoo.torchvision_compat import '
            'install_import_hook\\n install_import_hook()\\nexcept Exception:\\n pass")\n')

# Kept referenced for the life of the process: dropping a Library object deregisters its ops.
_LIBRARY: Any = None


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

        _callable_nms(torchvision)
    return torchvision


def _callable_nms(torchvision: ModuleType) -> None:
    """Route ``torchvision.ops.nms`` (and ``batched_nms``, which calls it) to
    :func:`nms_kernel`: torchvision's own checks first that its compiled library loaded."""
    boxes = getattr(getattr(torchvision, "ops", None), "boxes", None)
    if boxes is None or _LIBRARY is None:
        return

    def nms(boxes_: Any, scores: Any, iou_threshold: float) -> Any:
        """torchvision.ops.nms (fedleak's plain-torch kernel: torchvision's C++ library did not
        load beside this torch)."""
        return nms_kernel(boxes_, scores, float(iou_threshold))

    boxes.nms = nms
    torchvision.ops.nms = nms


def _define_missing_operators() -> None:
    """Define ``torchvision::nms`` and ``torchvision::qnms`` schemas (no kernels)."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    import torch

    library = torch.library.Library("torchvision", "DEF")
    for schema in _SCHEMAS:
        library.define(schema)
    library.impl("nms", nms_kernel, "CompositeExplicitAutograd")
    library.impl("qnms", _no_qnms, "CompositeExplicitAutograd")
    _LIBRARY = library


def nms_kernel(dets: Any, scores: Any, iou_threshold: float) -> Any:
    """``torchvision.ops.nms`` in plain torch, so it is callable without torchvision's
    compiled library: boxes ``dets`` [N, 4] as (x1, y1, x2, y2) visited by decreasing score,
    each kept unless its IoU with a box already kept exceeds ``iou_threshold`` (torchvision's
    rule, areas (x2 − x1)(y2 − y1)); the kept indices, highest score first, int64."""
    import torch

    if dets.numel() == 0:
        return torch.empty(0, dtype=torch.int64, device=dets.device)
    x1, y1, x2, y2 = dets.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    width = (torch.minimum(x2[:, None], x2[None]) - torch.maximum(x1[:, None], x1[None]))
    height = (torch.minimum(y2[:, None], y2[None]) - torch.maximum(y1[:, None], y1[None]))
    inter = width.clamp(min=0) * height.clamp(min=0)
    iou = inter / (areas[:, None] + areas[None] - inter)
    suppressed = torch.zeros(dets.shape[0], dtype=torch.bool, device=dets.device)
    keep = []
    for i in torch.argsort(scores, descending=True, stable=True).tolist():
        if not bool(suppressed[i]):
            keep.append(i)
            suppressed |= iou[i] > iou_threshold
    return torch.tensor(keep, dtype=torch.int64, device=dets.device)


def _no_qnms(dets: Any, scores: Any, iou_threshold: float) -> Any:
    raise RuntimeError("torchvision::qnms (quantized boxes) needs torchvision's compiled "
                       "library, which does not load beside this torch; dequantize the boxes "
                       "and call torchvision.ops.nms")


def _forget_partial_import() -> None:
    """Drop the half-initialised ``torchvision`` modules a failed import left behind."""
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        del sys.modules[name]


class _RepairingLoader(importlib.abc.Loader):
    """torchvision's own loader; when executing the package fails with the missing-operator
    error, the schemas are defined and the package is executed again."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        try:
            self.loader.exec_module(module)
        except RuntimeError as error:
            if _MISSING_OPERATOR not in str(error):
                raise
            _define_missing_operators()
            for name in [n for n in sys.modules if n.startswith("torchvision.")]:
                del sys.modules[name]
            self.loader.exec_module(module)
            _callable_nms(module)


class TorchvisionFinder(importlib.abc.MetaPathFinder):
    """A meta-path finder for the top-level ``torchvision`` module only: the spec the other
    finders give, with :class:`_RepairingLoader` around its loader."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torchvision":
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, TorchvisionFinder):
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _RepairingLoader(spec.loader)
                return spec
        return None


def install_import_hook() -> None:
    """Put :class:`TorchvisionFinder` first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, TorchvisionFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, TorchvisionFinder())


def install_pth(site_packages: Path | None = None) -> Path:
    """Write :data:`PTH_NAME` into ``site_packages`` (default: this interpreter's purelib), so
    every Python of this environment installs the hook at start-up; returns its path."""
    folder = Path(site_packages or sysconfig.get_paths()["purelib"])
    path = folder / PTH_NAME
    path.write_text(PTH_LINE)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fedleak.harness.zoo.torchvision_compat --install``: write the ``.pth``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args != ["--install"]:
        print("usage: python -m fedleak.harness.zoo.torchvision_compat --install",
              file=sys.stderr)
        return 2
    print(f"wrote {install_pth()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
