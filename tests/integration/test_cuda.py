"""Every attack and the victim's local update on a CUDA GPU (skipped without one).

Each attack runs on an observation built on the GPU and returns its images there, with a
result close to the CPU one; the victim serves with ``--device cuda`` (plain, DP-SGD through
Opacus, FedAvg) and ``fedleak attack --device cuda`` attacks it across two processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedleak.attacks import create_attack
from fedleak.attacks.release import ReleasedModel
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.federated.release_training import build_release_model
from fedleak.harness.victim.process import VictimProcess
from tests.attacks.optimisation.presets.test_inverting_gradients import smooth_image
from tests.helpers import make_observation

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
SHAPE = (3, 8, 8)
FEDAVG = Protocol("fedavg", 2, 1, 1e-3)
ATTACKS = [("inverting-gradients", "lenet-zhu", Protocol(), {"iterations": 30, "restarts": 2}),
           ("fedavg", "lenet-zhu", FEDAVG, {"iterations": 30}),
           ("dlg", "lenet-zhu", Protocol(), {"iterations": 5}),
           ("qian", "lenet-zhu", Protocol(), {"iterations": 30}),
           ("analytic", "mlp", Protocol(), {})]


@pytest.mark.parametrize(("attack", "model", "protocol", "options"), ATTACKS,
                         ids=[a[0] for a in ATTACKS])
def test_every_update_attack_runs_on_cuda(attack: str, model: str, protocol: Protocol,
                                          options: dict) -> None:
    images = torch.cat([smooth_image(SHAPE), smooth_image(SHAPE).flip(-1)])
    labels = torch.tensor([3, 5])
    results = {}
    for device in ("cpu", "cuda"):
        observation = make_observation(model, SHAPE, 10, images, labels, protocol,
                                       device=device)
        result = create_attack(attack, options).reconstruct(observation, device=device, seed=1)
        assert result.images.device.type == device
        results[device] = result
    assert results["cuda"].labels.tolist() == results["cpu"].labels.tolist()
    torch.testing.assert_close(results["cuda"].images.cpu(), results["cpu"].images,
                               rtol=0, atol=5e-2)


def test_packed_attacks_run_on_cuda() -> None:
    rounds = [make_observation("lenet-zhu", SHAPE, 10, smooth_image(SHAPE).roll(s, -1),
                               torch.tensor([s]), seed=s, device="cuda") for s in range(4)]
    results = create_attack("inverting-gradients", {"iterations": 30}).reconstruct_many(
        rounds, device="cuda")
    assert [r.extras["packed_with"] for r in results] == [4] * 4
    assert all(r.images.device.type == "cuda" for r in results)


def test_kkt_runs_on_cuda() -> None:
    model = build_release_model((1, 8, 8), width=64, seed=0)
    released = ReleasedModel.from_module(model, (1, 8, 8), num_train=4)
    result = create_attack("kkt", {"iterations": 20, "runs": 1}).reconstruct(released,
                                                                           device="cuda")
    assert result.images.device.type == "cuda" and result.images.shape[0] == 8


CAPTURED = [("inverting-gradients", {"iterations": 40}), ("fedavg", {"iterations": 40}),
            ("qian", {"iterations": 40}), ("dlg", {"iterations": 4}), ("kkt", {"iterations": 40})]


@pytest.mark.parametrize(("attack", "options"), CAPTURED, ids=[a[0] for a in CAPTURED])
def test_captured_attacks_match_eager_on_cuda(attack: str, options: dict) -> None:
    """Each optimisation attack captures its step as a CUDA graph (no fallback notice) and
    lands where the eager loop on the same GPU lands."""
    if attack == "kkt":
        model = build_release_model((1, 8, 8), width=64, seed=0)
        target = ReleasedModel.from_module(model, (1, 8, 8), num_train=4)
        options = {**options, "lr_low": 1e-3, "lr_high": 1e-3}
    else:
        protocol = FEDAVG if attack == "fedavg" else Protocol()
        target = make_observation("lenet-zhu", SHAPE, 10, smooth_image(SHAPE),
                                  torch.tensor([3]), protocol, device="cuda")
    captured = create_attack(attack, {**options, "capture": True}).reconstruct(
        target, device="cuda", seed=1)
    eager = create_attack(attack, {**options, "capture": False}).reconstruct(
        target, device="cuda", seed=1)
    assert captured.extras["captured"] and not captured.warnings, captured.warnings
    torch.testing.assert_close(captured.images, eager.images, rtol=1e-4, atol=1e-3)


def test_packed_kkt_runs_match_runs_alone_on_cuda() -> None:
    model = build_release_model((1, 8, 8), width=64, seed=0)
    released = ReleasedModel.from_module(model, (1, 8, 8), num_train=4)
    options = {"iterations": 40, "runs": 4, "lr_low": 1e-3, "lr_high": 1e-2}
    alone = create_attack("kkt", options).reconstruct(released, device="cuda", seed=2)
    packed = create_attack("kkt", {**options, "pack": 4}).reconstruct(released, device="cuda",
                                                                       seed=2)
    assert packed.extras["run_diverged"] == alone.extras["run_diverged"]
    torch.testing.assert_close(packed.images, alone.images, rtol=1e-4, atol=1e-4)


VICTIMS = {
    "plain": ["--model", "lenet-zhu"],
    "dpsgd": ["--model", "lenet-zhu", "--defense", "dpsgd:noise-multiplier=0.1"],
    "fedavg": ["--model", "lenet-zhu", "--protocol", "fedavg", "--local-epochs", "2",
               "--lr", "1e-3"],
}


@pytest.mark.parametrize("setting", list(VICTIMS))
def test_victim_and_attacker_on_cuda(setting: str, tmp_path: Path) -> None:
    args = ["--dataset", "photos", "--split", "all", "--images", "0-1", "--device", "cuda",
            *VICTIMS[setting]]
    attack = "fedavg" if setting == "fedavg" else "inverting-gradients"
    with VictimProcess(args) as victim:
        run = subprocess.run([sys.executable, "-m", "fedleak", "attack", "--victim",
                              victim.address, "--attack", attack, "--device", "cuda",
                              "--iterations", "50", "--quiet", "--out", str(tmp_path)],
                             capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    record = json.loads((tmp_path / "metrics.json").read_text())
    assert record["device"] == "cuda" and record["rounds"][0]["mean_psnr"] is not None
