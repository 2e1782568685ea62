"""The malicious server: imprint, trap weights and fishing in-process (their maths), vet, the
closed forms, the sweep's server architecture, and both across real processes through the CLI."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedleak.attacks import create_attack
from fedleak.attacks.malicious.crafted_parameters import AttackRefused, ServerKnowledge
from fedleak.attacks.malicious.fishing import Gate, GateDifference
from fedleak.attacks.malicious.imprint_guarantee import expected_single_bins, expected_trapped
from fedleak.defenses import create_defense
from fedleak.harness.federated.observe import observe
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.metrics.image_metrics import score_reconstruction
from fedleak.harness.sweep.grid.architecture import server_architecture, user_model
from fedleak.harness.sweep.grid.spec import load_preset
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.zoo.datasets import denormalize, load_dataset, normalize
from fedleak.harness.zoo.models import build_model

torch.set_num_threads(1)
DIGITS = load_dataset("digits", "train")
PUBLIC = load_dataset("digits", "test")
INFO = DIGITS.info


def knowledge(model: torch.nn.Module, images_per_user: int) -> ServerKnowledge:
    return ServerKnowledge(
        model, {n: p.detach().clone() for n, p in model.named_parameters()},
        {n: b.detach().clone() for n, b in model.named_buffers()},
        normalize(PUBLIC.images, INFO), "digits test split", INFO.shape, INFO.num_classes,
        "gradient", images_per_user)


def rounds(attack, spec: str, count: int, seed: int = 0):  # noqa: ANN001, ANN201
    """Run the attack's crafted rounds in-process on the first ``count`` digits."""
    torch.manual_seed(seed)
    model = build_model(spec, INFO.shape, INFO.num_classes)
    known = knowledge(model, count)
    attack.check(known)
    images, labels = DIGITS.images[:count], DIGITS.labels[:count]
    probes: list = []
    crafted = attack.craft(known, probes, seed)
    while True:
        user = copy.deepcopy(model)
        with torch.no_grad():
            for name, parameter in user.named_parameters():
                parameter.copy_(crafted[name])
        observation = observe(user, images, labels, INFO, Protocol())
        following = attack.craft(known, [*probes, observation], seed)
        if following is None:
            observation.probes = probes
            return observation, images
        probes.append(observation)
        crafted = following


def exact(attack, observation, truth) -> int:  # noqa: ANN001
    reconstruction = attack.reconstruct(observation)
    images = denormalize(reconstruction.images, INFO).clamp(0, 1)
    scored = score_reconstruction(images, truth, padding=reconstruction.padding)
    return scored.exact


def test_closed_forms() -> None:
    expected = expected_single_bins(256, 64)
    assert expected.paper == pytest.approx(41.185, abs=1e-2)  # the paper's ~41 of 64
    assert expected.multinomial == pytest.approx(64 * (256 / 257) ** 64)
    assert 0 < expected_trapped(512, 64, 1 / 64) < 64


def test_imprint_recovers_at_least_the_guarantee_from_64_digits() -> None:
    attack = create_attack("imprint")
    observation, truth = rounds(attack, "imprint:bins=256,inner=mlp,inner.width=32,inner.depth=1",
                                64)
    assert exact(attack, observation, truth) >= expected_single_bins(256, 64).paper - 3


def test_imprint_recovers_from_a_fedavg_delta_at_small_learning_rate() -> None:
    attack = create_attack("imprint")
    torch.manual_seed(0)
    model = build_model("imprint:bins=128,inner=mlp,inner.width=32,inner.depth=1", INFO.shape,
                        INFO.num_classes)
    crafted = attack.craft(knowledge(model, 16), [], 0)
    assert crafted is not None
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(crafted[name])
    protocol = Protocol(kind="fedavg", local_epochs=2, batch_size=4, learning_rate=1e-4)
    observation = observe(model, DIGITS.images[:16], DIGITS.labels[:16], INFO, protocol)
    assert exact(attack, observation, DIGITS.images[:16]) >= 8  # measured 10 of 16


def test_trap_weights_recover_half_of_64_digits_on_a_wide_mlp() -> None:
    attack = create_attack("trap-weights")
    observation, truth = rounds(attack, "mlp:width=512,depth=1", 64)
    assert exact(attack, observation, truth) >= 32


@pytest.mark.parametrize(("attack", "model", "reason"), [
    ("trap-weights", "lenet-zhu", "softmax"),
    ("trap-weights", "convnet:width=4", "Conv2d"),
    ("imprint", "mlp:width=16", "no imprint block"),
])
def test_models_that_cannot_carry_the_attack_are_refused(attack: str, model: str,
                                                         reason: str) -> None:
    torch.manual_seed(0)
    net = build_model(model, INFO.shape, INFO.num_classes)
    with pytest.raises(AttackRefused, match=reason):
        create_attack(attack).check(knowledge(net, 16))


def test_fishing_isolates_one_image_exactly_in_the_difference_of_two_rounds() -> None:
    attack = create_attack("fishing", {"rank": 1, "iterations": 1})
    observation, truth = rounds(attack, "lenet-zhu", 32)
    all_rounds = [*observation.probes, observation]
    assert len(all_rounds) <= 16
    reconstruction = attack.reconstruct(observation)
    first = all_rounds[reconstruction.extras["opened_round"]]
    second = all_rounds[reconstruction.extras["closed_round"]]
    difference = [a - b for a, b in zip(first.update, second.update, strict=True)]
    names = first.parameter_names
    row = first.parameters[names.index("fc.weight")][0].detach().double()
    gate = Gate("fc.weight", "fc.bias", 0, row / row.norm(), float(row.norm()), 0.0, 1.0)
    replay = GateDifference(first.simulate, gate, dict(zip(names, first.parameters,  # type: ignore[arg-type]
                                                           strict=True)), 1e3)

    def cosine(x: torch.Tensor) -> float:
        simulated = replay(x, torch.tensor([0]))
        dot = sum((a * b).sum() for a, b in zip(simulated, difference, strict=True))
        norms = sum((a * a).sum() for a in simulated) * sum((b * b).sum() for b in difference)
        return float((dot / norms.sqrt()).detach())

    cosines = [cosine(normalize(truth[i:i + 1], INFO)) for i in range(truth.shape[0])]
    assert max(cosines) > 0.9999  # one private image explains the difference exactly
    assert sorted(cosines)[-2] < 0.99  # and only one


def test_fishing_refuses_fedavg_and_rotating_batches() -> None:
    torch.manual_seed(0)
    net = build_model("lenet-zhu", INFO.shape, INFO.num_classes)
    known = knowledge(net, 16)
    known.update_kind = "delta"
    with pytest.raises(AttackRefused, match="FedSGD"):
        create_attack("fishing").check(known)
    known = knowledge(net, 16)
    known.same_data_each_round = False
    with pytest.raises(AttackRefused, match="same private images"):
        create_attack("fishing").check(known)


@pytest.mark.parametrize(("attack", "model", "options", "test"), [
    ("imprint", "imprint:bins=64,inner=mlp,inner.width=32", {"architecture": False}, "rows"),
    ("trap-weights", "mlp:width=128,depth=1", {}, "fire for"),
    ("fishing", "lenet-zhu", {}, "times the median"),
])
def test_vet_refuses_every_malicious_parameter_set(attack: str, model: str,
                                                    options: dict[str, bool], test: str) -> None:
    torch.manual_seed(0)
    net = build_model(model, INFO.shape, INFO.num_classes)
    crafted = create_attack(attack).craft(knowledge(net, 16), [], 0)
    assert crafted is not None
    batch = normalize(DIGITS.images[:16], INFO)
    vet = create_defense("vet", options)
    reason = vet.inspect(net, crafted, dict(net.named_buffers()), batch)
    assert reason is not None and test in reason


@pytest.mark.parametrize("model", ["lenet-zhu", "convnet:width=8", "mlp", "mlp:width=512,depth=1",
                                   "resnet20-4:width=1", "mlp:bias=false",
                                   "mlp:width=2048,depth=1"])  # 2,048 short classifier columns
def test_vet_accepts_honest_initialisations(model: str) -> None:
    vet = create_defense("vet")
    for seed in range(3):
        torch.manual_seed(seed)
        net = build_model(model, INFO.shape, INFO.num_classes)
        reason = vet.inspect(net, dict(net.named_parameters()), dict(net.named_buffers()),
                             normalize(DIGITS.images[:16], INFO))
        assert reason is None, (model, seed, reason)


def test_vet_refuses_the_imprint_architecture_by_default() -> None:
    torch.manual_seed(0)
    net = build_model("imprint:bins=32,inner=mlp", INFO.shape, INFO.num_classes)
    reason = create_defense("vet").inspect(net, dict(net.named_parameters()), {},
                                           normalize(DIGITS.images[:4], INFO))
    assert reason is not None and "imprint block" in reason


def test_sweep_wraps_models_in_the_server_architecture() -> None:
    assert server_architecture("imprint:bins=256", "mlp:width=64,depth=1") == \
        "imprint:bins=256,inner=mlp,inner.depth=1,inner.width=64"
    assert user_model("imprint:bins=256,inner=mlp,inner.depth=1,inner.width=64") == \
        "mlp:depth=1,width=64"
    assert user_model("lenet-zhu") == "lenet-zhu"
    spec = load_preset("malicious")
    assert spec.portfolio  # a portfolio whose imprint attack names a server architecture
    models = {(p.attack, p.model) for p in spec.points()}
    assert ("imprint", "imprint:bins=256,inner=mlp,inner.depth=1,inner.width=512") in models
    assert ("trap-weights", "mlp:depth=1,width=512") in models
    assert all("architecture" not in p.attack_options for p in spec.points())


def test_secagg_is_a_sweep_axis_with_users() -> None:
    from fedleak.harness.sweep.grid.points import SpecError
    from fedleak.harness.sweep.grid.spec import parse_spec

    base = """[sweep]\nname = "s"\ndataset = "digits"\nmodels = ["mlp"]\nbatch_size = 4\n"""
    with pytest.raises(SpecError, match="users = K"):
        parse_spec(base + '[[sweep.defense]]\nchain = ["secagg"]\n')
    with pytest.raises(SpecError, match="needs a secure-aggregation"):
        parse_spec(base + '[[sweep.defense]]\nchain = ["clip:max-norm=1"]\nusers = 3\n')
    spec = parse_spec(base + '[[sweep.defense]]\nreference = true\n'
                      '[[sweep.defense]]\nchain = ["secagg"]\nusers = 3\n')
    alone, summed = spec.points()
    assert (alone.users, summed.users) == (1, 3)
    assert "users" not in alone.measured() and summed.measured()["users"] == 3
    assert (alone.images, summed.images) == ("0-3", "0-11")  # one batch of 4 per user
    assert summed.victim_settings().users == 3


def fedleak(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fedleak", *args], capture_output=True,
                          text=True, timeout=1200)


@pytest.mark.integration
def test_imprint_through_secagg_across_processes(tmp_path: Path) -> None:
    """Three users × 8 digits, one drops out before sending: the sum of two still gives up
    single images exactly, with real masks."""
    args = ["--dataset", "digits", "--split", "train", "--images", "0-23", "--model",
            "imprint:bins=128,inner=mlp,inner.width=32,inner.depth=1", "--batch-size", "8",
            "--users", "3", "--defense", "secagg", "--secagg-drop", "2@masked-input"]
    with VictimProcess(args) as victim:
        done = fedleak("attack", "--victim", victim.address, "--attack", "imprint", "--out",
                       str(tmp_path / "run"), "--quiet")
    assert done.returncode == 0, done.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["server_role"] == "malicious-architecture"
    assert metrics["rounds"][0]["num_images"] == 16
    assert metrics["summary"]["exact"] >= 10
    assert "exact recoveries" in done.stdout


@pytest.mark.integration
def test_vet_and_refusals_across_processes(tmp_path: Path) -> None:
    args = ["--dataset", "digits", "--split", "train", "--images", "0-7", "--model",
            "mlp:width=64,depth=1", "--batch-size", "8", "--defense", "vet"]
    with VictimProcess(args) as victim:
        refused = fedleak("attack", "--victim", victim.address, "--attack", "trap-weights",
                          "--out", str(tmp_path / "trap"), "--quiet")
        assert refused.returncode != 0
        assert "vet" in refused.stderr and "FAILED_PRECONDITION" in refused.stderr
        honest = fedleak("attack", "--victim", victim.address, "--attack", "analytic",
                         "--out", str(tmp_path / "honest"), "--quiet")
        assert honest.returncode == 0, honest.stderr  # the victim keeps serving
    with VictimProcess(["--dataset", "digits", "--images", "0-3", "--model", "lenet-zhu",
                        "--batch-size", "4"]) as victim:
        cnn = fedleak("attack", "--victim", victim.address, "--attack", "trap-weights",
                      "--out", str(tmp_path / "cnn"), "--quiet")
    assert cnn.returncode != 0 and "softmax" in cnn.stderr
    refused = json.loads((tmp_path / "cnn" / "metrics.json").read_text())
    assert refused["rounds"] == [] and refused["status"] == "refused"


def test_vet_says_at_start_up_that_it_refuses_every_round_of_an_imprint_model() -> None:
    """The architecture test judges the user's own model: a victim running an imprint model
    with vet is told once, when it starts, instead of refusing round after round in silence."""
    from fedleak.harness.cli.victim.victim_serving import start_warnings
    from fedleak.harness.victim.settings import VictimSettings, create_victim

    imprinted = create_victim(VictimSettings(dataset="digits", model="imprint:bins=16",
                                             images="0-3", defenses=("vet",)))
    said = [w for w in start_warnings(imprinted) if "refuse every round" in w]
    assert len(said) == 1 and "imprint block" in said[0] and "architecture=false" in said[0]
    relaxed = create_victim(VictimSettings(dataset="digits", model="imprint:bins=16",
                                           images="0-3", defenses=("vet:architecture=false",)))
    assert not any("refuse every round" in w for w in start_warnings(relaxed))
    honest = create_victim(VictimSettings(dataset="digits", model="mlp:width=16,depth=1",
                                          images="0-3", defenses=("vet",)))
    assert not any("refuse every round" in w for w in start_warnings(honest))
