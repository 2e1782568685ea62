"""Metrics: PSNR / SSIM / MSE per image, Hungarian matching and multiset label accuracy."""

from __future__ import annotations

import math

import pytest
import torch

from fedleak.harness.metrics.image_metrics import (
    BatchScore,
    label_accuracy,
    match_one_to_one,
    mse_per_image,
    psnr_per_image,
    score_reconstruction,
    ssim_per_image,
)


def _images(batch: int = 4, shape: tuple[int, int, int] = (3, 32, 32), seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(batch, *shape, generator=generator)


def _full(value: float, batch: int = 4) -> torch.Tensor:
    return torch.full((batch,), value, dtype=torch.float64)


def _smooth_images(batch: int = 4, size: int = 32) -> torch.Tensor:
    """Distinct smooth gradients, so that SSIM between them is meaningful."""
    ramp = torch.linspace(0, 1, size)
    out = []
    for k in range(batch):
        angle = math.pi * k / batch
        field = math.cos(angle) * ramp.view(-1, 1) + math.sin(angle) * ramp.view(1, -1)
        out.append(((field - field.min()) / (field.max() - field.min())).expand(3, -1, -1))
    return torch.stack(out)


def test_mse_and_psnr_of_a_constant_offset() -> None:
    truth = _images() * 0.8
    shifted = truth + 0.1  # MSE = 0.01 -> PSNR = 10 log10(1 / 0.01) = 20 dB
    assert torch.allclose(mse_per_image(shifted, truth), _full(0.01))
    assert torch.allclose(psnr_per_image(shifted, truth), _full(20.0))


def test_psnr_of_identical_images_is_capped_at_100_db() -> None:
    truth = _images()
    assert torch.allclose(psnr_per_image(truth, truth), _full(100.0))


def test_mean_psnr_is_mean_of_per_image_values() -> None:
    truth = _images(2) * 0.5
    reconstruction = truth.clone()
    reconstruction[0] += 0.1  # 20 dB
    reconstruction[1] += 0.01  # 40 dB
    score = score_reconstruction(reconstruction, truth, match=False)
    assert score.mean_psnr == pytest.approx(30.0)  # PSNR of the batch MSE would be ~23 dB


def test_ssim_identical_is_one_and_noise_is_near_zero() -> None:
    truth = _images(4)
    assert torch.allclose(ssim_per_image(truth, truth), torch.ones(4, dtype=torch.float64))
    noise = _images(4, seed=1)
    assert ssim_per_image(noise, truth).abs().max() < 0.05


@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 25, 25), (3, 32, 32)])
def test_ssim_handles_small_images(shape: tuple[int, int, int]) -> None:
    truth = _images(3, shape)
    values = ssim_per_image(truth, truth)
    assert values.shape == (3,) and torch.allclose(values, torch.ones(3, dtype=torch.float64))


def test_hungarian_matching_recovers_a_known_permutation() -> None:
    truth = _smooth_images(6)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    reconstruction = torch.empty_like(truth)
    reconstruction[perm] = truth + 0.01 * torch.randn_like(truth)
    assert torch.equal(match_one_to_one(reconstruction, truth), perm)
    score = score_reconstruction(reconstruction, truth)
    assert [s.matched_index for s in score.images] == perm.tolist()
    assert [s.index for s in score.images] == list(range(6))
    assert score.mean_ssim > 0.9 and score.mean_psnr > 35


def test_scoring_without_matching_keeps_order() -> None:
    truth = _smooth_images(4)
    reversed_batch = truth.flip(0)
    unmatched = score_reconstruction(reversed_batch, truth, match=False)
    matched = score_reconstruction(reversed_batch, truth)
    assert matched.mean_psnr == pytest.approx(100.0)
    assert unmatched.mean_psnr < matched.mean_psnr


@pytest.mark.parametrize(
    ("predicted", "true", "expected"),
    [
        ([1, 1, 2], [1, 2, 2], 2 / 3),
        ([2, 1, 0], [0, 1, 2], 1.0),
        ([3, 3, 3], [0, 1, 2], 0.0),
        (torch.tensor([5, 5]), torch.tensor([5, 6]), 0.5),
    ],
)
def test_label_accuracy_is_multiset_overlap(predicted, true, expected) -> None:
    assert label_accuracy(predicted, true) == pytest.approx(expected)


def test_score_reports_label_accuracy_only_when_both_given() -> None:
    truth = _images(3)
    assert score_reconstruction(truth, truth).label_accuracy is None
    score = score_reconstruction(truth, truth, [1, 1, 2], [1, 2, 2])
    assert isinstance(score, BatchScore) and score.label_accuracy == pytest.approx(2 / 3)
    assert score.mean_mse == pytest.approx(0.0) and score.mean_ssim == pytest.approx(1.0)


def test_mismatched_shapes_raise() -> None:
    truth = _images(4)
    with pytest.raises(ValueError, match="C, H, W"):
        score_reconstruction(_images(4, (1, 32, 32)), truth)
    with pytest.raises(ValueError, match="3 images but truth has 4"):
        score_reconstruction(_images(3), truth)
    with pytest.raises(ValueError, match=r"\[B, C, H, W\]"):
        score_reconstruction(truth[0], truth)


def test_nan_in_reconstruction_raises() -> None:
    truth = _images(2)
    reconstruction = truth.clone()
    reconstruction[1, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        score_reconstruction(reconstruction, truth)
