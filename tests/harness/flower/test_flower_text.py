"""A text Flower federation audited as a text victim is: every node (a set of Shakespeare's
speaking roles) trains a GPT-2-style decoder with fedleak's own update, every reply is attacked
with a text attack and scored on its node. Starts Ray: run under `flock /tmp/fedleak-ray.lock`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="needs fedleak[flower]")

from fedleak.harness.flower.text.text_client import text_node_batch, text_train_data  # noqa: E402

MODEL = "gpt2:hidden=128,heads=4,layers=2"


def test_nodes_hold_whole_roles() -> None:
    data = text_train_data("shakespeare", MODEL)
    roles: dict[str, int] = {}
    for user in data.users:
        roles.setdefault(user, len(roles))
    tokens, _ = text_node_batch(data, 1, 3, 1, 4)
    rows = [i for i, u in enumerate(data.users) if roles[u] % 3 == 1][:4]
    assert tokens.tolist() == data.tokens[rows].tolist()
    with pytest.raises(ValueError, match="fewer nodes"):
        text_node_batch(data, 9_999, 10_000, 1, 4)  # no role falls to it


@pytest.mark.integration
@pytest.mark.timeout(1800)  # Ray, two nodes and the attacks: sized for load 20 on 2 cores
def test_a_text_federation_is_attacked_and_scored_on_its_nodes(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    result = subprocess.run(
        [sys.executable, "-m", "fedleak", "flower", "simulate", "--dataset", "shakespeare",
         "--model", MODEL, "--attack", "dager", "--nodes", "2", "--images", "2", "--rounds",
         "1", "--lr", "1.0", "--allow-reveal", "--out", str(out)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "2 node update(s) attacked and scored: mean ROUGE-1 1.0, ROUGE-2 1.0" in result.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "finished" and len(metrics["rounds"]) == 2
    for entry in metrics["rounds"]:
        assert entry["exact"] == 2 and entry["token_precision"] == 1.0
        assert "| yes |" in (out / entry["files"]["comparison"]).read_text()
    refused = subprocess.run(
        [sys.executable, "-m", "fedleak", "flower", "simulate", "--dataset", "shakespeare",
         "--model", MODEL, "--attack", "inverting-gradients", "--out", str(tmp_path / "x")],
        capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and "text federation" in refused.stderr
