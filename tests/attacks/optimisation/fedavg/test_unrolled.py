"""The fedavg attack: the replay is the user's local training, and the attack inverts deltas."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedleak.attacks import AttackConfigError, create_attack
from fedleak.attacks.optimisation.fedavg.unrolled import FedAvgObservationError
from fedleak.harness.attacker.attack_settings import AttackSettings
from fedleak.harness.attacker.client import VictimClient
from fedleak.harness.attacker.described import dataset_info, server_model
from fedleak.harness.attacker.run import run_attack
from fedleak.harness.attacker.update_attack import observation_for
from fedleak.harness.federated.local_update import UpdateSimulator, local_update
from fedleak.harness.federated.protocol import Protocol, ProtocolChanges
from fedleak.harness.metrics.image_metrics import psnr_per_image
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.zoo.datasets import normalize
from fedleak.harness.zoo.models import build_model
from tests.attacks.optimisation.presets.test_inverting_gradients import smooth_image
from tests.helpers import make_observation, to_unit

SHAPE = (3, 8, 8)
TOKEN = "fedavg-token"
#: Table 2's five (E, n, B) settings of Geiping et al.
TABLE2 = [(1, 4, 2), (1, 8, 2), (1, 8, 8), (5, 1, 1), (5, 8, 8)]


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(("epochs", "n", "batch"), TABLE2)
@pytest.mark.parametrize("model", ["lenet-zhu", "convnet:width=4"])
def test_replayed_delta_is_the_users_delta(model: str, epochs: int, n: int, batch: int):
    protocol = Protocol("fedavg", epochs, batch, 1e-2)
    torch.manual_seed(0)
    net = build_model(model, SHAPE, 10)
    params, buffers = dict(net.named_parameters()), dict(net.named_buffers())
    images = torch.rand(n, *SHAPE) * 2 - 1
    labels = torch.arange(n) % 10
    users = local_update(net, params, {k: b.clone() for k, b in buffers.items()}, images,
                         labels, protocol)
    simulator = UpdateSimulator(net, params, buffers, protocol)
    assert simulator.local_steps(n) == epochs * -(-n // batch)
    leaf = images.clone().requires_grad_(True)
    replayed = simulator(leaf, labels)
    assert all(u.grad_fn is not None for u in replayed)
    for user, replay in zip(users, replayed, strict=True):
        torch.testing.assert_close(replay, user, rtol=0, atol=1e-5)
    if simulator.vectorisable:
        batched = simulator.restarts(images[None].expand(2, *images.shape), labels)
        for user, many in zip(users, batched, strict=True):
            torch.testing.assert_close(many[1], user, rtol=0, atol=1e-5)


def test_fedavg_attack_recovers_one_image_from_five_local_steps():
    image = smooth_image(SHAPE)
    protocol = Protocol("fedavg", local_epochs=5, batch_size=1, learning_rate=1e-4)
    observation = make_observation("lenet-zhu", SHAPE, 10, image, torch.tensor([4]), protocol)
    result = create_attack("fedavg", {"iterations": 150, "tv": 1e-4}).reconstruct(observation)
    assert psnr_per_image(to_unit(observation, result.images), image).item() > 30.0
    assert result.labels.tolist() == [4]  # recovered from the delta, not given
    assert result.extras["local_steps"] == 5 and result.extras["label_source"] == "recover"


def test_labels_come_from_the_delta_unless_known_labels_are_asked_for():
    images = torch.cat([smooth_image(SHAPE), smooth_image(SHAPE).flip(-1)])
    protocol = Protocol("fedavg", local_epochs=1, batch_size=1, learning_rate=1e-2)
    observation = make_observation("lenet-zhu", SHAPE, 10, images, torch.tensor([6, 1]),
                                   protocol, give_labels=True)
    known = create_attack("fedavg", {"iterations": 2, "labels": "known"})
    assert known.reconstruct(observation).labels.tolist() == [6, 1]
    recovered = create_attack("fedavg", {"iterations": 2}).reconstruct(observation)
    assert recovered.extras["label_source"] == "recover"
    assert sorted(recovered.labels.tolist()) == [1, 6]
    blind = dataclasses.replace(observation, labels=None)
    with pytest.raises(FedAvgObservationError, match="labels=recover"):
        known.reconstruct(blind)


def test_what_the_attack_cannot_replay_is_refused():
    image = smooth_image(SHAPE)
    fedsgd = make_observation("lenet-zhu", SHAPE, 10, image, torch.tensor([1]))
    attack = create_attack("fedavg", {"iterations": 1})
    with pytest.raises(FedAvgObservationError, match="inverting-gradients"):
        attack.reconstruct(fedsgd)
    protocol = Protocol("fedavg", local_epochs=3, batch_size=1, learning_rate=1e-3)
    observation = make_observation("lenet-zhu", SHAPE, 10, image, torch.tensor([1]), protocol)
    with pytest.raises(FedAvgObservationError, match="reported 2"):
        attack.reconstruct(dataclasses.replace(observation, local_steps=2))
    with pytest.raises(AttackConfigError, match="recover"):
        create_attack("fedavg", {"labels": "guess"})


def fedleak(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fedleak", *args], capture_output=True,
                          text=True, timeout=1200)


def test_against_a_real_fedavg_victim(tmp_path: Path):
    """The replay equals the delta a victim process sent; the CLI runs the attack on it."""
    args = ["--dataset", "photos", "--split", "all", "--images", "0-3", "--model", "lenet-zhu",
            "--batch-size", "2", "--protocol", "fedavg", "--local-epochs", "2",
            "--local-batch-size", "1", "--lr", "0.01", "--allow-reveal"]
    with VictimProcess(args, token=TOKEN) as victim:
        with VictimClient(victim.address, token=TOKEN, timeout=60) as client:
            described = client.describe()
            info = dataset_info(described)
            params, buffers = client.global_model()
            received = client.compute_update(params, buffers)
            truth, labels = client.reveal(received.round_id)
            observation = observation_for(server_model(described), params, buffers, received,
                                          info, "cpu")
        assert observation.update_kind == "delta" and observation.local_steps == 4
        replayed = observation.simulate(normalize(truth, info), labels)
        for sent, replay in zip(received.update, replayed, strict=True):
            torch.testing.assert_close(replay.detach(), sent, rtol=0, atol=1e-5)

        out = tmp_path / "run"
        done = fedleak("attack", "--victim", victim.address, "--attack", "fedavg",
                       "--iterations", "10", "--restarts", "2", "--out", str(out), "--quiet")
        assert done.returncode == 0, done.stderr
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["attack"] == "fedavg"
        (entry,) = metrics["rounds"]
        assert entry["update_kind"] == "delta" and entry["local_steps"] == 4
        assert len(entry["restart_objectives"]) == 2 and entry["iterations"] == 20
        settings = AttackSettings(attack="fedavg", options={"iterations": 1},
                                  protocol=ProtocolChanges(kind="fedsgd"), show_progress=False)
        with VictimClient(victim.address, timeout=60) as client:  # the server asks for FedSGD
            with pytest.raises(FedAvgObservationError, match="inverting-gradients"):
                run_attack(client, settings, tmp_path / "refused", log=lambda _: None)
