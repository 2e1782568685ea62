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

ROOT = Path(__file__).resolve().parents[1]


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
