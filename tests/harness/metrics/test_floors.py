"""Trivial floors (fedleak.harness.metrics.floors): every score beside what a constant guess
scores, successes only above it, and the words when nothing is."""

from __future__ import annotations

import math

import pytest
import torch

from fedleak.harness.metrics.floors import (
    DATASET_MEAN,
    FLOOR_MARGIN_DB,
    GREY,
    MEAN_COLOUR,
    NOTHING_RECOVERED,
    MeanPool,
    combined,
    constant_guesses,
    floor_words,
)
from fedleak.harness.metrics.image_metrics import SUCCESS_PSNR, floor_scores, score_reconstruction


def textured(n: int, seed: int = 0) -> torch.Tensor:
    """Smooth images (a gradient plus a little noise): their own mean colour scores high."""
    g = torch.Generator().manual_seed(seed)
    ramp = torch.linspace(0.4, 0.6, 16).view(1, 1, 1, 16).expand(n, 3, 16, 16)
    return (ramp + 0.02 * torch.randn(n, 3, 16, 16, generator=g)).clamp(0, 1)


def test_the_three_guesses_and_their_psnr() -> None:
    truth = torch.stack([torch.full((1, 4, 4), 0.5), torch.full((1, 4, 4), 0.1)])
    outside = MeanPool(torch.zeros(1, 4, 4), 1, holds_truth=False)  # a data set's black mean
    guesses = constant_guesses(truth, outside)
    assert torch.equal(guesses[GREY], torch.full_like(truth, 0.5))
    assert torch.equal(guesses[DATASET_MEAN], torch.zeros_like(truth))
    assert torch.allclose(guesses[MEAN_COLOUR], truth)
    floors = floor_scores(truth, outside)
    assert floors.psnr[GREY][0] == pytest.approx(100.0)  # a grey image is its own guess
    assert floors.psnr[GREY][1] == pytest.approx(10 * math.log10(1 / 0.16))
    assert floors.psnr[DATASET_MEAN][1] == pytest.approx(20.0)  # MSE 0.01
    assert floors.best_guess[1] == MEAN_COLOUR and floors.best_psnr[1] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="mean image"):
        constant_guesses(truth, MeanPool(torch.zeros(3, 4, 4), 2))


def test_the_data_set_mean_leaves_each_image_out() -> None:
    """The data-set mean guess of an image is the mean of the *other* images of its pool: a
    pool of one image makes no such guess (else it would "guess" the image exactly, 100 dB),
    and in a pool of three each image is guessed by the mean of the other two."""
    alone = torch.rand(1, 3, 8, 8, generator=torch.Generator().manual_seed(4))
    floors = floor_scores(alone)
    assert DATASET_MEAN not in floors.psnr and floors.made == [GREY, MEAN_COLOUR]
    assert float(floors.best_psnr[0]) < 40
    pool = torch.rand(3, 1, 4, 4, generator=torch.Generator().manual_seed(5))
    guesses = constant_guesses(pool[:2], MeanPool.of(pool))
    assert torch.allclose(guesses[DATASET_MEAN][0], (pool[1] + pool[2]) / 2)
    assert torch.allclose(guesses[DATASET_MEAN][1], (pool[0] + pool[2]) / 2)


def test_a_mean_colour_at_20_db_is_no_success_and_the_words_say_so() -> None:
    """A reconstruction that is each image's own mean colour scores above 20 dB on smooth
    images; it is no better than its floor, so it is no success and nothing is above."""
    truth = textured(4)
    flat = truth.mean(dim=(2, 3), keepdim=True).expand_as(truth).clone()
    score = score_reconstruction(flat, truth, [1, 2, 3, 0], [1, 2, 3, 3])
    assert min(s.psnr for s in score.images) >= SUCCESS_PSNR
    assert score.successes == 0 and score.floors is not None and score.floors.above == 0
    # the images share their ramp: the data set's mean image is an even better guess
    assert all(s.floor_guess == DATASET_MEAN for s in score.images)
    assert score.floors.mean_margin < 0
    words = floor_words(score.floors, score.label_accuracy)
    assert words.startswith(f"{NOTHING_RECOVERED}; labels 75%")


def test_a_copy_is_above_its_floor_and_counts() -> None:
    truth = textured(3, seed=1)
    noisy = (truth + 0.003 * torch.randn(truth.shape, generator=torch.Generator()
                                         .manual_seed(2))).clamp(0, 1)
    score = score_reconstruction(noisy, truth)
    assert score.floors is not None
    assert score.floors.above == 3 and score.successes == 3
    assert score.floors.mean_margin > FLOOR_MARGIN_DB
    assert floor_words(score.floors).startswith("3 of 3 image(s) above their floor")


def test_the_margin_is_per_image_and_padding_never_counts() -> None:
    truth = textured(2, seed=3)
    reconstruction = truth.clone()
    score = score_reconstruction(reconstruction, truth, padding=[1])
    assert score.floors is not None and score.floors.above == 1 and score.successes == 1


def test_floors_of_several_rounds_are_weighted_by_images() -> None:
    one = score_reconstruction(textured(1), textured(1)).floors
    three = score_reconstruction(torch.full((3, 3, 16, 16), 0.5), textured(3, seed=5)).floors
    assert one is not None and three is not None
    both = combined([one, three])
    assert both is not None and both.images == 4 and both.above == one.above + three.above
    assert both.mean_psnr == pytest.approx((one.mean_psnr + 3 * three.mean_psnr) / 4)
    assert combined([]) is None


def test_a_kkt_release_counts_a_sample_only_above_its_floor() -> None:
    """KKT release scoring (Haim et al.'s SSIM >= 0.4 voting) stands every training sample
    beside its floors: the pool's mean of the *other* images, grey, its own mean colour. A
    candidate that is the data set's mean image reaches the SSIM bar on similar samples but is
    not recovered beyond the floor; an exact copy is."""
    from fedleak.harness.metrics.kkt_metrics import release_floors, vote_reconstructions

    g = torch.Generator().manual_seed(6)
    base = torch.rand(1, 1, 8, 8, generator=g)
    pool = (base + 0.05 * torch.randn(6, 1, 8, 8, generator=g)).clamp(0, 1)
    train, mean = pool[:2], pool.mean(0, keepdim=True)
    # candidates: an exact copy of sample 0 and the pool's mean image
    match = vote_reconstructions(torch.cat([train[:1], mean]), train)
    floors = release_floors(match, train, MeanPool.of(pool))
    assert torch.allclose(constant_guesses(train, MeanPool.of(pool))[DATASET_MEAN][1],
                          (pool.sum(0) - pool[1]) / 5)
    assert match.ssim[1] >= 0.4  # the mean image passes the paper's bar on sample 1 ...
    assert floors.scores.best_guess[1] == DATASET_MEAN
    assert float(match.psnr[1]) < float(floors.scores.best_psnr[1]) + FLOOR_MARGIN_DB
    assert floors.summary.above == 1 and floors.recovered_above == 1  # ... only the copy counts
    assert floors.summary.images == 2 and not floors.summary.recovered_nothing
