"""How a Flower audit ends (fedleak.harness.flower.audit_end): its report says so whatever ends
the ServerApp — Flower's exit on a signal (SystemExit, or its exit handlers), a node that never
answers the score query, the worker killed, a ServerApp that never calls finish() — with the
status, the reason and the phase, never ``running``.

The federation runs in this process: FedAvg wrapped in LeakageAudit, fedleak's ClientApp per
node with its own Context (as a SuperNode gives it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("flwr", reason="needs fedleak[flower]")

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedleak.harness.flower import audit_end  # noqa: E402
from fedleak.harness.flower.federation import FederationSettings, make_client_app  # noqa: E402
from fedleak.harness.flower.leakage_audit import LeakageAudit  # noqa: E402
from fedleak.harness.flower.node.node_scoring import SCORE_MESSAGE_TYPE  # noqa: E402
from fedleak.harness.zoo.models import build_model  # noqa: E402
from tests.paths import REPO

MLP = "mlp:width=8,depth=1"


@pytest.fixture(autouse=True)
def _identity() -> None:
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0


class Grid:
    """Two nodes in this process; ``on_score`` decides what a batch of score queries gets."""

    def __init__(self, settings: FederationSettings,
                 on_score: Callable[[list[Message]], list[Message]] | None = None) -> None:
        self.app = make_client_app(settings)
        self.on_score = on_score
        self.run = type("Run", (), {"run_id": 1})()
        self.contexts = {100 + i: Context(run_id=1, node_id=100 + i,
                                          node_config={"partition-id": i, "num-partitions": 2},
                                          state=RecordDict(), run_config={}) for i in range(2)}

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Message], timeout: float | None = None
                         ) -> list[Message]:
        messages = list(messages)
        if self.on_score is not None and messages and \
                messages[0].metadata.message_type == SCORE_MESSAGE_TYPE:
            return self.on_score(messages)
        return [self.app(m, self.contexts[m.metadata.dst_node_id]) for m in messages]

    def answer(self, messages: list[Message]) -> list[Message]:
        return [self.app(m, self.contexts[m.metadata.dst_node_id]) for m in messages]


def federation(tmp_path: Path, grid_of: Callable[[FederationSettings], Grid], *,
               background: bool = False, iterations: int = 3, **audit: Any
               ) -> tuple[LeakageAudit, Grid, Callable[[], Any]]:
    s = FederationSettings(nodes=2, rounds=1, model=MLP, options=(f"iterations={iterations}",
                                                                  "restarts=1"),
                           out=str(tmp_path / "audit"))
    grid = grid_of(s)
    torch.manual_seed(0)
    model = build_model(MLP, (1, 8, 8), 10)
    strategy = LeakageAudit(FedAvg(fraction_evaluate=0.0, min_available_nodes=2,
                                   min_train_nodes=2), MLP, "digits", Path(s.out),
                            options=s.attack_options(), background=background, log=lambda _: None,
                            **audit)

    def run() -> Any:
        return strategy.start(grid, ArrayRecord(model.state_dict()), num_rounds=1,  # type: ignore[arg-type]
                              train_config=ConfigRecord(s.procedure().config()))

    return strategy, grid, run


def report(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "audit" / "metrics.json").read_text())


def test_a_serverapp_flower_stops_while_the_nodes_score_says_stopped(tmp_path: Path) -> None:
    """Flower's exit on a signal is a SystemExit in the ServerApp: the report says
    ``stopped``, the phase and the rounds left unscored, and the exit goes on."""
    def stop(_: list[Message]) -> list[Message]:
        raise SystemExit(0)

    _, _, run = federation(tmp_path, lambda s: Grid(s, on_score=stop), background=False)
    with pytest.raises(SystemExit):
        run()
    metrics = report(tmp_path)
    assert metrics["status"] == "stopped"
    assert "round 1 of the federation" in metrics["status_reason"]
    assert "heartbeat" in metrics["status_reason"]


def test_a_node_that_never_answers_the_score_query_makes_the_report_incomplete(
        tmp_path: Path) -> None:
    def silent(messages: list[Message]) -> list[Message]:
        return []  # every score query times out unanswered

    _, _, run = federation(tmp_path, lambda s: Grid(s, on_score=silent), score_timeout=0.1)
    run()
    metrics = report(tmp_path)
    assert metrics["status"] == "incomplete"
    assert "did not answer the score query" in metrics["status_reason"]
    assert "node-0" in metrics["status_reason"] and "node-1" in metrics["status_reason"]


def test_flowers_exit_handler_writes_the_report_before_flower_closes_the_grid(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What Flower runs on SIGTERM before it closes the ServerApp's grid (its exit handlers,
    ``run_before_force_exit``): the audit ends at once, ``stopped`` with its phase, and a
    later finish() changes nothing."""
    handlers: list[tuple[Callable[[], None], bool]] = []
    from flwr.supercore import exit as flower_exit

    monkeypatch.setattr(flower_exit, "add_exit_handler",
                        lambda handler, run_before_force_exit=False: handlers.append(
                            (handler, run_before_force_exit)))
    strategy, grid, _ = federation(tmp_path, Grid)
    (handler, early), = handlers
    assert early  # before Flower's force-exit timer and its grid.close()
    handler()
    metrics = report(tmp_path)
    assert metrics["status"] == "stopped" and "starting the federation" in \
        metrics["status_reason"]
    strategy.finish()
    assert report(tmp_path)["status"] == "stopped"


def test_a_killed_worker_makes_the_report_incomplete(tmp_path: Path) -> None:
    """The worker process killed while it attacks: the federation finishes, the updates it
    held are named, the status is ``incomplete``."""
    strategy, grid, run = federation(tmp_path, Grid, background=True, iterations=100000)
    worker = strategy._worker
    assert worker is not None and worker.process.pid
    real_drain = worker.drain

    def drain_after_kill(timeout: float | None = None) -> list[Any]:
        os.kill(worker.process.pid, signal.SIGKILL)  # type: ignore[arg-type]
        return real_drain(timeout)

    worker.drain = drain_after_kill  # type: ignore[method-assign]
    run()
    metrics = report(tmp_path)
    assert metrics["status"] == "incomplete", metrics
    assert "worker process died" in metrics["status_reason"]


def test_a_serverapp_that_never_finishes_says_unfinished_at_exit(tmp_path: Path) -> None:
    """A ServerApp that drives the rounds itself and never calls finish(): when its process
    ends, the report says ``unfinished`` and why, not ``running``."""
    out = tmp_path / "audit"
    code = ("from pathlib import Path; from fedleak.harness.flower.leakage_audit import "
            "LeakageAudit; from flwr.serverapp.strategy import FedAvg; "
            f"LeakageAudit(FedAvg(), {MLP!r}, 'digits', Path({str(out)!r}), background=False)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == audit_end.UNFINISHED
    assert "strategy.finish()" in metrics["status_reason"]
