"""The Flower bridge (fedleak.harness.flower): audit, client mods, node-side scoring, replay.

Most tests drive the real ServerApp logic (FedAvg wrapped in LeakageAudit) and the real
ClientApp in this process through :class:`LocalGrid`, which hands each message to the node's
ClientApp with its own Flower Context, as a SuperNode does. ``test_simulation_*`` runs the
whole federation in Flower's simulation engine (Ray) from the CLI, in a separate process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

pytest.importorskip("flwr", reason="needs fedleak[flower]")

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.common import FitIns  # noqa: E402
from flwr.common.serde import message_from_proto, message_to_proto  # noqa: E402
from flwr.server.strategy import FedAvg as LegacyFedAvg  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedleak.defenses.chain import build_chain, parse_defense_spec  # noqa: E402
from fedleak.harness.cli.main import main  # noqa: E402
from fedleak.harness.federated.observe import observe  # noqa: E402
from fedleak.harness.flower.arrays import record_of, tensors  # noqa: E402
from fedleak.harness.flower.federation import (  # noqa: E402
    FederationSettings,
    make_client_app,
    node_batch,
    run_server,
)
from fedleak.harness.flower.leakage_audit import LeakageAudit  # noqa: E402
from fedleak.harness.flower.node.mods import DefenseMod, DefenseModError  # noqa: E402
from fedleak.harness.flower.node.node_scoring import (  # noqa: E402
    SCORE_MESSAGE_TYPE,
    score_reply,
    submission_content,
)
from fedleak.harness.flower.node.train import remember_batch, train  # noqa: E402
from fedleak.harness.flower.procedure import LocalProcedure, procedure_from_config  # noqa: E402
from fedleak.harness.zoo.datasets import load_dataset  # noqa: E402
from fedleak.harness.zoo.models import build_model  # noqa: E402
from tests.harness.flower.test_flower_deploy import marked_processes
from tests.paths import REPO

MLP = "mlp:width=16,depth=1"
FAST = ("iterations=3", "restarts=1")
ROOT = REPO
#: A simulated federation's upper limit, sized for a load average of 20 on 2 cores (a
#: simulation that takes 26 s alone took 578 s there): a condition's limit, never a sleep.
FEDERATION_SECONDS = 1500


@pytest.fixture(autouse=True)
def _identity() -> None:
    """What a SuperLink sets for the ServerApp's process before it builds messages."""
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0


class LocalGrid:
    """A Flower Grid in this process: each node is the ClientApp with its own Context.

    ``wire``: every message crosses as Flower serialises it (protobuf), as between processes;
    SecAgg+ needs it (its workflow sends one content object to every node, which its mod
    changes in place)."""

    def __init__(self, settings: FederationSettings, node_config: dict[str, Any] | None = None,
                 app: Any = None, wire: bool = False) -> None:
        self.app = app or make_client_app(settings)
        self.wire = wire
        self.run = SimpleNamespace(run_id=1)  # what the legacy workflows read
        self.contexts = {
            100 + i: Context(run_id=1, node_id=100 + i,
                             node_config={"partition-id": i, "num-partitions": settings.nodes,
                                          **(node_config or {})},
                             state=RecordDict(), run_config={})
            for i in range(settings.nodes)}

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Message], timeout: float | None = None
                         ) -> list[Message]:
        if not self.wire:
            return [self.app(m, self.contexts[m.metadata.dst_node_id]) for m in messages]
        crossed = [message_from_proto(message_to_proto(m)) for m in messages]
        return [message_from_proto(message_to_proto(self.app(m, self.contexts[
            m.metadata.dst_node_id]))) for m in crossed]


def settings(tmp_path: Path, **changes: Any) -> FederationSettings:
    base: dict[str, Any] = {"nodes": 2, "rounds": 1, "model": MLP, "options": FAST,
                            "out": str(tmp_path / "audit")}
    return FederationSettings(**{**base, **changes})


def victim_update(s: FederationSettings, theta: dict[str, torch.Tensor], partition: int,
                  server_round: int = 1) -> list[torch.Tensor]:
    """What fedleak's victim sends for this θ and the node's batch (observe: its code path)."""
    data = load_dataset(s.dataset, "train")
    model = build_model(s.model, data.info.shape, data.info.num_classes)
    model.load_state_dict(theta)
    images, labels = node_batch(data, partition, s.nodes, server_round, s.images)
    chain = build_chain([parse_defense_spec(d) for d in s.defenses])
    return observe(model, images, labels, data.info, s.procedure().protocol,
                   defenses=chain).update


def recorded(out: Path) -> list[tuple[dict[str, Any], dict[str, torch.Tensor]]]:
    index = json.loads((out / "recording.json").read_text())
    rounds = []
    for entry in index["rounds"]:
        with np.load(out / entry["folder"] / "arrays.npz", allow_pickle=False) as arrays:
            rounds.append((entry, {k: torch.from_numpy(arrays[k].copy()) for k in arrays.files}))
    return rounds


# --------------------------------------------------------------------------- replay fidelity


@pytest.mark.parametrize(("model", "batchnorm", "defenses", "batch"), [
    (MLP, "train", ("prune:p=0.9",), 1),
    ("convnet:width=2", "train", ("clip:max-norm=0.01",), 0),
    ("convnet:width=2", "eval", (), 1),
])
def test_a_fedavg_update_through_flower_equals_the_victims(
        tmp_path: Path, model: str, batchnorm: str, defenses: tuple[str, ...],
        batch: int) -> None:
    """Two local epochs at τ = 0.1 over 2 images, defenses as client mods, BatchNorm in
    either mode: the update the audit reads off each node's Flower reply is the one fedleak's
    victim computes for the same θ (buffers included), batch and protocol; a prune:p=0.9 mod
    leaves exactly 90 % of each layer zero in what the server receives."""
    s = settings(tmp_path, model=model, protocol="fedavg", images=2, local_epochs=2,
                 local_batch_size=batch, lr=0.1, batchnorm=batchnorm, defenses=defenses,
                 record_only=True)
    run_server(LocalGrid(s), s)
    rounds = recorded(Path(s.out))
    assert len(rounds) == 2
    for partition, (entry, arrays) in enumerate(sorted(rounds, key=lambda r: r[0]["folder"])):
        assert entry["update_kind"] == "delta"
        assert entry["local_steps"] == 2 * (2 if batch == 1 else 1)
        assert entry["warnings"] == []
        theta = {k.split("/", 1)[1]: v for k, v in arrays.items()
                 if k.startswith(("param/", "buffer/"))}
        got = [v for k, v in arrays.items() if k.startswith("update/")]
        want = victim_update(s, theta, partition)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
            if "prune:p=0.9" in defenses:
                assert int((g == 0).sum()) == g.numel() - round(0.1 * g.numel())


@pytest.mark.integration
def test_an_out_of_process_defense_runs_as_a_client_mod(tmp_path: Path) -> None:
    """``remote:address=...`` as a Flower mod: the node's update goes through a separate
    ``fedleak defense serve --defense prune:p=0.9`` process and comes back pruned."""
    from fedleak.harness.victim.process import VictimProcess

    service = VictimProcess(["--defense", "prune:p=0.9", "--port", "0"],
                            command=[sys.executable, "-m", "fedleak", "defense", "serve"]
                            ).start()
    try:
        s = settings(tmp_path, protocol="fedavg", images=2, lr=0.1, record_only=True,
                     defenses=(f"remote:address={service.address}",))
        run_server(LocalGrid(s), s)
        for _, arrays in recorded(Path(s.out)):
            for key, g in arrays.items():
                if key.startswith("update/"):
                    assert int((g == 0).sum()) == g.numel() - round(0.1 * g.numel())
    finally:
        service.stop()


def test_a_fedsgd_gradient_through_flower_equals_the_victims(tmp_path: Path) -> None:
    """One-step FedSGD: the gradient g = (θ − θ′)/τ the audit reads is the victim's g."""
    s = settings(tmp_path, protocol="fedsgd", images=3, lr=0.5, record_only=True)
    run_server(LocalGrid(s), s)
    for partition, (entry, arrays) in enumerate(sorted(recorded(Path(s.out)),
                                                       key=lambda r: r[0]["folder"])):
        assert entry["update_kind"] == "gradient"
        theta = {k.split("/", 1)[1]: v for k, v in arrays.items()
                 if k.startswith(("param/", "buffer/"))}
        got = [v for k, v in arrays.items() if k.startswith("update/")]
        for g, w in zip(got, victim_update(s, theta, partition), strict=True):
            torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-5)


def test_the_psnr_through_flower_is_the_psnr_against_the_victims_update(tmp_path: Path) -> None:
    """Same θ, batch, protocol and attack seed: the audit's score (on the node) equals the
    score of the same attack on the update fedleak's victim computes, to report precision."""
    from fedleak.attacks import create_attack
    from fedleak.harness.metrics.image_metrics import score_reconstruction
    from fedleak.harness.zoo.datasets import denormalize

    s = settings(tmp_path, nodes=1, protocol="fedavg", lr=0.1, images=2,
                 options=("iterations=8", "restarts=1"), seed=3)
    run_server(LocalGrid(s), s)
    (entry,) = json.loads((Path(s.out) / "metrics.json").read_text())["rounds"]
    data = load_dataset(s.dataset, "train")
    torch.manual_seed(s.model_seed)
    model = build_model(s.model, data.info.shape, data.info.num_classes)
    images, labels = node_batch(data, 0, 1, 1, s.images)
    observation = observe(model, images, labels, data.info, s.procedure().protocol)
    attack = create_attack(s.attack, s.attack_options())
    reconstruction = attack.reconstruct(observation, device="cpu", seed=s.seed)
    alone = score_reconstruction(denormalize(reconstruction.images, data.info).clamp(0, 1),
                                 images)
    assert entry["mean_psnr"] == pytest.approx(alone.mean_psnr, abs=0.02)
    assert entry["mean_ssim"] == pytest.approx(alone.mean_ssim, abs=0.002)


def test_a_recording_is_attacked_later_from_the_cli(tmp_path: Path) -> None:
    s = settings(tmp_path, record_only=True)
    run_server(LocalGrid(s), s)
    out = tmp_path / "later"
    result = CliRunner().invoke(main, ["attack", "--from-recording", s.out, "-o",
                                       "iterations=2", "--restarts", "1", "--out", str(out),
                                       "--quiet"])
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "finished" and len(metrics["rounds"]) == 2
    assert all("ground truth stayed on the node" in r["unscored"] for r in metrics["rounds"])
    assert (out / metrics["rounds"][0]["files"]["reconstruction"]).exists()
    both = CliRunner().invoke(main, ["attack", "--from-recording", s.out, "--victim", "x:1"])
    assert both.exit_code != 0 and "either --victim" in both.output
    empty = CliRunner().invoke(main, ["attack", "--from-recording", str(tmp_path)])
    assert empty.exit_code != 0 and "recording.json" in empty.output


# --------------------------------------------------------------------------- audit and scoring


class Spy(FedAvg):
    """FedAvg that keeps the replies it was given."""

    seen: list[Message] = []

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> Any:
        replies = list(replies)
        Spy.seen = replies
        return super().aggregate_train(server_round, replies)


def test_the_audit_attacks_every_node_scores_on_the_node_and_passes_replies_on(
        tmp_path: Path) -> None:
    s = settings(tmp_path)
    grid = LocalGrid(s, node_config={"fedleak-allow-reveal": True})
    data = load_dataset(s.dataset, "train")
    torch.manual_seed(0)
    model = build_model(s.model, data.info.shape, data.info.num_classes)
    audit = LeakageAudit(Spy(min_train_nodes=2, min_available_nodes=2, fraction_evaluate=0),
                         s.model, s.dataset, Path(s.out), options=s.attack_options(),
                         background=False)  # attacked and scored in the round
    messages = list(audit.configure_train(1, ArrayRecord(model.state_dict()),
                                          ConfigRecord(s.procedure().config()), grid))
    replies = grid.send_and_receive(messages)
    before = [tensors(r.content["arrays"]) for r in replies]  # type: ignore[arg-type]
    arrays, _ = audit.aggregate_train(1, replies)
    assert arrays is not None
    assert Spy.seen == replies  # the same messages, in order
    for reply, kept in zip(Spy.seen, before, strict=True):
        for key, value in tensors(reply.content["arrays"]).items():  # type: ignore[arg-type]
            assert torch.equal(value, kept[key])
    metrics = json.loads((Path(s.out) / "metrics.json").read_text())
    assert len(metrics["rounds"]) == 2 and metrics["warnings"] == []
    for entry in metrics["rounds"]:
        assert entry["images"] and 0 < entry["mean_psnr"] < 100
        assert entry["label_accuracy"] is not None
        assert (Path(s.out) / entry["files"]["comparison"]).exists()  # the node revealed
    # a second submission for the same round is refused by the node's budget
    node = replies[0].metadata.src_node_id
    again = Message(submission_content(1, torch.rand(1, 1, 8, 8), [0]), dst_node_id=node,
                    message_type=SCORE_MESSAGE_TYPE)
    answer = score_reply(again, grid.contexts[node], data.info)
    assert answer.has_error() and "score budget is 1" in answer.error.reason
    stale = Message(submission_content(2, torch.rand(1, 1, 8, 8), [0]), dst_node_id=node,
                    message_type=SCORE_MESSAGE_TYPE)
    assert "not round 2" in score_reply(stale, grid.contexts[node], data.info).error.reason


class Tolerant(FedAvg):
    """FedAvg that aggregates nothing (FedAvg itself refuses the malformed replies)."""

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> Any:
        Spy.seen = list(replies)
        return None, None


def test_replies_that_cannot_be_attacked_are_recorded_and_the_round_goes_on(
        tmp_path: Path) -> None:
    s = settings(tmp_path)
    grid = LocalGrid(s)
    data = load_dataset(s.dataset, "train")
    model = build_model(s.model, data.info.shape, data.info.num_classes)
    audit = LeakageAudit(Tolerant(min_train_nodes=2, min_available_nodes=2), s.model, s.dataset,
                         Path(s.out), options=s.attack_options(), score=False,
                         background=False)
    config = {"fedleak-protocol": "fedsgd", "lr": 0.1, "batchnorm": "train"}
    first, second = audit.configure_train(1, ArrayRecord(model.state_dict()),
                                          ConfigRecord(config), grid)
    state = tensors(first.content["arrays"])  # type: ignore[arg-type]
    first_key = next(iter(state))
    wrong = {k: (v[:1] if k == first_key else v) for k, v in state.items()}
    malformed = Message(RecordDict({"arrays": record_of(wrong), "metrics": MetricRecord(
        {"num-examples": 1})}), reply_to=first)
    no_n = Message(RecordDict({"arrays": record_of(state)}), reply_to=second)
    audit.aggregate_train(1, [malformed, no_n])
    assert Spy.seen == [malformed, no_n]
    warnings = audit.run.warnings
    assert any(f"array {first_key!r} has shape" in w for w in warnings)
    assert any("no num-examples" in w for w in warnings)
    assert audit.run.rounds == []
    # a node with its own loop is attacked, with the loud warning
    first, _ = audit.configure_train(2, ArrayRecord(model.state_dict()), ConfigRecord(config),
                                     grid)  # the other node's reply never comes
    own = Message(RecordDict({"arrays": record_of({k: v * 0.99 for k, v in state.items()}),
                              "metrics": MetricRecord({"num-examples": 1})}), reply_to=first)
    audit.aggregate_train(2, [own])
    (silent,) = set(grid.contexts) - {first.metadata.dst_node_id}
    assert any(w.startswith("round 2, node-") and
               f"(Flower node {silent}): not attacked: no reply" in w for w in audit.run.warnings)
    (entry,) = audit.run.rounds
    assert any("its own loop" in w for w in entry.warnings)
    assert entry.unscored == "scoring on the nodes is off"


def test_the_audit_refuses_a_strategy_without_the_message_api(tmp_path: Path) -> None:
    from flwr.server.strategy import FedAvg as LegacyFedAvg

    with pytest.raises(TypeError, match="Message-API strategy"):
        LeakageAudit(LegacyFedAvg(), MLP, "digits", tmp_path)  # type: ignore[arg-type]


def test_the_procedure_says_what_it_cannot_replay() -> None:
    exact = procedure_from_config({"fedleak-protocol": "fedavg", "local-epochs": 2,
                                   "local-batch-size": 1, "lr": 0.1, "batchnorm": "eval",
                                   "momentum": 0.0, "weight-decay": 0, "nesterov": False,
                                   "shuffle": False})
    assert exact.replay_warnings() == [] and exact.protocol.batchnorm == "eval"
    assert exact.inexact_reasons(4) == []
    loose = procedure_from_config({"fedleak-protocol": "fedavg", "momentum": 0.9,
                                   "shuffle": True})
    assert loose.protocol.momentum == 0.9 and loose.protocol.shuffle  # replayed, not refused
    text = " ".join(loose.replay_warnings())
    assert "local-epochs" in text and "lr" in text and "weight-decay" in text
    adam = procedure_from_config({"fedleak-protocol": "fedavg", "optimizer": "Adam"})
    assert "optimizer 'adam'" in " ".join(adam.inexact_reasons(1))
    # what the server states fills in what the config leaves out, without warnings
    stated = LocalProcedure.of(kind="fedavg", local_epochs=1, local_batch_size=32, lr=0.1,
                               momentum=0.9, shuffle=True)
    quickstart = procedure_from_config({"lr": 0.01, "server-round": 1}, stated)
    assert quickstart.replay_warnings() == []
    assert quickstart.protocol == stated.protocol.with_changes({"learning_rate": 0.01})


# --------------------------------------------------------------------------- mods and train


def train_message(theta: dict[str, torch.Tensor], config: dict[str, Any]) -> Message:
    return Message(RecordDict({"arrays": record_of(theta), "config": ConfigRecord(config)}),
                   dst_node_id=7, message_type="train")


def test_a_prune_mod_on_a_hand_built_message(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = build_model(MLP, (1, 8, 8), 10)
    theta = {k: v.detach().clone() for k, v in model.state_dict().items()}
    msg = train_message(theta, {"fedleak-protocol": "fedavg", "lr": 0.1})
    delta = {k: torch.randn_like(v) * 0.01 for k, v in theta.items()}

    def client(m: Message, context: Context) -> Message:
        sent = tensors(m.content["arrays"])  # type: ignore[arg-type]
        return Message(RecordDict({"arrays": record_of({k: v + delta[k] for k, v in
                                                        sent.items()})}), reply_to=m)

    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    reply = DefenseMod("prune:p=0.9")(msg, context, client)
    got = tensors(reply.content["arrays"])  # type: ignore[arg-type]
    for key, value in theta.items():
        update = got[key] - value
        assert int((update != 0).sum()) == round(0.1 * value.numel())
        kept = update != 0
        torch.testing.assert_close(update[kept], delta[key][kept])
    # a reply with other shapes becomes an error reply naming the mod
    bad = DefenseMod("clip:max-norm=1")(msg, context, lambda m, c: Message(
        RecordDict({"arrays": record_of({"x": torch.zeros(2)})}), reply_to=m))
    assert bad.has_error() and "clip" in bad.error.reason and "missing" in bad.error.reason


def test_mods_refuse_per_example_and_transport_defenses_with_the_reason() -> None:
    with pytest.raises(DefenseModError, match="per-example.*train"):
        DefenseMod("dpsgd:noise-multiplier=1")
    with pytest.raises(DefenseModError, match="SecAgg\\+.*only the aggregate"):
        DefenseMod("secagg")
    result = CliRunner().invoke(main, ["flower", "simulate", "--defense", "secagg"])
    assert result.exit_code == 2 and "SecAgg+" in result.output


def test_dp_sgd_in_the_train_helper_reports_epsilon_over_the_nodes_rounds() -> None:
    data = load_dataset("digits", "train")
    model = build_model(MLP, data.info.shape, data.info.num_classes)
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    sent = ArrayRecord(model.state_dict())
    spent = []
    for server_round in (1, 2):
        config = {"fedleak-protocol": "fedsgd", "lr": 0.1, "server-round": server_round}
        _, metrics = train(model, sent, data.images[:4], data.labels[:4], data.info, config,
                           defenses=["dpsgd:noise-multiplier=1,max-grad-norm=1"],
                           context=context, generator=torch.Generator().manual_seed(0))
        spent.append((metrics["epsilon-round"], metrics["epsilon-total"]))
    (round1, total1), (round2, total2) = spent
    assert round1 == pytest.approx(round2) and total1 == pytest.approx(round1)
    assert total2 > total1
    with pytest.raises(ValueError, match="optimizer 'adam'"):
        train(model, sent, data.images[:2], data.labels[:2], data.info,
              {"fedleak-protocol": "fedavg", "optimizer": "adam"})


def test_every_client_defense_publishes_itself_in_the_reply() -> None:
    """fedleak's DefenseMod and DP-SGD train helper, and Flower's own DP mods wrapped by
    publishing(), name their chain in the reply (as Describe does for a victim), in order;
    an unrecognised mod without a chain is refused."""
    from flwr.clientapp.mod import LocalDpMod, fixedclipping_mod

    from fedleak.harness.flower.node.published_defenses import (
        local_dp_sigma,
        published_chain,
        publishing,
    )

    data = load_dataset("digits", "train")
    model = build_model(MLP, data.info.shape, data.info.num_classes)
    theta = {k: v.detach().clone() for k, v in model.state_dict().items()}
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    config = {"fedleak-protocol": "fedsgd", "lr": 0.1, "server-round": 1, "clipping_norm": 2.0}

    def handler(msg: Message, ctx: Context) -> Message:
        trained = train(model, msg.content["arrays"], data.images[:2],  # type: ignore[arg-type]
                        data.labels[:2], data.info, config,
                        defenses=["dpsgd:noise-multiplier=1,max-grad-norm=1"],
                        generator=torch.Generator().manual_seed(0))
        return Message(trained.content(), reply_to=msg)

    def through(*mods: Any) -> Message:
        """``handler`` behind ``mods`` (the first outermost, as a ClientApp's mods list)."""
        from flwr.clientapp import ClientApp

        app = ClientApp(mods=list(mods))
        app.train()(handler)
        return app(train_message(theta, config), context)

    chain = published_chain(through(DefenseMod("prune:p=0.9"), DefenseMod("clip:max-norm=5"))
                            .content)
    assert chain is not None
    assert [d.spec() for d in chain] == ["dpsgd:accountant=rdp,clipping=flat,delta=1e-05,"
                                         "max-grad-norm=1.0,noise-multiplier=1.0,poisson=False",
                                         "clip:max-norm=5.0", "prune:p=0.9,scope=layer"]
    local = LocalDpMod(clipping_norm=1.5, sensitivity=1.0, epsilon=2.0, delta=1e-5)
    chain = published_chain(through(publishing(local), publishing(fixedclipping_mod)).content)
    assert chain is not None
    sigma = local_dp_sigma(1.0, 2.0, 1e-5)
    assert sigma == pytest.approx(2.4225, abs=1e-4)  # 1 * sqrt(2 ln(1.25e5)) / 2
    assert [d.spec() for d in chain][1:] == ["clip:max-norm=2.0", "clip:max-norm=1.5",
                                             f"noise:distribution=gaussian,sigma={sigma!r}"]
    with pytest.raises(TypeError, match="name the defense it applies"):
        publishing(lambda m, c, n: n(m, c))
    assert published_chain(RecordDict()) is None


def test_the_audit_records_the_published_chain_and_attacks_with_the_aware_parts(
        tmp_path: Path) -> None:
    """A prune:p=0.9 mod: every round's metrics.json entry names the chain, and the attack's
    parts say they were chosen from it (the default weighs them against the blind ones)."""
    s = settings(tmp_path, defenses=("prune:p=0.9",), protocol="fedavg", lr=0.1)
    run_server(LocalGrid(s), s)
    metrics = json.loads((Path(s.out) / "metrics.json").read_text())
    assert metrics["status"] == "finished" and len(metrics["rounds"]) == 2
    for entry in metrics["rounds"]:
        assert entry["defenses"] == ["prune:p=0.9,scope=layer"]
        assert any(r.startswith("objective masked-cosine") for r in
                   entry["parts"]["part_reasons"])
        assert entry["attack_extras"]["selected"] in ("aware", "blind")
        assert not any("publishes no defense" in w for w in entry["warnings"])


def test_a_missing_score_handler_is_one_readable_line() -> None:
    from fedleak.harness.flower.auditor import score_error

    reason = ("\x1b[91mERROR\x1b[0m Traceback (most recent call last):\n  File \"ray/x.py\", "
              "line 1\n    raise ValueError\nValueError: No query function registered with "
              "name 'fedleak_score'\n")
    line = score_error(reason)
    assert "\n" not in line and "\x1b" not in line
    assert "@app.query(\"fedleak_score\")" in line and "score_reply" in line
    assert "remember_batch" in line
    assert score_error("\x1b[1mboom\x1b[0m\nValueError: budget spent\n") == \
        "the node refused to score: ValueError: budget spent"


def test_without_flwr_the_bridge_names_the_install_command() -> None:
    code = "import sys; sys.modules['flwr'] = None; import fedleak.harness.flower"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, timeout=600)
    assert result.returncode != 0
    assert "pip install 'fedleak[flower]'" in result.stderr


# --------------------------------------------------------------------------- SecAgg+


def secagg_round(tmp_path: Path, **changes: Any) -> FederationSettings:
    """One SecAgg+ round of 3 nodes x 2 images through Flower's own workflow and mod."""
    s = settings(tmp_path, nodes=3, images=2, secagg_plus=True, **changes)
    run_server(LocalGrid(s, node_config={"fedleak-allow-reveal": True}, wire=True), s)
    return s


@pytest.mark.parametrize(("protocol", "lr"), [("fedsgd", 0.5), ("fedavg", 0.1)])
def test_the_secagg_plus_aggregate_is_the_mean_of_the_nodes_updates(
        tmp_path: Path, protocol: str, lr: float) -> None:
    """What the audit reads off a SecAgg+ round (Flower's SecAggPlusWorkflow + secaggplus_mod,
    3 nodes) is the n-weighted mean of the updates fedleak's victim computes for each node's
    batch at the same θ, to SecAgg+'s quantisation bound (2 * 8 / 2**22 per entry here, over τ
    for a gradient) — and no single node's update."""
    s = secagg_round(tmp_path, protocol=protocol, lr=lr, record_only=True)
    ((entry, arrays),) = recorded(Path(s.out))
    assert entry["num_images"] == 6 and entry["local_steps"] == 1
    assert entry["metadata"]["server_view"] == "secagg+ aggregate of 3 nodes"
    theta = {k.split("/", 1)[1]: v for k, v in arrays.items()
             if k.startswith(("param/", "buffer/"))}
    got = [v for k, v in arrays.items() if k.startswith("update/")]
    per_node = [victim_update(s, theta, partition) for partition in range(3)]
    bound = s.secagg().error_bound([2, 2, 2]) / (lr if protocol == "fedsgd" else 1)
    assert bound == pytest.approx(2 * 8 / 2**22 / (lr if protocol == "fedsgd" else 1))
    for i, g in enumerate(got):
        mean = sum(node[i] for node in per_node) / 3
        assert float((g - mean).abs().max()) <= bound + 1e-6
        assert all(float((g - node[i]).abs().max()) > 10 * bound for node in per_node)


def test_the_secagg_plus_audit_attacks_the_aggregate_and_says_so(tmp_path: Path) -> None:
    """metrics.json records the threat model (the aggregate of K nodes), the survivors and the
    quantisation bound; every node scores the pooled reconstruction against its own batch."""
    from fedleak.harness.flower.secagg.aggregate_audit import SERVER_VIEW

    s = secagg_round(tmp_path, protocol="fedsgd", lr=0.5)
    metrics = json.loads((Path(s.out) / "metrics.json").read_text())
    assert metrics["settings"]["server_view"] == SERVER_VIEW
    assert metrics["settings"]["secagg_plus"]["max_weight"] == 2.0
    assert metrics["status"] == "finished" and metrics["warnings"] == []
    (entry,) = metrics["rounds"]
    assert entry["server_view"] == "secagg+ aggregate of 3 nodes"
    assert entry["round_id"] == "1/aggregate" and entry["num_images"] == 6
    aggregate = entry["aggregate"]
    assert [n["num_images"] for n in aggregate["nodes"]] == [2, 2, 2]
    assert all("mean_psnr" in n for n in aggregate["nodes"])
    assert aggregate["weights"] == pytest.approx([1 / 3] * 3)
    assert aggregate["quantization_error_bound"] == pytest.approx(2 * 8 / 2**22)
    assert "one-to-one within each node" in aggregate["matching"]
    assert len(entry["images"]) == 6 and 0 < entry["mean_psnr"] < 100
    assert sorted(i["index"] for i in entry["images"]) == list(range(6))
    assert (Path(s.out) / entry["files"]["comparison"]).exists()  # every node revealed


class Fixed(LegacyFedAvg):
    """Legacy FedAvg that sends θ and one config to given nodes (no client manager)."""

    def __init__(self, nodes: list[int], config: dict[str, Any]) -> None:
        super().__init__(fraction_evaluate=0.0)
        self.nodes, self.config = nodes, config

    def configure_fit(self, server_round: int, parameters: Any, client_manager: Any
                      ) -> list[tuple[Any, FitIns]]:
        return [(SimpleNamespace(node_id=n), FitIns(parameters, dict(self.config)))
                for n in self.nodes]


def test_the_aggregate_audit_on_constructed_results(tmp_path: Path) -> None:
    """AggregateAudit alone: two nodes of 1 and 3 images, FedSGD at τ; the aggregate
    θ − τ (1·g₁ + 3·g₂)/4 that SecAgg+ would hand over becomes exactly the gradient of the
    pooled batch of 4 (what the attack replays); results it cannot attack are recorded."""
    from flwr.common import Code, FitRes, Status

    from fedleak.harness.flower.secagg.aggregate_audit import AggregateAudit
    from fedleak.harness.flower.secagg.legacy import parameters_of
    from fedleak.harness.flower.secagg.secaggplus_settings import SecAggPlus

    data = load_dataset("digits", "train")
    torch.manual_seed(0)
    model = build_model(MLP, data.info.shape, data.info.num_classes)
    theta = {k: v.detach().clone() for k, v in model.state_dict().items()}
    protocol = procedure_from_config({"fedleak-protocol": "fedsgd", "lr": 0.5}).protocol
    batches = [(data.images[:1], data.labels[:1]), (data.images[1:4], data.labels[1:4])]
    grads = [observe(model, x, y, data.info, protocol).update for x, y in batches]
    names = [k for k, _ in model.named_parameters()]
    mean = {k: (1 * g1 + 3 * g2) / 4 for k, g1, g2 in zip(names, *grads, strict=True)}
    aggregate = parameters_of({k: v - 0.5 * mean[k] if k in mean else v
                               for k, v in theta.items()})
    config = {"fedleak-protocol": "fedsgd", "lr": 0.5, "batchnorm": "train"}
    audit = AggregateAudit(Fixed([1, 2], config), MLP, "digits", tmp_path / "a",
                           secagg=SecAggPlus(max_weight=3), record_only=True,
                           log=lambda _: None)

    def results(params: list[Any], counts: list[int]) -> list[tuple[Any, FitRes]]:
        return [(SimpleNamespace(node_id=i + 1), FitRes(Status(Code.OK, ""), p, n,
                                                        {"fedleak-replayable": 1}))
                for i, (p, n) in enumerate(zip(params, counts, strict=True))]

    audit.configure_fit(1, parameters_of(theta), None)  # type: ignore[arg-type]
    audit.aggregate_fit(1, results([aggregate, aggregate], [1, 3]), [])
    ((entry, arrays),) = recorded(tmp_path / "a")
    assert entry["num_images"] == 4 and entry["update_kind"] == "gradient"
    assert entry["metadata"]["images_per_node"] == "1,3"
    pooled = observe(model, data.images[:4], data.labels[:4], data.info, protocol).update
    for name, want in zip(names, pooled, strict=True):
        torch.testing.assert_close(arrays[f"update/{name}"], want, rtol=1e-4, atol=1e-5)
    assert audit.audited == [(1, (1, 2))]
    # what it refuses, with the reason, the round going on
    audit.configure_fit(2, parameters_of(theta), None)  # type: ignore[arg-type]
    audit.aggregate_fit(2, results([aggregate, parameters_of(theta)], [1, 3]), [])
    audit.aggregate_fit(2, [], [RuntimeError("dropped")])
    audit.inner.config = {"fedleak-protocol": "fedavg", "local-epochs": 2, "lr": 0.1}
    audit.configure_fit(3, parameters_of(theta), None)  # type: ignore[arg-type]
    audit.aggregate_fit(3, results([aggregate, aggregate], [1, 3]), [])
    text = " ".join(audit.run.warnings)
    assert "different parameters" in text and "no node's masked update survived" in text
    assert "separate multi-step trajectories" in text
    # parameters near SecAgg+'s clipping range are attacked, with the warning
    audit.secagg, audit.inner.config = SecAggPlus(max_weight=3, clipping_range=0.1), config
    audit.configure_fit(4, parameters_of(theta), None)  # type: ignore[arg-type]
    audit.aggregate_fit(4, results([aggregate, aggregate], [1, 3]), [])
    assert any("SecAgg+ clips" in w for w in recorded(tmp_path / "a")[-1][0]["warnings"])
    with pytest.raises(TypeError, match="legacy strategy"):
        AggregateAudit(FedAvg(), MLP, "digits", tmp_path)  # type: ignore[arg-type]


def test_a_node_finds_and_scores_its_own_images_in_an_aggregates_reconstruction() -> None:
    truth = torch.rand(2, 1, 8, 8)
    context = Context(run_id=1, node_id=7, node_config={"fedleak-score-budget": 2},
                      state=RecordDict(), run_config={})
    remember_batch(context, 1, truth, torch.tensor([3, 4]))
    data = load_dataset("digits", "train")
    pooled = torch.stack([torch.rand(1, 8, 8), truth[1], torch.rand(1, 8, 8), truth[0]])
    query = Message(submission_content(1, pooled, [0, 4, 0, 3], aggregate=True),
                    dst_node_id=7, message_type=SCORE_MESSAGE_TYPE)
    answer = score_reply(query, context, data.info)
    scores = dict(answer.content.metric_records["fedleak.score"])
    assert scores["matched"] == [3, 1] and min(scores["psnr"]) > 90
    assert scores["label-accuracy"] == 1.0
    short = Message(submission_content(1, pooled[:1], [0], aggregate=True), dst_node_id=7,
                    message_type=SCORE_MESSAGE_TYPE)
    assert "fewer than the 2" in score_reply(short, context, data.info).error.reason


@pytest.mark.parametrize(("args", "message"), [
    (["--nodes", "1"], "at least 2 nodes"),
    (["--nodes", "3", "--secagg-threshold", "4"], "threshold must lie in [2, shares = 3]"),
    (["--nodes", "4", "--secagg-shares", "2"], "at least 3"),
    (["--images", "2", "--secagg-max-weight", "1"], "above SecAgg+'s max weight 1"),
    (["--nodes", "3", "--secagg-quantization-range", str(2**31)], "wrap around"),
])
def test_secagg_plus_options_are_checked_before_flower_starts(args: list[str],
                                                             message: str) -> None:
    result = CliRunner().invoke(main, ["flower", "simulate", "--secagg-plus", *args])
    assert result.exit_code == 2 and message in result.output, result.output
    alone = CliRunner().invoke(main, ["flower", "simulate", "--secagg-shares", "3"])
    assert alone.exit_code == 2 and "only apply with --secagg-plus" in alone.output


def test_the_cli_secagg_defaults_are_the_federations() -> None:
    """The CLI writes its SecAgg+ defaults down so that --help imports no Flower: they must be
    FederationSettings' own (whose clipping and quantisation are SecAggPlus's)."""
    import dataclasses

    from fedleak.harness.cli.flower_command import SECAGG_DEFAULTS
    from fedleak.harness.flower.federation import FederationSettings

    defaults = {f.name: f.default for f in dataclasses.fields(FederationSettings)}
    assert SECAGG_DEFAULTS == {key: defaults[key] for key in SECAGG_DEFAULTS}


# --------------------------------------------------------------------------- simulation


def simulate_cli(tmp_path: Path, *args: str) -> tuple[str, dict[str, Any]]:
    """``fedleak flower simulate --rounds 1 --model MLP -o iterations=3 ... ARGS`` in a separate
    process (Flower's simulation engine: Ray, one torch thread per node): stdout, metrics."""
    out = tmp_path / "sim"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    result = subprocess.run(
        [sys.executable, "-m", "fedleak", "flower", "simulate", "--rounds", "1", "--model", MLP,
         "-o", "iterations=3", "-o", "restarts=1", "--out", str(out), *args],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=FEDERATION_SECONDS)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "finished"
    return result.stdout, metrics


@pytest.mark.integration
def test_simulation_from_the_cli_attacks_and_scores_every_node(tmp_path: Path) -> None:
    """2 nodes, 1 round, a prune:p=0.9 mod, the nodes allowed to reveal: every reply publishes
    the defense, metrics.json names it and the defense-aware parts the attack chose from it,
    the nodes carry readable names and every node's comparison picture is written."""
    stdout, metrics = simulate_cli(tmp_path, "--nodes", "2", "--defense", "prune:p=0.9",
                                   "--allow-reveal")
    assert "2 node update(s) attacked and scored" in stdout
    assert "published client defenses: prune:p=0.9,scope=layer" in stdout
    assert "comparison pictures: 2" in stdout
    assert len(metrics["rounds"]) == 2
    for entry in metrics["rounds"]:
        assert entry["images"] and entry["mean_psnr"] is not None
        assert entry["defenses"] == ["prune:p=0.9,scope=layer"]
        # the aware parts chosen from the published chain, weighed against the blind ones
        assert any(r.startswith("objective masked-cosine") and "prune published" in r
                   for r in entry["parts"]["part_reasons"])
        assert entry["attack_extras"]["selected"] in ("aware", "blind")
        assert entry["parts"]["objective"] == {"aware": "masked-cosine",
                                               "blind": "cosine"}[
            entry["attack_extras"]["selected"]]
        assert (tmp_path / "sim" / entry["files"]["comparison"]).exists()
    assert sorted(r["round_id"] for r in metrics["rounds"]) == ["1/node-0", "1/node-1"]
    assert sorted(p.name for p in (tmp_path / "sim").glob("round-*")) == \
        ["round-001-node-0", "round-001-node-1"]


@pytest.mark.integration
def test_a_simulation_starts_its_own_ray_beside_a_running_cluster(tmp_path: Path) -> None:
    """Another job's Ray cluster on the machine is left alone: the simulation starts a Ray of
    its own (before, Flower joined that cluster and Ray refused it at once, "When connecting to
    an existing cluster, num_cpus and num_gpus must not be provided")."""
    ray = str(Path(sys.executable).with_name("ray"))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run([ray, "start", "--head", "--port", str(6450 + os.getpid() % 40),
                    "--num-cpus", "1", "--include-dashboard", "false",
                    "--disable-usage-stats"], check=True, env=env, capture_output=True,
                   timeout=600)
    try:
        stdout, metrics = simulate_cli(tmp_path, "--nodes", "1")
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=600)
    assert "1 node update(s) attacked and scored" in stdout
    assert len(metrics["rounds"]) == 1


def test_a_rerun_into_a_used_out_is_refused_before_flower_starts(tmp_path: Path) -> None:
    """--out that holds an audit run is refused with what to do; --overwrite removes that run
    (its metrics.json, recording.json and round-* folders, nothing else) and starts clean."""
    from fedleak.harness.flower.auditor import FolderInUse, claim_folder

    out = tmp_path / "used"
    (out / "round-001-node-0").mkdir(parents=True)
    (out / "metrics.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    result = CliRunner().invoke(main, ["flower", "simulate", "--out", str(out)])
    assert result.exit_code == 2 and "already holds an audit run" in result.output
    assert "--overwrite" in result.output
    with pytest.raises(FolderInUse):
        LeakageAudit(FedAvg(), MLP, "digits", out)
    claim_folder(out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


@pytest.mark.integration
def test_simulation_under_secagg_plus_attacks_the_aggregate(tmp_path: Path) -> None:
    """3 nodes x 2 images under Flower's SecAgg+ (threshold 2), 1 round."""
    stdout, metrics = simulate_cli(tmp_path, "--nodes", "3", "--images", "2", "--lr", "0.5",
                                   "--secagg-plus", "--secagg-threshold", "2")
    assert "server view: secagg+ aggregate of 3 nodes" in stdout
    assert "1 SecAgg+ aggregate(s) attacked" in stdout
    (entry,) = metrics["rounds"]
    assert entry["server_view"] == "secagg+ aggregate of 3 nodes" and len(entry["images"]) == 6


# --------------------------------------------------------------------------- real deployment


@pytest.mark.integration
@pytest.mark.parametrize("secagg_plus", [
    False,
    pytest.param(True, marks=pytest.mark.skipif(
        os.environ.get("FEDLEAK_FLOWER_DEPLOYMENT") != "1",
        reason="about 60 s more (Flower starts a process per message): set "
               "FEDLEAK_FLOWER_DEPLOYMENT=1 to run the SecAgg+ deployment too")),
], ids=["plain", "secagg-plus"])
def test_the_documented_deployment_script_runs_and_leaves_nothing_behind(
        tmp_path: Path, secagg_plus: bool) -> None:
    """docs/flower.md's command: examples/flower_deploy.py starts a SuperLink (a real state
    file in its temporary folder, no runtime dependency installation) and two SuperNodes on
    free loopback ports, waits for them, runs `flwr run examples/flower_app`, and stops every
    process it started, flower-superexec included; afterwards no marked process is alive, the
    temporary folder is gone and the working folder holds only the run's output. Under
    SecAgg+ the audit attacks the aggregate of the two nodes."""
    out = tmp_path / "runs"
    work = tmp_path / "cwd"
    work.mkdir()
    temp = Path(os.environ.get("TMPDIR", "/tmp"))
    token = uuid.uuid4().hex  # this test's marker: other deployments here are not its own
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FEDLEAK_FLOWER_DEPLOY": token}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "flower_deploy.py"),
         str(ROOT / "examples" / "flower_app"), "--nodes", "2", "--run-config",
         f'out="{out}" options="iterations=3 restarts=1" model="{MLP}"'
         + (" secagg-plus=true" if secagg_plus else "")],
        env=env, capture_output=True, text=True, timeout=FEDERATION_SECONDS, cwd=work)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Created env for run" not in done.stdout + done.stderr  # no runtime install
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "finished" and len(metrics["rounds"]) == 2 - secagg_plus
    assert all(r["images"] for r in metrics["rounds"]), metrics
    if secagg_plus:
        assert metrics["rounds"][0]["server_view"] == "secagg+ aggregate of 2 nodes"
        assert len(metrics["rounds"][0]["images"]) == 2
    else:  # stable readable node names from the nodes' partition ids
        assert sorted(r["round_id"] for r in metrics["rounds"]) == ["1/node-0", "1/node-1"]
    assert marked_processes(token) == []
    assert list(temp.glob(f"fedleak-flower-{token[:12]}-*")) == []
    assert list(work.iterdir()) == []
