"""``--device cuda`` on a torch without CUDA is a usage error naming what to change, on every
command that takes it, never a traceback from deep inside torch."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from fedleak.harness.cli.main import main

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")

COMMANDS = [
    ["victim", "serve", "--dataset", "digits", "--model", "mlp", "--port", "0"],
    ["attack", "--victim", "127.0.0.1:1"],
    ["demo"],
    ["train-model", "--dataset", "digits", "--model", "mlp", "--out", "unused.pt"],
    ["sweep", "--preset", "quick"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_device_cuda_without_cuda_is_a_usage_error(command: list[str]) -> None:
    runner = CliRunner()
    with runner.isolated_filesystem():  # nothing may be written, and nothing is
        result = runner.invoke(main, [*command, "--device", "cuda"])
    assert result.exit_code == 2, result.output
    assert "--device cpu" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
