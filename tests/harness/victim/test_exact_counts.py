"""Exact counts are a true maximum and padding is never scored as a reconstruction.

The victim counts exact recoveries as the largest one-to-one matching among pairs at PSNR ≥ 40
dB (a maximum bipartite matching), not by thresholding the least-total-MSE assignment behind
the mean PSNR, which can move an exact copy onto another image when the reconstruction is
padded; the attack's padding slots never count as exact nor as the best image.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedleak.attacks import create_attack
from fedleak.attacks.malicious.crafted_parameters import ServerKnowledge
from fedleak.harness.attacker.client import VictimClient
from fedleak.harness.federated.observe import observe
from fedleak.harness.metrics.floors import MeanPool
from fedleak.harness.metrics.image_metrics import (
    EXACT_PSNR,
    SUCCESS_PSNR,
    exact_matching,
    pairwise_psnr,
    score_reconstruction,
)
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.zoo.datasets import denormalize, load_dataset, normalize
from fedleak.harness.zoo.models import build_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def pixels(*values: float) -> torch.Tensor:
    """Flat 3×3 images with these values, [n, 1, 3, 3] (MSE as for single pixels)."""
    return torch.tensor(values, dtype=torch.float64).view(-1, 1, 1, 1).expand(-1, 1, 3, 3) \
        .clone()


def test_hungarian_moves_an_exact_copy_that_the_matching_counts() -> None:
    """Truth (0.45, 0.9, 0.0); reconstruction: exact copies of the first two and the mean
    image 0.5 as padding. The least-total-MSE assignment pairs the copy of 0.45 with 0.0
    (0.0025 + 0.2025 < 0.25), so thresholding it finds one exact image; there are two."""
    truth = pixels(0.45, 0.9, 0.0)
    reconstruction = pixels(0.45, 0.9, 0.5)
    scored = score_reconstruction(reconstruction, truth, padding=[2])
    assert sum(s.psnr >= EXACT_PSNR for s in scored.images) == 1  # the old count
    assert scored.exact == 2
    assert sorted(exact_matching(reconstruction, truth, padding=[2])) == [(0, 0), (1, 1)]
    assert [s.exact_index for s in scored.images] == [0, 1, -1]
    assert scored.mean_psnr == pytest.approx(float(np.mean([s.psnr for s in scored.images])))
    assert [s.padding for s in scored.images] == [True, False, False]  # 0.45 got the mean


def test_successes_at_20_db_are_the_largest_matching_not_the_least_mse_one() -> None:
    """Two reconstructions, each within 20 dB of both truths except one pair at 19.6 dB: the
    least-total-MSE assignment pairs the exact copy with its truth and leaves the other at
    19.6 dB (one success); two pairs at >= 20 dB exist, and that is what the victim counts.
    The images carry a black and a white pixel and the data set's mean image is black, so
    every constant guess stays near 9 dB and the floor margin does not decide the count."""
    def image(a: float, b: float) -> torch.Tensor:
        return torch.tensor([[[a, b], [0.0, 1.0]]])

    truth = torch.stack([image(0.5, 0.5), image(0.699, 0.5)])
    reconstruction = torch.stack([image(0.5, 0.5), image(0.5884, 0.6783)])
    score = score_reconstruction(reconstruction, truth,
                                 pool=MeanPool(torch.zeros(1, 2, 2), 1, holds_truth=False))
    assert score.floors is not None and score.floors.mean_psnr < 10
    assert sum(s.psnr >= SUCCESS_PSNR for s in score.images) == 1
    assert score.successes == 2 and score.exact == 1


def test_padding_is_never_exact_nor_the_best_image() -> None:
    truth = pixels(0.5, 0.2, 0.8)
    reconstruction = pixels(0.5, 0.25, 0.7)  # slot 0 is the attack's mean image
    scored = score_reconstruction(reconstruction, truth, padding=[0])
    assert scored.exact == 0  # the mean slot equals truth 0 exactly, but it is padding
    best_real = float(pairwise_psnr(reconstruction[1:], truth).max())
    assert scored.best_psnr == pytest.approx(best_real)
    assert scored.best_psnr < EXACT_PSNR
    assert score_reconstruction(reconstruction, truth).exact == 1  # unmarked, it counts
    everything = score_reconstruction(reconstruction, truth, padding=[0, 1, 2])
    assert everything.best_psnr is None and everything.exact == 0
    with pytest.raises(ValueError, match="outside"):
        score_reconstruction(reconstruction, truth, padding=[3])


def test_the_matching_is_maximum_not_greedy() -> None:
    """Reconstruction 0 is exact for truths 0 and 1, reconstruction 1 only for truth 0: a
    greedy pass that gives reconstruction 0 to truth 0 finds one pair; the maximum finds
    two."""
    truth = pixels(0.300, 0.308, 0.9)
    reconstruction = pixels(0.304, 0.295, 0.1)
    good = pairwise_psnr(reconstruction, truth) >= EXACT_PSNR
    assert good[0].tolist() == [True, True, False] and good[1].tolist() == [True, False, False]
    assert len(exact_matching(reconstruction, truth)) == 2


def imprint_round(start: int, count: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Imprint (256 bins, model seed 0) on faces ``start``..``start+count-1`` in process:
    the reconstruction on [0, 1], the truth and the padding slots."""
    private, public = load_dataset("faces", "train"), load_dataset("faces", "test")
    info = private.info
    torch.manual_seed(0)
    model = build_model("imprint:bins=256", info.shape, info.num_classes)
    attack = create_attack("imprint", {})
    known = ServerKnowledge(
        model, {n: p.detach().clone() for n, p in model.named_parameters()},
        {n: b.detach().clone() for n, b in model.named_buffers()},
        normalize(public.images, info), "faces test split", info.shape, info.num_classes,
        "gradient", count)
    crafted = attack.craft(known, [], 0)
    user = copy.deepcopy(model)
    with torch.no_grad():
        for name, parameter in user.named_parameters():
            parameter.copy_(crafted[name])
    images, labels = private.images[start:start + count], private.labels[start:start + count]
    observation = observe(user, images, labels, info, generator=torch.Generator().manual_seed(0))
    assert attack.craft(known, [observation], 0) is None
    result = attack.reconstruct(observation)
    return denormalize(result.images, info).clamp(0, 1), images, result.padding


def recovered_images(reconstruction: torch.Tensor, truth: torch.Tensor) -> int:
    """How many private images some reconstructed image matches at >= 40 dB (two bins that
    both hold one image, one of them faintly mixed, recover it once)."""
    good = pairwise_psnr(reconstruction, truth) >= EXACT_PSNR
    return int(good.any(dim=1).sum())


def test_imprint_on_faces_96_to_159_counts_every_exact_image() -> None:
    """The issue's case: the assignment undercounted what the reconstruction holds."""
    reconstruction, truth, padding = imprint_round(96, 64)
    scored = score_reconstruction(reconstruction, truth, padding=padding)
    assert padding  # imprint padded this reconstruction with the mean image
    assert scored.exact == recovered_images(reconstruction, truth)
    assert scored.exact > sum(s.psnr >= EXACT_PSNR for s in scored.images)  # was undercounted


@pytest.mark.integration
def test_the_victim_counts_by_matching_and_honours_padding() -> None:
    """Score over gRPC: padding travels in the request, the count and the best image in the
    reply; a padding index out of range is refused and the victim keeps serving."""
    args = ["--dataset", "digits", "--split", "train", "--images", "0-3", "--model",
            "mlp:width=16,depth=1", "--batch-size", "4", "--allow-reveal", "--token", "t",
            "--score-budget", "3"]
    with VictimProcess(args) as victim:
        client = VictimClient(victim.address, token="t")
        described = client.describe()
        params = {t.name: torch.zeros(list(t.shape)) for t in described.parameters}
        got = client.compute_update(params, {})
        truth, _ = client.reveal(got.round_id)
        mean = truth.mean(0, keepdim=True)
        reconstruction = torch.cat([truth[:2], mean.expand(2, -1, -1, -1)])
        with pytest.raises(Exception, match="padding indices"):
            client.score(got.round_id, reconstruction, padding=[4])
        score = client.score(got.round_id, reconstruction, padding=[2, 3])
        assert score.exact == 2 and score.exact_psnr == EXACT_PSNR
        assert score.best_scored and score.best_psnr >= EXACT_PSNR
        assert sum(s.exact for s in score.images) == 2
        assert sum(s.padding for s in score.images) == 2
        padded_only = client.score(got.round_id, mean.expand(4, -1, -1, -1).clone(),
                                   padding=[0, 1, 2, 3])
        assert padded_only.exact == 0 and not padded_only.best_scored


@pytest.mark.integration
def test_a_padded_run_records_the_matching_count(tmp_path: Path) -> None:
    """Imprint across processes on faces 96–159: metrics.json's exact count equals the number
    of private images that reconstruction.npy holds at >= 40 dB."""
    args = ["--dataset", "faces", "--split", "train", "--images", "96-159", "--model",
            "imprint:bins=256", "--batch-size", "64", "--seed", "0"]
    with VictimProcess(args) as victim:
        done = subprocess.run([sys.executable, "-m", "fedleak", "attack", "--victim",
                               victim.address, "--attack", "imprint", "--out",
                               str(tmp_path / "run"), "--quiet"],
                              capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    reconstruction = torch.from_numpy(np.load(tmp_path / "run" / "round-000" /
                                              "reconstruction.npy"))
    truth = load_dataset("faces", "train").images[96:160]
    recovered = recovered_images(reconstruction, truth)
    assert metrics["summary"]["exact"] == recovered == metrics["rounds"][0]["exact"]
    assert metrics["summary"]["best_psnr"] >= EXACT_PSNR
