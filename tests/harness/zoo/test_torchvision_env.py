"""torchvision imports in the project's environment, in anyone's code, with no shim to call.

PyPI's torchvision 0.28.0 beside torch 2.13.0+cpu fails alone (``operator torchvision::nms
does not exist``); ``make`` writes ``fedleak-torchvision.pth`` into the venv, whose line
installs fedleak's import hook at start-up (:mod:`fedleak.harness.zoo.torchvision_compat`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fedleak.harness.zoo.torchvision_compat import PTH_LINE, PTH_NAME, install_pth
from tests.paths import REPO

ROOT = REPO


def python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=1200)


def test_a_plain_python_of_the_environment_imports_torchvision(tmp_path: Path) -> None:
    """What a ClientApp does (Flower's quickstart: ``from torchvision.transforms import ...``),
    in a fresh interpreter outside the checkout, calling nothing of fedleak's."""
    done = python("import torch, torchvision\n"
                  "from torchvision.transforms import Compose, Normalize, ToTensor\n"
                  "print(Normalize((0.5,), (0.5,))(ToTensor()(__import__('numpy').zeros("
                  "(2, 2, 1), dtype='uint8'))).sum().item())", tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "-4.0"


def test_the_pth_line_installs_the_hook_that_repairs_the_import(tmp_path: Path) -> None:
    """The line ``make`` installs, run in an interpreter whose hook was taken out again: the
    import works through the hook (and where torchvision loads on its own, it stays out of
    the way); the file written is that line."""
    written = install_pth(tmp_path)
    assert written.name == PTH_NAME and written.read_text() == PTH_LINE
    code = ("import sys\n"
            "sys.meta_path[:] = [f for f in sys.meta_path "
            "if type(f).__name__ != 'TorchvisionFinder']\n"
            f"{PTH_LINE}"
            "import torchvision.datasets\n"
            "print(sum(type(f).__name__ == 'TorchvisionFinder' for f in sys.meta_path))")
    done = python(code, ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "1"


def test_torchvision_ops_nms_is_callable_and_keeps_torchvisions_rule(tmp_path: Path) -> None:
    """``torchvision.ops.nms`` and ``batched_nms`` in a fresh interpreter: boxes by decreasing
    score, one dropped when its IoU with a kept box exceeds the threshold."""
    done = python("import torch, torchvision\n"
                  "b = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30],"
                  " [0, 0, 10, 10.]])\n"
                  "s = torch.tensor([0.9, 0.8, 0.7, 0.95])\n"
                  "print(torchvision.ops.nms(b, s, 0.5).tolist(),"
                  " torchvision.ops.batched_nms(b, s, torch.tensor([0, 0, 1, 1]), 0.5).tolist(),"
                  " torchvision.ops.nms(b, s, 0.9).tolist())", tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    # IoU([0,0,10,10], [1,1,11,11]) = 81/119 = 0.68: dropped at 0.5, kept at 0.9
    assert done.stdout.strip() == "[3, 2] [3, 0, 2] [3, 1, 2]"
