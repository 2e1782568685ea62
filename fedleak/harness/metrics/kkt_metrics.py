"""Scoring KKT candidates against the private training set, inside the victim (``Score``).

Haim et al. (2022, Sec. 5.3, App. B.3) match every *training sample* to its best reconstruction
and report its SSIM; a sample counts as reconstructed above an SSIM threshold (0.4 in Fig. 4's
discussion). Unlike a gradient attack's batch, candidates are not matched one-to-one: one
candidate may be the best match of several training samples, and most candidates match none.

Two matchings live here:

- :func:`vote_reconstructions` is App. B.3 as the paper states it, and what the victim's ``Score``
  runs for a release: for every training sample x_i, the normalised cross-correlation (NCC) to
  every candidate; the *voters* are the candidates whose NCC is at least ``vote_fraction`` (0.9)
  times the best NCC; the reconstruction of x_i is the pixel-wise mean of its voters, and its
  SSIM against x_i is the sample's score. Candidates are chosen by NCC, never by SSIM.
- :func:`match_to_training` picks, per training sample, the candidate of highest SSIM: an
  optimistic oracle (it selects by the score itself), kept for controls in the benches.

Every training sample is scored beside its trivial *floors* (:func:`release_floors`,
:mod:`~fedleak.harness.metrics.floors`): a flat grey image, the mean of the victim's private
pool without the sample (x̄₋ᵢ = (Σ_n x_n − x_i) / (N − 1)) and the sample's own mean colour. On
small images a structured guess such as the pool's mean digit scores SSIM near the paper's 0.4
bar by itself, so a sample counts as *recovered beyond its floor* only at SSIM ≥ the threshold
**and** a voted reconstruction at least :data:`~fedleak.harness.metrics.floors.FLOOR_MARGIN_DB`
(3 dB) of PSNR above its floor, the rule of every other attack's success count. Voting gives each
sample a reconstruction of its own (several may share voters), so the counts are per sample,
not a one-to-one matching.

SSIM is :func:`fedleak.harness.metrics.ssim_per_image` (pytorch_msssim, Gaussian window σ 1.5,
11 wide shrunk to the image, valid filtering) on images in [0, 1]; candidates should already be
scaled to [0, 1] (:func:`fedleak.attacks.kkt.postprocess.scale_to_unit`). On 8×8 digits the
window shrinks to 7×7 and SSIM averages only 2×2 positions, so it is a coarse, forgiving score
there; compare against a held-out control before calling a sample recovered.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fedleak.attacks.kkt.postprocess import normalized_cross_correlation
from fedleak.harness.metrics.floors import (
    FLOOR_MARGIN_DB,
    FloorScores,
    FloorSummary,
    MeanPool,
    summarise,
)
from fedleak.harness.metrics.image_metrics import (
    floor_scores,
    mse_per_image,
    psnr_per_image,
    ssim_per_image,
)

#: SSIM above which a training sample counts as reconstructed (paper Sec. 5.3).
RECOVERED_SSIM = 0.4

#: App. B.3: candidates with NCC of at least this fraction of the best one vote.
VOTE_FRACTION = 0.9


@dataclass
class TrainingMatch:
    """Per training sample: the SSIM of its best candidate and that candidate's index."""

    ssim: Tensor
    index: Tensor

    def recovered(self, threshold: float = RECOVERED_SSIM) -> int:
        """How many training samples have a candidate with SSIM ≥ ``threshold``."""
        return int((self.ssim >= threshold).sum())


def _check_images(name: str, images: Tensor) -> None:
    if images.dim() != 4:
        raise ValueError(f"{name} must be [N, C, H, W], got shape {tuple(images.shape)}")
    if not bool(torch.isfinite(images).all()):
        raise ValueError(f"{name} must be finite")
    if images.numel() and (float(images.min()) < -1e-6 or float(images.max()) > 1 + 1e-6):
        raise ValueError(f"{name} must lie in [0, 1] (scale candidates with scale_to_unit)")


def match_to_training(
    candidates01: Tensor, train01: Tensor, *, chunk: int = 4096
) -> TrainingMatch:
    """For every training image, the candidate of highest SSIM and its index.

    ``candidates01`` ``[M, C, H, W]`` and ``train01`` ``[n, C, H, W]`` on [0, 1]. Costs
    n·M SSIM evaluations, ``chunk`` candidates at a time.
    """
    _check_images("candidates", candidates01)
    _check_images("training images", train01)
    if candidates01.shape[1:] != train01.shape[1:]:
        raise ValueError(
            f"candidates {tuple(candidates01.shape[1:])} and training images "
            f"{tuple(train01.shape[1:])} differ in shape"
        )
    if len(candidates01) == 0:
        n = len(train01)
        return TrainingMatch(torch.full((n,), float("-inf")), torch.full((n,), -1))
    best = torch.full((len(train01),), float("-inf"), dtype=torch.float64)
    index = torch.full((len(train01),), -1, dtype=torch.long)
    for start in range(0, len(candidates01), chunk):
        block = candidates01[start : start + chunk]
        for i, image in enumerate(train01):
            values = ssim_per_image(image.expand_as(block), block).double()
            value, position = values.max(0)
            if value > best[i]:
                best[i], index[i] = value, start + int(position)
    return TrainingMatch(ssim=best, index=index)


@dataclass
class VotedMatch:
    """Per training sample (App. B.3): its voted reconstruction and how it scores.

    ``reconstructions`` ``[n, C, H, W]`` (mean of the voters, on [0, 1]); ``nearest`` the
    candidate of highest NCC; ``voters`` how many candidates were averaged; ``ncc`` the best
    NCC; ``ssim``, ``psnr`` (dB) and ``mse`` of the reconstruction against the sample.
    """

    reconstructions: Tensor
    nearest: Tensor
    voters: Tensor
    ncc: Tensor
    ssim: Tensor
    psnr: Tensor
    mse: Tensor

    def recovered(self, threshold: float = RECOVERED_SSIM) -> int:
        """How many training samples have SSIM ≥ ``threshold``."""
        return int((self.ssim >= threshold).sum())


def vote_reconstructions(
    candidates01: Tensor, train01: Tensor, *, vote_fraction: float = VOTE_FRACTION
) -> VotedMatch:
    """App. B.3's nearest neighbours and voting for every training sample (see module doc).

    Voters of x_i: {j : NCC(x_i, c_j) ≥ vote_fraction · max_k NCC(x_i, c_k)} when the best NCC
    is positive, else only the nearest candidate. Costs one [n, M] NCC product and n SSIMs.
    """
    _check_images("candidates", candidates01)
    _check_images("training images", train01)
    if len(candidates01) == 0:
        raise ValueError("no candidates to match: submit at least one")
    if candidates01.shape[1:] != train01.shape[1:]:
        raise ValueError(
            f"candidates {tuple(candidates01.shape[1:])} and training images "
            f"{tuple(train01.shape[1:])} differ in shape"
        )
    if not 0 < vote_fraction <= 1:
        raise ValueError(f"vote_fraction must lie in (0, 1], got {vote_fraction}")
    ncc = normalized_cross_correlation(train01, candidates01)  # [n, M]
    best, nearest = ncc.max(1)
    votes = ncc >= (vote_fraction * best.clamp_min(0))[:, None]
    votes[best <= 0] = False
    votes[torch.arange(len(train01)), nearest] = True
    weights = votes.double() / votes.sum(1, keepdim=True)
    flat = weights @ candidates01.flatten(1).double()
    reconstructions = flat.to(candidates01.dtype).view(len(train01), *train01.shape[1:])
    reconstructions = reconstructions.clamp(0, 1)
    truth = train01.to(reconstructions.dtype)
    return VotedMatch(
        reconstructions=reconstructions,
        nearest=nearest,
        voters=votes.sum(1),
        ncc=best,
        ssim=ssim_per_image(reconstructions, truth).double(),
        psnr=psnr_per_image(reconstructions, truth).double(),
        mse=mse_per_image(reconstructions, truth),
    )


@dataclass
class ReleaseFloors:
    """Every training sample's trivial floor beside its voted reconstruction.

    ``scores``: each constant guess's PSNR and SSIM per sample; ``summary``: the guesses' means,
    the mean per-sample floor (PSNR and SSIM), the mean margin m̄ = mean_i (PSNR_i − floor_i) and
    ``summary.above`` = #{i : PSNR_i ≥ floor_i + margin_db}; ``recovered_above`` = #{i :
    SSIM_i ≥ threshold and PSNR_i ≥ floor_i + margin_db}, the recovered count that a constant
    guess cannot reach.
    """

    scores: FloorScores
    summary: FloorSummary
    recovered_above: int
    threshold: float


def release_floors(match: VotedMatch, train01: Tensor, pool: MeanPool | None = None, *,
                   threshold: float = RECOVERED_SSIM,
                   margin_db: float = FLOOR_MARGIN_DB) -> ReleaseFloors:
    """The floors of the training samples ``train01`` ``[n, C, H, W]`` (on [0, 1]) that
    ``match`` scored (module docstring).

    ``pool`` is the data the data-set mean guess is taken over, each sample left out of its own
    guess (the victim's private pool; None: the training set itself). A sample is above its
    floor when PSNR_i ≥ max_g PSNR(g_i, x_i) + ``margin_db`` (g over grey, the pool's
    leave-one-out mean, the sample's own mean colour), and recovered beyond it when also
    SSIM_i ≥ ``threshold`` (Haim et al. 2022 Sec. 5.3's bar, 0.4).
    """
    _check_images("training images", train01)
    if len(train01) != len(match.psnr):
        raise ValueError(f"{len(match.psnr)} scored samples but {len(train01)} training images")
    floors = floor_scores(train01.float(), pool)
    above = match.psnr >= floors.best_psnr.double() + margin_db
    recovered = above & (match.ssim >= threshold)
    return ReleaseFloors(floors, summarise(floors, match.psnr, int(above.sum()), margin_db),
                         int(recovered.sum()), threshold)
