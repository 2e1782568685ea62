"""Cocktail Party Attack: ICA unmixing of a fully-connected layer's aggregated gradient, the
ReLU refinement, sign and scale from the bias, feature inversion for convolutional models."""

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
from fedleak.attacks.exact.cocktail_party.cpa import CocktailParty
from fedleak.attacks.exact.cocktail_party.unmixing import minmax_images, transformed
from fedleak.attacks.exact.fc_layer import ModelDoesNotFit
from fedleak.attacks.observation import Observation
from fedleak.harness.federated.observe import observe
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.metrics.image_metrics import score_reconstruction
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.victim.scoring.features import layer_inputs
from fedleak.harness.zoo.datasets import denormalize, load_dataset, normalize
from fedleak.harness.zoo.models import build_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
FACES = load_dataset("faces", "train")
DIGITS = load_dataset("digits", "train")


def summed_round(data, spec: str, users: int, per_user: int, start: int = 0,  # noqa: ANN001
                 seed: int = 0) -> tuple[Observation, torch.Tensor, torch.Tensor]:
    """The secure-aggregation sum of ``users`` users' gradients (in process, no masks)."""
    info = data.info
    torch.manual_seed(seed)
    model = build_model(spec, info.shape, info.num_classes)
    count = users * per_user
    images, labels = data.images[start:start + count], data.labels[start:start + count]
    total = None
    for user in range(users):
        part = slice(user * per_user, (user + 1) * per_user)
        seen = observe(model, images[part], labels[part], info)
        total = seen.update if total is None else [a + b for a, b in zip(total, seen.update,
                                                                         strict=True)]
    whole = observe(model, images, labels, info)
    assert total is not None
    return dataclasses.replace(whole, update=total), images, labels


def scored(result, images, labels, info):  # noqa: ANN001, ANN201
    return score_reconstruction(denormalize(result.images, info).clamp(0, 1), images,
                                result.labels, labels, padding=result.padding)


def test_a_sum_of_two_users_faces_comes_back_exactly() -> None:
    observation, images, labels = summed_round(FACES, "mlp:width=512,depth=1", 2, 8)
    result = create_attack("cocktail-party", {}).reconstruct(observation, seed=0)
    score = scored(result, images, labels, FACES.info)
    assert score.exact == 16 and score.label_accuracy == 1.0
    assert result.extras["solved_exactly"] is True


def test_the_papers_unmixing_alone_separates_faces_above_a_grey_image() -> None:
    """relu=off: whitening + FastICA only, sign and scale from the bias; against the mean
    image (what a server has without the attack)."""
    observation, images, labels = summed_round(FACES, "mlp:width=512,depth=1", 2, 8)
    result = create_attack("cocktail-party", {"relu": "off"}).reconstruct(observation)
    grey = score_reconstruction(images.mean(0, keepdim=True).expand_as(images), images)
    score = scored(result, images, labels, FACES.info)
    assert "certified" not in result.extras
    assert score.mean_psnr > grey.mean_psnr + 2
    assert max(s.psnr for s in score.images) > 20


def test_the_papers_refinement_and_minmax_scale_run() -> None:
    observation, images, labels = summed_round(FACES, "mlp:width=512,depth=1", 1, 8)
    result = create_attack("cocktail-party", {
        "relu": "off", "domain": "pixels", "scale": "minmax", "iterations": 20,
        "tv": 0.1}).reconstruct(observation)
    assert result.images.shape == images.shape and torch.isfinite(result.images).all()
    low, high = observation.image_bounds()
    assert (result.images >= low - 1e-6).all() and (result.images <= high + 1e-6).all()


def test_minmax_picks_the_sign_nearer_the_data_mean() -> None:
    source = np.array([[0.0, 1.0, 1.0, 1.0]])      # mostly bright
    mean, std = np.array([0.2]), np.array([1.0])   # a dark data set
    pixels = minmax_images(-source, mean, std, (1, 2, 2)) * std + mean
    assert pixels.tolist() == [[1.0, 0.0, 0.0, 0.0]]  # flipped back: mostly dark


def test_finite_differences_keep_the_unmixing_linear() -> None:
    mixtures = np.arange(2 * 12, dtype=np.float64).reshape(2, 12)
    out = transformed(mixtures, (1, 3, 4), "gradients")
    assert out.shape == (2, 3 * 3 + 2 * 4)
    combination = np.array([[2.0, -1.0]])
    assert np.allclose(transformed(combination @ mixtures, (1, 3, 4), "gradients"),
                       combination @ out)


def test_more_images_than_pixels_unmix_what_the_rank_allows() -> None:
    """4 × 16 digits: 64 images of 64 pixels, several always dark: rank below 64."""
    observation, _, _ = summed_round(DIGITS, "mlp:width=512,depth=1", 4, 16)
    result = create_attack("cocktail-party", {"relu": "off"}).reconstruct(observation)
    unmixed = result.extras["unmixed"]
    assert isinstance(unmixed, int) and unmixed < 64
    assert result.padding == list(range(unmixed, 64))
    assert any("numerical rank" in w for w in result.warnings)


def test_a_convnet_is_unmixed_at_its_classifier_then_inverted() -> None:
    info = DIGITS.info
    torch.manual_seed(0)
    model = build_model("lenet-zhu", info.shape, info.num_classes)
    images, labels = DIGITS.images[:4], DIGITS.labels[:4]
    observation = observe(model, images, labels, info)
    result = create_attack("cocktail-party", {"fi_iterations": 3}).reconstruct(observation)
    assert result.feature_layer and result.features is not None
    truth = layer_inputs(model, dict(model.named_parameters()), dict(model.named_buffers()),
                         normalize(images, info), result.feature_layer).double()
    found = result.features.double()
    assert found.shape == (4, truth.shape[1])
    cosine = torch.nn.functional.cosine_similarity(found[:, None], truth[None], dim=-1)
    # the classifier's 10 rows mix 4 sigmoid feature vectors: ICA separates some of them
    # (docs/honest_batches.md gives the measured cosines); a random direction scores ~0.2
    assert float(cosine.max(dim=1).values.max()) > 0.9
    assert result.images.shape == images.shape
    assert any("no ReLU follows" in w for w in result.warnings)


def test_refusals_name_what_to_change() -> None:
    observation, _, _ = summed_round(DIGITS, "mlp:width=4,depth=1", 1, 8)
    with pytest.raises(ModelDoesNotFit, match="units"):
        create_attack("cocktail-party", {}).reconstruct(observation)
    several, _, _ = summed_round(DIGITS, "mlp:width=64,depth=1", 1, 4)
    several = dataclasses.replace(several, update_kind="delta", local_steps=3)
    with pytest.raises(ModelDoesNotFit, match="local steps"):
        create_attack("cocktail-party", {}).reconstruct(several)
    with pytest.raises(ValueError, match="domain"):
        create_attack("cocktail-party", {"domain": "fourier"})
    assert "cocktail-party" in attack_names()
    assert CocktailParty.budget(CocktailParty()) is None


def test_one_local_step_of_fedavg_is_a_gradient() -> None:
    info = FACES.info
    torch.manual_seed(0)
    model = build_model("mlp:width=512,depth=1", info.shape, info.num_classes)
    images, labels = FACES.images[:8], FACES.labels[:8]
    observation = observe(model, images, labels, info, Protocol(kind="fedavg",
                                                                learning_rate=1.0))
    result = create_attack("cocktail-party", {}).reconstruct(observation)
    assert scored(result, images, labels, info).exact == 8


@pytest.mark.integration
def test_cocktail_party_on_a_secagg_sum_across_processes(tmp_path: Path) -> None:
    args = ["--dataset", "faces", "--split", "train", "--images", "0-15", "--model",
            "mlp:width=512,depth=1", "--batch-size", "8", "--users", "2", "--defense",
            "secagg"]
    with VictimProcess(args) as victim:
        done = subprocess.run([sys.executable, "-m", "fedleak", "attack", "--victim",
                               victim.address, "--attack", "cocktail-party",
                               "--secagg-target", "sum", "--out", str(tmp_path / "run"),
                               "--quiet"], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["rounds"][0]["num_images"] == 16
    assert metrics["summary"]["exact"] == 16
