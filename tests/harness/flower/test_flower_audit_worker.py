"""The audit off the round's critical path, and the score query through Flower's own mods.

- The worker (:mod:`fedleak.harness.flower.audit_worker`) is a separate process niced above
  this one; each update is attacked with the iterations asked (a work budget: no wall-clock
  cut); a full queue skips an update and records why; the nodes score after the federation.
- ``publishing(LocalDpMod(...))``, a bare ``LocalDpMod`` and ``fixedclipping_mod`` on the
  ClientApp: every node is scored (the query is shaped to pass them, and ``publishing``
  passes it untouched); a user mod that breaks every non-train message is bypassed by
  ``answer_score_queries``; a node that cannot score says why at once (no timeout).
"""

from __future__ import annotations

import json
import os
import sys
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="needs fedleak[flower]")

from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.clientapp.mod import LocalDpMod, fixedclipping_mod  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedleak.harness.flower.audit_worker import (  # noqa: E402
    RAY_WORKER_NICENESS,
    AuditJob,
    AuditWorker,
    federation_niceness,
)
from fedleak.harness.flower.federation import FederationSettings, node_batch  # noqa: E402
from fedleak.harness.flower.leakage_audit import LeakageAudit  # noqa: E402
from fedleak.harness.flower.node.node_scoring import (  # noqa: E402
    SCORE_ACTION,
    answer_score_queries,
    score_reply,
)
from fedleak.harness.flower.node.published_defenses import publishing  # noqa: E402
from fedleak.harness.flower.node.train import train  # noqa: E402
from fedleak.harness.zoo.datasets import load_dataset  # noqa: E402
from fedleak.harness.zoo.models import build_model  # noqa: E402

MLP = "mlp:width=16,depth=1"
NODES = 2


@pytest.fixture(autouse=True)
def _identity() -> None:
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0


class Grid:
    """Nodes in this process; each message answered by the ClientApp with the node's Context."""

    def __init__(self, app: ClientApp) -> None:
        self.app = app
        self.contexts = {100 + i: Context(run_id=1, node_id=100 + i, node_config={
            "partition-id": i, "num-partitions": NODES}, state=RecordDict(), run_config={})
            for i in range(NODES)}
        self.sent: list[str] = []

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Message], timeout: float | None = None
                         ) -> list[Message]:
        out = []
        for m in messages:
            self.sent.append(m.metadata.message_type)
            out.append(self.app(m, self.contexts[m.metadata.dst_node_id]))
        return out


def client_app(mods: list[Any], *, outside: bool = False, images: int = 2) -> ClientApp:
    """fedleak's local update on node i's digits; the score handler written as
    docs/flower.md shows it, or registered outside the mods (``outside``)."""
    data = load_dataset("digits", "train")
    app = ClientApp(mods=mods)

    @app.train()
    def train_handler(msg: Message, context: Context) -> Message:
        model = build_model(MLP, data.info.shape, data.info.num_classes)
        config = dict(next(iter(msg.content.config_records.values())))
        batch, labels = node_batch(data, int(context.node_config["partition-id"]), NODES,
                                   int(config.get("server-round", 1)), images)
        trained = train(model, msg.content["arrays"], batch, labels,  # type: ignore[arg-type]
                        data.info, config, context=context)
        return Message(trained.content(), reply_to=msg)

    if outside:
        answer_score_queries(app, data.info)
    else:
        @app.query(SCORE_ACTION)
        def score(msg: Message, context: Context) -> Message:
            return score_reply(msg, context, data.info)

    return app


def audit_run(tmp_path: Path, app: ClientApp, *, config: dict[str, Any] | None = None,
              **audit: Any) -> dict[str, Any]:
    s = FederationSettings(nodes=NODES, model=MLP, protocol="fedavg", images=2, lr=0.1,
                           out=str(tmp_path / "audit"))
    data = load_dataset("digits", "train")
    torch.manual_seed(0)
    model = build_model(MLP, data.info.shape, data.info.num_classes)
    strategy = LeakageAudit(FedAvg(fraction_evaluate=0.0, min_train_nodes=NODES,
                                   min_available_nodes=NODES), MLP, "digits", Path(s.out),
                            options={"iterations": 4, "restarts": 1}, log=lambda _: None,
                            **audit)
    strategy.start(Grid(app), ArrayRecord(model.state_dict()),  # type: ignore[arg-type]
                   num_rounds=1, train_config=ConfigRecord({**s.procedure().config(),
                                                            **(config or {})}))
    return json.loads((Path(s.out) / "metrics.json").read_text())  # type: ignore[no-any-return]


def test_under_a_ray_simulation_the_worker_is_niced_below_the_nodes_actors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under Flower's simulation engine (Ray running in the ServerApp's process) the nodes
    train in Ray actors at Ray's worker niceness: the worker's base is that, not ours."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    half_built = types.ModuleType("ray")  # the engine may still be inside `import ray`
    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    assert federation_niceness() == own
    monkeypatch.setitem(sys.modules, "ray", half_built)
    assert federation_niceness() == max(own, RAY_WORKER_NICENESS) == max(own, 15)
    monkeypatch.setenv("RAY_worker_niceness", "3")
    assert federation_niceness() == max(own, 3)
    monkeypatch.setenv("RAY_worker_niceness", "not a number")
    assert federation_niceness() == max(own, RAY_WORKER_NICENESS)
    monkeypatch.delitem(sys.modules, "ray")
    assert federation_niceness() == own


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's SCHED_IDLE policy")
def test_a_worker_niced_past_19_runs_under_sched_idle() -> None:
    """Niceness stops at 19 (weight 15, still 40 % of Ray's +15 actors' 36): a worker asked
    to go further runs under SCHED_IDLE, on what the nodes leave."""
    data = load_dataset("digits", "train")
    model = build_model(MLP, data.info.shape, data.info.num_classes)
    own = os.getpriority(os.PRIO_PROCESS, 0)
    worker = AuditWorker(model, data.info, queue=1, nice=20 - own)
    try:
        pid = worker.process.pid or 0
        assert os.getpriority(os.PRIO_PROCESS, pid) == 19
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE
    finally:
        worker.close()
    assert os.sched_getscheduler(0) != os.SCHED_IDLE  # the ServerApp's process keeps its own
    plain = AuditWorker(model, data.info, queue=1, nice=min(10, 19 - own))
    try:
        assert os.sched_getscheduler(plain.process.pid or 0) == os.SCHED_OTHER
    finally:
        plain.close()


def test_the_worker_is_niced_and_runs_the_iterations_asked(tmp_path: Path) -> None:
    """A separate process, niceness +10 over the federation's (ours, or Ray's workers' when a
    simulation in this process loaded Ray); the job's budget is its iterations; it
    draws the reconstruction's files itself."""
    from fedleak.harness.attacker.client import ReceivedUpdate
    from fedleak.harness.federated.observe import observe
    from fedleak.harness.federated.protocol import Protocol

    data = load_dataset("digits", "train")
    torch.manual_seed(0)
    model = build_model(MLP, data.info.shape, data.info.num_classes)
    protocol = Protocol("fedavg", 1, 0, 0.1)
    observation = observe(model, data.images[:2], data.labels[:2], data.info, protocol)
    worker = AuditWorker(model, data.info, queue=1)
    try:
        assert worker.process.pid != os.getpid()
        assert os.getpriority(os.PRIO_PROCESS, worker.process.pid or 0) == \
            min(19, federation_niceness() + 10) or not worker.process.is_alive()
        received = ReceivedUpdate(round_id="1/node-1", names=observation.parameter_names,
                                  update=observation.update, update_kind="delta",
                                  protocol=protocol, num_images=2, local_steps=1,
                                  metadata={}, defenses=())
        params = dict(model.named_parameters())
        job = AuditJob((1, 1), received, {k: v.detach() for k, v in params.items()}, {},
                       "inverting-gradients", {"iterations": 7}, 0, tmp_path / "round")
        assert worker.submit(job) == 0
        assert worker.submit(AuditJob((1, 2), *list(vars(job).values())[1:])) is None
        results = worker.drain(timeout=300)
    finally:
        worker.close()
    assert [r.key for r in results] == [(1, 1)] and results[0].error is None
    assert results[0].reconstruction.iterations == 7
    assert results[0].drawn
    drawn = np.load(tmp_path / "round" / "reconstruction.npy")
    assert drawn.shape == (2, *data.info.shape) and 0 <= drawn.min() <= drawn.max() <= 1
    assert (tmp_path / "round" / "reconstruction.png").stat().st_size > 0
    assert not worker.process.is_alive()


def test_a_full_queue_skips_and_records_the_rest_are_scored_after_the_round(
        tmp_path: Path) -> None:
    metrics = audit_run(tmp_path, client_app([]), queue=1)
    assert metrics["status"] == "finished"
    assert len(metrics["rounds"]) == 1
    assert any("skipped: the audit is 1 update(s) behind" in w for w in metrics["warnings"])
    entry = metrics["rounds"][0]
    assert entry["iterations"] == 4 and entry["budget"]["iterations_asked"] == 4
    assert entry["mean_psnr"] is not None and "unscored" not in entry
    assert entry["partition"] in (0, 1)
    assert (tmp_path / "audit" / entry["files"]["reconstruction"]).is_file()
    assert metrics["summary"]["rounds"] == 1
    assert "off the round's critical path" in metrics["settings"]["audit"]


@pytest.mark.parametrize("mods", [
    [publishing(LocalDpMod(clipping_norm=1.0, sensitivity=1.0, epsilon=2.0, delta=1e-5))],
    [LocalDpMod(clipping_norm=1.0, sensitivity=1.0, epsilon=2.0, delta=1e-5)],
    [fixedclipping_mod],
    [publishing(fixedclipping_mod)],
], ids=["publishing-localdp", "bare-localdp", "fixedclipping", "publishing-fixedclipping"])
def test_every_node_is_scored_through_flowers_dp_mods(
        tmp_path: Path, mods: list[Any]) -> None:
    metrics = audit_run(tmp_path, client_app(mods), config={"clipping_norm": 10.0})
    assert len(metrics["rounds"]) == NODES
    for entry in metrics["rounds"]:
        assert "unscored" not in entry, entry.get("unscored")
        assert entry["mean_psnr"] is not None and entry["label_accuracy"] is not None
    assert metrics["summary"]["rounds"] == NODES


def breaks_every_other_message(msg: Message, context: Context,
                               call_next: Callable[[Message, Context], Message]) -> Message:
    """A user's mod that only knows train messages."""
    if not msg.metadata.message_type.startswith("train"):
        return Message(Error(1, "my_mod expects a train message"), reply_to=msg)
    return call_next(msg, context)


def test_answer_score_queries_bypasses_a_users_mod_and_a_refusal_is_said_at_once(
        tmp_path: Path) -> None:
    scored = audit_run(tmp_path / "a", client_app([breaks_every_other_message],
                                                  outside=True))
    assert all(e["mean_psnr"] is not None for e in scored["rounds"])
    refused = audit_run(tmp_path / "b", client_app([breaks_every_other_message]),
                        score_timeout=3600)
    for entry in refused["rounds"]:
        assert "my_mod expects a train message" in entry["unscored"]
        assert "answer_score_queries" in entry["unscored"]
    assert refused["summary"]["rounds"] == 0 and refused["summary"]["unscored"] == NODES
