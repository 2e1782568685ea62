"""SPEAR: exact batches from a linear layer followed by ReLU, its maths, and its refusals."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedleak.attacks import attack_names, create_attack
from fedleak.attacks.base import UpdateSetting
from fedleak.attacks.exact.fc_layer import ModelDoesNotFit
from fedleak.attacks.exact.relu import sparsity as rs
from fedleak.attacks.exact.relu.direction_search import DirectionSet, last_direction
from fedleak.attacks.exact.relu.solve import activation_agreement, solve_inputs
from fedleak.attacks.exact.spear import Spear
from fedleak.attacks.published import PublishedDefense
from fedleak.harness.federated.observe import observe
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.metrics.image_metrics import score_reconstruction
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.zoo.datasets import denormalize, load_dataset
from fedleak.harness.zoo.models import build_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
DIGITS = load_dataset("digits", "train")


def digits_round(count: int, spec: str = "mlp:width=512,depth=1", start: int = 0,
                 protocol: Protocol | None = None, seed: int = 0):  # noqa: ANN201
    torch.manual_seed(seed)
    model = build_model(spec, DIGITS.info.shape, DIGITS.info.num_classes)
    images = DIGITS.images[start:start + count]
    labels = DIGITS.labels[start:start + count]
    return observe(model, images, labels, DIGITS.info, protocol or Protocol()), images, labels


def test_factorisation_and_solve_are_exact_on_a_synthetic_layer() -> None:
    """G = Dᵀ X with a sparse D: the true columns certify, a mixture of two does not, and the
    solve from the columns and β gives X back."""
    rng = np.random.default_rng(0)
    n, m, d = 6, 120, 40
    x = rng.standard_normal((n, d))
    weight, bias = rng.standard_normal((m, d)), rng.standard_normal(m)
    active = (x @ weight.T + bias > 0)                                   # [n, m]
    outgoing = rng.standard_normal((m, 3)) @ rng.standard_normal((3, n))  # W2ᵀ δ, 3 classes
    d_t = active.T * outgoing                                            # [m, n]
    grad = rs.factorise(d_t @ x, d_t.sum(1), n)
    q_true = np.linalg.pinv(grad.left) @ d_t
    found = DirectionSet(n)
    for j in range(n):
        assert found.add(rs.certify(grad, q_true[:, j], rs.default_margin(n), (weight, bias)))
    mixture = q_true[:, 0] / np.linalg.norm(q_true[:, 0]) + q_true[:, 1] / np.linalg.norm(
        q_true[:, 1])
    assert rs.certify(grad, mixture, rs.default_margin(n), (weight, bias)) is None
    solved = solve_inputs(grad, found.columns())
    order = np.argmin(((solved[:, None] - x[None]) ** 2).sum(-1), axis=1)
    assert np.allclose(solved, x[order], atol=1e-8)
    assert np.all(activation_agreement(solved, weight, bias, grad, found.columns()) == 1)


def test_the_last_input_comes_from_a_line_search() -> None:
    rng = np.random.default_rng(1)
    n, m, d = 5, 100, 30
    x = rng.standard_normal((n, d))
    weight, bias = rng.standard_normal((m, d)), rng.standard_normal(m)
    d_t = (x @ weight.T + bias > 0).T * rng.standard_normal((m, n))
    grad = rs.factorise(d_t @ x, d_t.sum(1), n)
    q_true = np.linalg.pinv(grad.left) @ d_t
    known = q_true[:, :-1] / np.linalg.norm(q_true[:, :-1], axis=0)
    last = last_direction(grad, known, (weight, bias), rs.default_margin(n))
    assert last is not None
    assert abs(last.q @ q_true[:, -1]) / np.linalg.norm(q_true[:, -1]) > 1 - 1e-9


def test_spear_recovers_a_batch_of_digits_exactly() -> None:
    observation, images, labels = digits_round(8)
    result = create_attack("spear", {"samples": 200_000}).reconstruct(observation, seed=0)
    scored = score_reconstruction(denormalize(result.images, DIGITS.info).clamp(0, 1), images,
                                  result.labels, labels, padding=result.padding)
    assert scored.exact == 8 and scored.label_accuracy == 1.0
    assert result.extras["directions_found"] == 8
    assert result.extras["relu_agreement_min"] == 1.0
    assert not result.padding


def test_spear_handles_a_one_step_fedavg_delta() -> None:
    observation, images, _ = digits_round(4, protocol=Protocol(kind="fedavg", learning_rate=1.0))
    assert observation.update_kind == "delta" and observation.local_steps == 1
    result = create_attack("spear", {"time_limit": 60}).reconstruct(observation, seed=0)
    scored = score_reconstruction(denormalize(result.images, DIGITS.info).clamp(0, 1), images)
    assert scored.exact == 4
    coarse, _, _ = digits_round(4, protocol=Protocol(kind="fedavg", learning_rate=0.01))
    with pytest.raises(ModelDoesNotFit, match="too coarse"):  # θ' − θ lost its digits
        create_attack("spear", {}).reconstruct(coarse)


def test_spear_refuses_models_and_updates_that_do_not_fit() -> None:
    spear = create_attack("spear", {"samples": 1000, "time_limit": 5})
    observation, _, _ = digits_round(4, spec="lenet-zhu")
    with pytest.raises(ModelDoesNotFit, match="first trainable layer"):
        spear.reconstruct(observation)
    observation, _, _ = digits_round(8, spec="mlp:width=4,depth=1")
    with pytest.raises(ModelDoesNotFit, match="at least n units"):
        spear.reconstruct(observation)
    observation, _, _ = digits_round(4, protocol=Protocol(kind="fedavg", local_epochs=2,
                                                          batch_size=2))
    with pytest.raises(ModelDoesNotFit, match="local steps"):
        spear.reconstruct(observation)
    observation, _, _ = digits_round(4)
    noisy = dataclasses.replace(observation, defenses=(PublishedDefense("noise", {}),))
    with pytest.raises(ModelDoesNotFit, match="exact zeros"):
        spear.reconstruct(noisy)
    large = dataclasses.replace(observation, num_images=64)
    with pytest.raises(ModelDoesNotFit, match="small batches"):
        spear.reconstruct(large)


def test_spear_says_when_it_is_unsuited_to_a_sweep_point() -> None:
    assert "spear" in attack_names()
    assert Spear.unsuited(UpdateSetting("gradient", 1, 16)) is None
    assert "exact zeros" in (Spear.unsuited(UpdateSetting("gradient", 1, 16, ("dpsgd",)))
                             or "")
    assert "small batches" in (Spear.unsuited(UpdateSetting("gradient", 1, 64)) or "")


def test_spear_runs_out_of_budget_with_padding_and_a_warning() -> None:
    observation, _, _ = digits_round(12)
    result = create_attack("spear", {"samples": 10, "batch": 1}).reconstruct(observation)
    assert result.padding == list(range(12))
    assert any("too few to solve" in w for w in result.warnings)


@pytest.mark.integration
def test_spear_across_processes(tmp_path: Path) -> None:
    args = ["--dataset", "digits", "--split", "train", "--images", "40-47", "--model",
            "mlp:width=512,depth=1", "--batch-size", "8"]
    with VictimProcess(args) as victim:
        done = subprocess.run([sys.executable, "-m", "fedleak", "attack", "--victim",
                               victim.address, "--attack", "spear", "-o", "samples=200000",
                               "--out", str(tmp_path / "run"), "--quiet"],
                              capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["summary"]["exact"] == 8
    assert metrics["rounds"][0]["label_accuracy"] == 1.0
    assert "exact recoveries" in done.stdout


def test_the_malicious_preset_attacks_with_every_honest_attack_that_can_work() -> None:
    from fedleak.harness.sweep.grid.spec import load_preset

    points = load_preset("malicious").points()
    honest = {(p.attack, p.label) for p in points
              if p.attack in ("inverting-gradients", "cocktail-party", "spear")}
    labels = {p.label for p in points}
    assert {("cocktail-party", label) for label in labels} <= honest
    assert {("inverting-gradients", label) for label in labels} <= honest
    spear = {label for attack, label in honest if attack == "spear"}
    assert "no defense" in spear
    assert not any(("dpsgd" in label or "prune" in label or "secagg" in label)
                   for label in spear)  # no exact zeros there, or a 64-image sum
