"""The malicious server's probe of a Flower deployment (fedleak.harness.flower.probe): trap
weights sent to the nodes after the federation read their batches exactly when the model
begins with a linear layer and the nodes take one local step; the probe's replies never reach
the inner strategy; its outcome stands under "malicious parameters", apart from the honest
headline; a model or procedure an attack cannot carry is said in words; a node that vets θ
refuses the probe, and that is recorded as what vet buys back.

The federation runs in this process: FedAvg wrapped in LeakageAudit, fedleak's ClientApp per
node with its own Context.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("flwr", reason="needs fedleak[flower]")

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict  # noqa: E402
from flwr.server.strategy import FedAvg as LegacyFedAvg  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedleak.harness.flower.federation import FederationSettings, make_client_app  # noqa: E402
from fedleak.harness.flower.leakage_audit import LeakageAudit  # noqa: E402
from fedleak.harness.zoo.models import build_model  # noqa: E402

WIDE = "mlp:width=1000,depth=1"


@pytest.fixture(autouse=True)
def _identity() -> None:
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0


class Grid:
    def __init__(self, settings: FederationSettings) -> None:
        self.app = make_client_app(settings)
        self.run = type("Run", (), {"run_id": 1})()
        self.contexts = {100 + i: Context(run_id=1, node_id=100 + i,
                                          node_config={"partition-id": i, "num-partitions": 2},
                                          state=RecordDict(), run_config={}) for i in range(2)}

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Message], timeout: float | None = None
                         ) -> list[Message]:
        return [self.app(m, self.contexts[m.metadata.dst_node_id]) for m in messages]


class Counting(FedAvg):
    """FedAvg that counts the rounds of replies it aggregates."""

    seen: list[int] = []

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> Any:
        Counting.seen.append(server_round)
        return super().aggregate_train(server_round, replies)


def audited(tmp_path: Path, model: str, probe: Any, **changes: Any) -> dict[str, Any]:
    s = FederationSettings(**{"nodes": 2, "rounds": 1, "model": model, "images": 64,
                              "protocol": "fedavg", "lr": 0.1,
                              "options": ("iterations=2", "restarts=1"),
                              "out": str(tmp_path / "audit"), **changes})
    torch.manual_seed(0)
    net = build_model(model, (1, 8, 8), 10)
    Counting.seen = []
    audit = LeakageAudit(Counting(fraction_evaluate=0.0, min_available_nodes=2,
                                  min_train_nodes=2), model, "digits", Path(s.out),
                         options=s.attack_options(), background=False, probe=probe,
                         log=lambda _: None)
    audit.start(Grid(s), ArrayRecord(net.state_dict()), num_rounds=1,  # type: ignore[arg-type]
                train_config=ConfigRecord(s.procedure().config()))
    return json.loads((Path(s.out) / "metrics.json").read_text())


def test_trap_weights_read_most_of_each_nodes_batch_and_stay_out_of_the_headline(
        tmp_path: Path) -> None:
    metrics = audited(tmp_path, WIDE, "trap-weights")
    assert Counting.seen == [1]  # the probe round's replies never reached the strategy
    probe = metrics["malicious_probe"]
    assert probe["threat_model"] == "malicious parameters"
    assert "discarded" in probe["training"]
    outcomes = probe["outcomes"]
    assert [o["node"] for o in outcomes] == ["node-0", "node-1"]
    for outcome in outcomes:
        assert outcome["status"] == "attacked" and outcome["server_round"] == 2
        assert outcome["images"] == 64 and outcome["recovered"] >= 32, outcome
        assert outcome["round"]["replay"] == "exact"
    # the honest headline is the honest rounds' alone
    assert len(metrics["rounds"]) == 2 and metrics["summary"]["images"] == 128
    assert metrics["status"] == "finished"


def test_what_an_attack_cannot_carry_is_said_in_words(tmp_path: Path) -> None:
    metrics = audited(tmp_path, "lenet-zhu", ("trap-weights", "fishing"))
    outcomes = {o["attack"]: o for o in metrics["malicious_probe"]["outcomes"]}
    assert outcomes["trap-weights"]["status"] == "refused"
    assert "first layer to be a biased linear layer" in outcomes["trap-weights"]["reason"]
    assert outcomes["fishing"]["status"] == "refused"
    assert "FedSGD" in outcomes["fishing"]["reason"]
    assert Counting.seen == [1]


def test_a_node_that_vets_its_parameters_refuses_the_probe(tmp_path: Path) -> None:
    metrics = audited(tmp_path, WIDE, "trap-weights", defenses=("vet",))
    outcomes = metrics["malicious_probe"]["outcomes"]
    assert [o["status"] for o in outcomes] == ["vetted", "vetted"]
    assert "trap weights" in outcomes[0]["reason"]
    assert metrics["rounds"][0]["images"]  # the honest round passed vet


def test_bad_probe_settings_are_refused_before_the_federation(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="probe attacks are trap-weights, fishing"):
        LeakageAudit(FedAvg(), WIDE, "digits", tmp_path, probe="imprint", background=False)
    with pytest.raises(ValueError):
        LeakageAudit(FedAvg(), WIDE, "digits", tmp_path / "b", probe="trap-weights",
                     probe_options={"trap-weights": {"rate": 2.0}}, background=False)


def test_under_secagg_plus_the_probe_attacks_the_aggregate_and_trains_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flower's own SecAgg+ workflow and mod, 2 nodes x 32 digits: the workflow's extra round
    sends trap weights, the audit attacks the aggregate of the two nodes' masked updates (the
    server never holds one), each node scores its own images among the reconstruction, and
    the probe round's aggregate never reaches the inner strategy."""
    from fedleak.harness.flower.federation import run_server
    from tests.harness.flower.test_flower import LocalGrid

    rounds: list[int] = []
    real = LegacyFedAvg.aggregate_fit

    def counted(self: Any, server_round: int, *args: Any) -> Any:
        rounds.append(server_round)
        return real(self, server_round, *args)

    monkeypatch.setattr(LegacyFedAvg, "aggregate_fit", counted)
    s = FederationSettings(nodes=2, rounds=1, model=WIDE, images=32, protocol="fedavg", lr=0.1,
                           options=("iterations=2", "restarts=1"), secagg_plus=True,
                           probe=("trap-weights",), out=str(tmp_path / "audit"))
    run_server(LocalGrid(s, wire=True), s)
    metrics = json.loads((tmp_path / "audit" / "metrics.json").read_text())
    assert rounds == [1]  # the probe round (2) trained nothing
    assert len(metrics["rounds"]) == 1 and metrics["status"] == "finished"
    (outcome,) = metrics["malicious_probe"]["outcomes"]
    assert outcome["status"] == "attacked" and outcome["node"] == "secagg+ aggregate of 2 nodes"
    assert outcome["images"] == 64 and outcome["server_round"] == 2
    assert outcome["round"]["floors"]["images"] == 64  # the nodes' floors, pooled
    assert outcome["recovered"] is not None


def test_fishing_is_refused_under_secagg_plus(tmp_path: Path) -> None:
    from fedleak.harness.flower.secagg.aggregate_audit import AggregateAudit

    with pytest.raises(ValueError, match="several probe rounds"):
        AggregateAudit(LegacyFedAvg(), WIDE, "digits", tmp_path, probe="fishing",
                       probe_round=2)
