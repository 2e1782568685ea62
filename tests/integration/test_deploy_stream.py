"""examples/flower_deploy.py prints ``flwr run``'s output as it comes, and a run past
``--timeout`` is stopped with a message that names ``--timeout``."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

from tests.paths import REPO

SCRIPT = REPO / "examples" / "flower_deploy.py"


def deploy_module() -> object:
    spec = importlib.util.spec_from_file_location("flower_deploy", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_output_streams_as_it_comes_and_the_timeout_names_its_option(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deploy = deploy_module()
    env = dict(os.environ)
    code = "import time\nprint('first', flush=True)\ntime.sleep(30)\nprint('never')"
    with pytest.raises(RuntimeError, match="--timeout 2 s.*raise --timeout"):
        deploy.stream([sys.executable, "-c", code], env, tmp_path,  # type: ignore[attr-defined]
                      time.monotonic() + 2, 2)
    out = capsys.readouterr().out
    assert "first" in out and "never" not in out  # printed as it came; stopped, not awaited
    status, output = deploy.stream(  # type: ignore[attr-defined]
        [sys.executable, "-c", "print('a'); print('b'); raise SystemExit(3)"], env, tmp_path,
        time.monotonic() + 60, 60)
    assert status == 3 and output.split() == ["a", "b"]
