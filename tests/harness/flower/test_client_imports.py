"""A ClientApp's import path carries the audit's lines only (fedleak.harness.flower's node side):
``from fedleak.flower import answer_score_queries, remember_batch, score_reply`` and the
quickstart's audited ClientApp load no attack, defense, auditing, victim or attacker code, nor
scipy, opacus or matplotlib (the node's scorer is imported at its first score query). Flower
starts a process per message and restarts one that outlives its task token: every second of
import counts under load (bench/flower_client_import.py measures it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("flwr", reason="needs fedleak[flower]")

from tests.paths import REPO  # noqa: E402

HEAVY = ("fedleak.attacks", "fedleak.defenses", "fedleak.auditing", "fedleak.harness.victim",
         "fedleak.harness.attacker", "fedleak.harness.metrics", "scipy", "opacus", "matplotlib")


def test_the_audited_quickstart_clientapp_imports_no_attack_defense_or_scoring_code() -> None:
    code = ("import json, sys; import pytorchexample.client_app; "
            "from fedleak.flower import answer_score_queries, remember_batch, score_reply, "
            "SCORE_ACTION; print(json.dumps(sorted(sys.modules)))")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(REPO / "examples" / "flower_quickstart"), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    modules = json.loads(done.stdout.strip().splitlines()[-1])
    assert "fedleak.harness.flower.node.node_scoring" in modules
    assert [m for m in modules if m.startswith(HEAVY)] == []
