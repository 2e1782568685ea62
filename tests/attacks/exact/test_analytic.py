"""Analytic inversion of a biased linear layer: exact images for an MLP, exact features for a CNN,
the mixture warning for batches, and feature scoring inside a real victim process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import torch

from fedleak.attacks import AttackConfigError, create_attack
from fedleak.attacks.exact.analytic import AnalyticInversionError, invert_linear_layer
from fedleak.harness.attacker.client import VictimClient, VictimError
from fedleak.harness.metrics.image_metrics import psnr_per_image, score_reconstruction
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.victim.scoring.features import (
    FeatureScoringError,
    layer_inputs,
    score_features,
)
from fedleak.harness.victim.scoring.round import Submission
from fedleak.harness.zoo.models import build_model
from tests.helpers import make_observation, to_unit


def _images(n: int, shape: tuple[int, int, int], seed: int = 0) -> torch.Tensor:
    return torch.rand(n, *shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("combine", ["least-squares", "median"])
def test_mlp_image_is_recovered_above_60_db(combine: str) -> None:
    shape = (3, 8, 8)
    for seed in range(3):
        image = _images(1, shape, seed)
        observation = make_observation("mlp:width=32", shape, 10, image, torch.tensor([seed]),
                                       seed=seed)
        result = create_attack("analytic", {"combine": combine}).reconstruct(observation)
        recovered = to_unit(observation, result.images)
        assert result.has_images and result.features is None and not result.warnings
        assert float(psnr_per_image(recovered, image)[0]) >= 60
        assert torch.allclose(recovered, image, atol=1e-5)
        assert result.labels.tolist() == [seed]
        assert result.extras["layer"] == "layers.1" and result.extras["recovered"] == "image"


def test_cnn_gives_the_classifier_input_exactly_for_one_image() -> None:
    shape, seed = (3, 16, 16), 4
    image = _images(1, shape, 1)
    observation = make_observation("lenet-zhu", shape, 10, image, torch.tensor([7]), seed=seed)
    result = create_attack("analytic").reconstruct(observation)
    assert not result.has_images and result.feature_layer == "fc"
    torch.manual_seed(seed)
    model = build_model("lenet-zhu", shape, 10)
    truth = layer_inputs(model, dict(model.named_parameters()), dict(model.named_buffers()),
                         (image - 0.5) / 0.5, "fc")
    assert result.features is not None and result.features.shape == truth.shape
    assert torch.allclose(result.features, truth, rtol=1e-4, atol=1e-6)
    scored = score_features(result.features, truth)
    assert scored.mean_cosine > 0.99999 and scored.mean_relative_error < 1e-4


def test_a_batch_without_separation_gives_a_mixture_and_says_so() -> None:
    shape = (1, 6, 6)
    images = _images(3, shape, 2)
    observation = make_observation("mlp:width=32", shape, 10, images, torch.tensor([1, 4, 6]))
    result = create_attack("analytic", {"separate": "false"}).reconstruct(observation)
    assert result.images.shape == (3, *shape)
    assert len(result.warnings) == 1 and "mixture" in result.warnings[0]
    # the mixture is no image of the batch
    assert float(psnr_per_image(to_unit(observation, result.images), images).max()) < 40


def test_units_active_for_one_image_separate_a_small_batch() -> None:
    shape = (1, 8, 8)
    images = _images(4, shape, 3)
    observation = make_observation("mlp:width=256", shape, 10, images, torch.tensor([1, 4, 6, 6]))
    result = create_attack("analytic").reconstruct(observation)
    assert result.extras["separated"] == 4 and "all 4 were separated" in result.warnings[0]
    scored = score_reconstruction(to_unit(observation, result.images).clamp(0, 1), images)
    assert min(s.psnr for s in scored.images) >= 60
    assert sorted(result.labels.tolist()) == [1, 4, 6, 6]


def test_rows_are_chosen_by_relative_bias_gradient() -> None:
    x = torch.tensor([1.0, -2.0, 3.0])
    bias_grad = torch.tensor([2.0, 0.0, -1e-6, 0.5])
    weight_grad = bias_grad[:, None] * x[None, :]
    weight_grad[2] += 1.0  # a row with a tiny bias gradient and garbage: must be left out
    recovered, rows = invert_linear_layer(weight_grad, bias_grad, threshold=1e-3)
    assert rows == 2 and torch.allclose(recovered, x.double())
    recovered, rows = invert_linear_layer(weight_grad, bias_grad, threshold=1e-7,
                                          combine="median")
    assert rows == 3
    with pytest.raises(AnalyticInversionError, match="zero"):
        invert_linear_layer(weight_grad, torch.zeros(4))


def test_bad_layers_and_options_are_refused() -> None:
    shape = (1, 6, 6)
    observation = make_observation("mlp:width=8", shape, 10, _images(1, shape),
                                   torch.tensor([0]))
    with pytest.raises(AnalyticInversionError, match="layers.1"):
        create_attack("analytic", {"layer": "nope"}).reconstruct(observation)
    last = create_attack("analytic", {"layer": "last"}).reconstruct(observation)
    assert last.feature_layer == "layers.5" and last.features is not None
    bias_free = make_observation("mlp:width=8,bias=false", shape, 10, _images(1, shape),
                                 torch.tensor([0]))
    with pytest.raises(AnalyticInversionError, match="biased linear layer"):
        create_attack("analytic").reconstruct(bias_free)
    for options in ({"threshold": "0"}, {"combine": "mean"}, {"tolerance": "2"}):
        with pytest.raises(AttackConfigError):
            create_attack("analytic", options)


def test_feature_scoring_matches_one_to_one() -> None:
    truth = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    submitted = torch.tensor([[0.0, 1.0, 0.0], [1.1, 0.0, 0.0]])
    scored = score_features(submitted, truth)
    assert [(s.index, s.matched_index) for s in scored.features] == [(0, 1), (1, 0)]
    assert scored.features[0].cosine == pytest.approx(1.0)
    assert scored.features[0].relative_error == pytest.approx(0.1)
    assert scored.features[1].relative_error == pytest.approx(0.5)
    with pytest.raises(FeatureScoringError, match="width"):
        score_features(torch.ones(1, 4), truth)
    with pytest.raises(FeatureScoringError, match="NaN"):
        score_features(torch.full((1, 3), float("nan")), truth)


def _fedleak(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fedleak", *args], capture_output=True,
                          text=True, timeout=1200)


def test_cli_analytic_against_an_mlp_victim(tmp_path: Path) -> None:
    args = ["--dataset", "digits", "--images", "0-3", "--model", "mlp:width=64"]
    with VictimProcess(args) as victim:
        done = _fedleak("attack", "--victim", victim.address, "--attack", "analytic",
                        "--rounds", "2", "--out", str(tmp_path), "--quiet")
        assert done.returncode == 0, done.stderr
        assert "analytic" in _fedleak("attack", "--help").stdout
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    for r in metrics["rounds"]:
        assert r["mean_psnr"] >= 60 and r["label_accuracy"] == 1.0 and not r["warnings"]
    assert metrics["summary"]["mean_psnr"] >= 60


def test_cli_analytic_against_a_cnn_victim_scores_features(tmp_path: Path) -> None:
    args = ["--dataset", "photos", "--images", "0-3", "--model", "lenet-zhu",
            "--batch-size", "2"]
    with VictimProcess(args) as victim:
        done = _fedleak("attack", "--victim", victim.address, "--attack", "analytic",
                        "--out", str(tmp_path), "--quiet")
        assert done.returncode == 0, done.stderr
        assert "warning:" in done.stdout and "mixture" in done.stdout
        with VictimClient(victim.address, timeout=60) as client:
            params, buffers = client.global_model()
            received = client.compute_update(params, buffers)
            with pytest.raises(VictimError) as err:
                client.score(received.round_id, None, features=torch.ones(1, 5),
                             feature_layer="fc")
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(VictimError, match="fc"):
                client.score(received.round_id, None, features=torch.ones(1, 5),
                             feature_layer="body")
            good = client.score(received.round_id, None, [0, 1], features=torch.ones(2, 768),
                                feature_layer="fc")
            assert good.features_scored and len(good.features) == 2 and good.labels_scored
    r = json.loads((tmp_path / "metrics.json").read_text())["rounds"][0]
    assert r["mean_psnr"] is None and r["feature_layer"] == "fc"
    assert r["mean_feature_cosine"] > 0.5 and r["label_accuracy"] is not None
    assert (tmp_path / r["features_file"]).exists() and "mixture" in r["warnings"][0]


def test_fedavg_delta_is_inverted_approximately_and_says_so() -> None:
    from fedleak.harness.federated.protocol import Protocol

    shape = (1, 6, 6)
    image = _images(1, shape, 5)
    one_step = Protocol(kind="fedavg", local_epochs=1, learning_rate=1e-4)
    observation = make_observation("mlp:width=32", shape, 10, image, torch.tensor([2]),
                                   one_step)
    result = create_attack("analytic").reconstruct(observation)
    assert not result.warnings  # one SGD step: the delta is -τ·gradient, still exact
    assert float(psnr_per_image(to_unit(observation, result.images), image)[0]) >= 60
    three_steps = Protocol(kind="fedavg", local_epochs=3, learning_rate=1e-4)
    observation = make_observation("mlp:width=32", shape, 10, image, torch.tensor([2]),
                                   three_steps)
    result = create_attack("analytic").reconstruct(observation)
    assert any("approximately" in w for w in result.warnings)
    assert float(psnr_per_image(to_unit(observation, result.images), image)[0]) >= 30


def features(vectors: torch.Tensor) -> Submission:
    """A submission of recovered inputs of the LeNet's classifier ``fc``."""
    return Submission(features=vectors, feature_layer="fc")


def test_victim_scores_features_of_recent_rounds_only() -> None:
    from fedleak.harness.victim.rounds import FEATURE_ROUNDS
    from fedleak.harness.victim.settings import VictimSettings, create_victim
    from fedleak.harness.wire.request_errors import FailedPrecondition

    victim = create_victim(VictimSettings(dataset="digits", model="lenet-zhu", images="0-3"))
    params, buffers = victim.global_model()
    rounds = [victim.compute_update(params, buffers).round_id
              for _ in range(FEATURE_ROUNDS + 1)]
    latest = victim.scorer.score(rounds[-1], features(torch.ones(1, 48))).features
    assert latest is not None
    assert len(latest.features) == 1 and -1 <= latest.mean_cosine <= 1
    with pytest.raises(FailedPrecondition, match="latest"):
        victim.scorer.score(rounds[0], features(torch.ones(1, 48)))
    labels = Submission(labels=[int(victim.data.labels[0])])
    assert victim.scorer.score(rounds[0], labels).label_accuracy == 1.0


def test_victim_keeps_round_parameters_within_a_byte_budget() -> None:
    from fedleak.harness.victim.settings import VictimSettings, create_victim
    from fedleak.harness.wire.request_errors import FailedPrecondition

    victim = create_victim(VictimSettings(dataset="digits", model="lenet-zhu", images="0-3"))
    params, buffers = victim.global_model()
    one_round = sum(t.numel() * t.element_size() for t in params.values())
    victim.rounds.feature_bytes = 2 * one_round  # as --feature-memory-mb would
    rounds = [victim.compute_update(params, buffers).round_id for _ in range(3)]
    for kept in rounds[1:]:  # the two newest fit the budget
        victim.scorer.score(kept, features(torch.ones(1, 48)))
    with pytest.raises(FailedPrecondition, match="--feature-memory-mb"):
        victim.scorer.score(rounds[0], features(torch.ones(1, 48)))
