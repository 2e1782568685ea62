"""Flower's quickstart-pytorch, audited end to end (examples/flower_quickstart).

The example's ``Net`` and training loop as Flower ships them (SGD momentum 0.9, shuffled
batches of ``batch-size``, ``local-epochs`` epochs; a bundled-photos stand-in for its CIFAR-10
loader), its ServerApp and ClientApp wrapped as docs/flower.md tells a user to, run in this
process: every message crosses as Flower serialises it, each node has its own Context (as a
SuperNode gives it). With two photos per node one local step is taken, the replay of the
stated procedure is exact, and the audit's PSNR must be within 2 dB of what the same attack
gets on the update fedleak's own victim code computes for the same θ and images. With
batches of one photo the nodes' order matters: the audit models it (fedavg-shuffled) and the
round is "order unknown, modelled".
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("flwr", reason="needs fedleak[flower]")

from flwr.app import Context, Message, RecordDict  # noqa: E402
from flwr.common.serde import message_from_proto, message_to_proto  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedleak.attacks import create_attack  # noqa: E402
from fedleak.harness.federated.observe import observe  # noqa: E402
from fedleak.harness.federated.protocol import Protocol  # noqa: E402
from fedleak.harness.metrics.image_metrics import score_reconstruction  # noqa: E402
from fedleak.harness.zoo.datasets import denormalize, load_dataset  # noqa: E402
from tests.paths import REPO

EXAMPLE = REPO / "examples" / "flower_quickstart"
NODES = 2

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Nodes:
    """A Grid over the example's ClientApp: node i is a Context with partition-id i."""

    def __init__(self, app: Any, run_config: dict[str, Any]) -> None:
        self.app = app
        self.contexts = {100 + i: Context(run_id=1, node_id=100 + i, node_config={
            "partition-id": i, "num-partitions": NODES}, state=RecordDict(),
            run_config=dict(run_config)) for i in range(NODES)}

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Message], timeout: float | None = None
                         ) -> list[Message]:
        out = []
        for message in messages:
            crossed = message_from_proto(message_to_proto(message))
            reply = self.app(crossed, self.contexts[crossed.metadata.dst_node_id])
            out.append(message_from_proto(message_to_proto(reply)))
        return out


def run_quickstart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **changes: Any
                   ) -> dict[str, Any]:
    """The example's ServerApp main over its ClientApp on two nodes; its metrics.json."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from pytorchexample import client_app, server_app

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    run_config = {"num-server-rounds": 1, "fraction-evaluate": 0.0, "local-epochs": 1,
                  "learning-rate": 0.1, "batch-size": 32, "images-per-node": 2,
                  "out": str(tmp_path / "audit"), "iterations": 150, **changes}
    torch.manual_seed(0)  # the ServerApp's Net() is θ
    server_app.main(Nodes(client_app.app, run_config),
                    Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                            run_config=run_config))
    return json.loads((tmp_path / "audit" / "metrics.json").read_text())


def test_the_quickstart_with_its_own_loop_leaks_what_a_fedleak_victim_leaks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = run_quickstart(tmp_path, monkeypatch)
    from pytorchexample.task import INFO, Net

    assert metrics["status"] == "finished"
    assert metrics["settings"]["stated_procedure"].startswith("fedavg, 1 epoch(s), batch 32")
    rounds = sorted(metrics["rounds"], key=lambda r: r["round_id"])
    assert [r["round_id"] for r in rounds] == ["1/node-1", "1/node-2"]  # no partition metric
    photos = load_dataset("photos", "train")
    torch.manual_seed(0)
    theta = Net().state_dict()
    for partition, entry in enumerate(rounds):
        assert entry["replay"] == "exact" and entry["update_kind"] == "delta"
        assert entry["num_images"] == 2 and entry["local_steps"] == 1
        assert any("its own loop" in w for w in entry["warnings"])
        assert any("publishes no defense chain" in w for w in entry["warnings"])
        # the undefended fedleak victim on the same photos, θ, procedure and attack seed
        chosen = torch.arange(partition, len(photos), NODES)[:2]
        model = Net()
        model.load_state_dict(theta)
        observation = observe(model, photos.images[chosen], photos.labels[chosen], INFO,
                              Protocol("fedavg", 1, 32, 0.1, momentum=0.9, shuffle=True))
        attack = create_attack("inverting-gradients", {"iterations": entry["iterations"]})
        victim = score_reconstruction(
            denormalize(attack.reconstruct(observation, seed=0).images, INFO).clamp(0, 1),
            photos.images[chosen])
        assert abs(entry["mean_psnr"] - victim.mean_psnr) <= 2.0, (entry["mean_psnr"],
                                                                   victim.mean_psnr)
        assert entry["label_accuracy"] == 1.0
    assert metrics["summary"]["images"] == 4 and "inexact_summary" not in metrics


def test_the_quickstart_with_shuffled_batches_is_attacked_with_the_order_modelled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of one photo: two shuffled momentum steps per node in an order the server never
    sees. The audit attacks them with fedavg-shuffled (the order a variable, estimated from the
    output bias under momentum's step weights): "order unknown, modelled", in the headline."""
    metrics = run_quickstart(tmp_path, monkeypatch, **{"batch-size": 1, "iterations": 8})
    assert metrics["status"] == "finished"
    for entry in metrics["rounds"]:
        assert entry["replay"] == "modelled" and "inexact_reasons" not in entry
        assert entry["replay_model"][0].startswith("order unknown, modelled")
        assert entry["attack_extras"]["order_model"] == "modelled"
        assert entry["iterations"] == 8 and entry["mean_psnr"] is not None
        assert any("attacked with fedavg-shuffled" in w for w in entry["warnings"])
    assert metrics["summary"]["rounds"] == 2 and "inexact_summary" not in metrics
