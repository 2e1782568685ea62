"""Scoring KKT candidates against the private training set, inside the victim (``Score``).

Haim et al. (2022, Sec. 5.3, App. B.3) match every *training sample* to its best reconstruction
and report its SSIM; a sample counts as reconstructed above an SSIM threshold (0.4 in Fig. 4's
discussion). Unlike a gradient attack's batch, candidates are not matched one-to-one: one
candidate may be the best match of several training samples, and most candidates match none.

SSIM is :func:`fedleak.harness.metrics.ssim_per_image` (pytorch_msssim, Gaussian window σ 1.5,
11 wide shrunk to the image, valid filtering) on images in [0, 1]; candidates should already be
scaled to [0, 1] (:func:`fedleak.attacks.kkt_postprocess.scale_to_unit`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fedleak.harness.metrics import ssim_per_image

#: SSIM above which a training sample counts as reconstructed (paper Sec. 5.3).
RECOVERED_SSIM = 0.4


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
