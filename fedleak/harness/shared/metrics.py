"""Reconstruction quality: per-image PSNR, SSIM and MSE after one-to-one matching.

All images are batches ``[B, C, H, W]`` on [0, 1], already de-normalised. A reconstructed
batch comes back in an arbitrary order, so it is first matched to the ground truth one-to-one
(Hungarian assignment on pairwise MSE), then every truth image is scored against its match.
Batch figures are means of the per-image values (the mean PSNR is not the PSNR of the batch
MSE). Labels are scored as a multiset, since label order carries no information.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

SSIM_WINDOW = 11
SSIM_SIGMA = 1.5
SSIM_K = (0.01, 0.03)
MSE_FLOOR = 1e-10  # relative to data_range**2: PSNR is capped at 100 dB


@dataclass
class ImageScore:
    """Scores of truth image ``index`` against reconstruction ``matched_index``."""

    index: int
    matched_index: int
    psnr: float
    ssim: float
    mse: float


@dataclass
class BatchScore:
    """Per-image scores and their means; ``label_accuracy`` is None when labels were not given."""

    images: list[ImageScore]
    mean_psnr: float
    mean_ssim: float
    mean_mse: float
    label_accuracy: float | None


def mse_per_image(x: Tensor, y: Tensor) -> Tensor:
    """Mean squared error of each pair: ``mean_{c,h,w} (x - y)^2``, shape ``[B]``."""
    _check_pair(x, y)
    return (x.double() - y.double()).pow(2).flatten(1).mean(1)


def psnr_per_image(x: Tensor, y: Tensor, data_range: float = 1.0) -> Tensor:
    """Peak signal-to-noise ratio of each pair in dB: ``10 log10(data_range^2 / MSE)``.

    The MSE is floored at ``1e-10 * data_range^2``, so identical images score 100 dB rather
    than +inf and batch means stay finite.
    """
    floor = MSE_FLOOR * data_range**2
    return 10.0 * torch.log10(data_range**2 / mse_per_image(x, y).clamp_min(floor))


def ssim_per_image(x: Tensor, y: Tensor) -> Tensor:
    """Structural similarity of each pair (Wang et al. 2004), shape ``[B]``.

    ``pytorch_msssim.ssim``: Gaussian window with sigma 1.5, ``K = (0.01, 0.03)``,
    ``data_range = 1``, valid (unpadded) filtering, SSIM map averaged over channels and
    positions per image. The window is 11 wide, shrunk to the largest odd size
    ``<= min(H, W)`` for small images (7 for 8×8 digits).
    """
    from pytorch_msssim import ssim

    _check_pair(x, y)
    window = min(SSIM_WINDOW, _largest_odd_at_most(min(x.shape[-2:])))
    values = ssim(
        x.float(),
        y.float(),
        data_range=1.0,
        size_average=False,
        win_size=window,
        win_sigma=SSIM_SIGMA,
        K=SSIM_K,
    )
    return values.double()


def match_one_to_one(reconstruction: Tensor, truth: Tensor) -> Tensor:
    """Hungarian matching on pairwise MSE: ``reconstruction[perm[i]]`` is matched to ``truth[i]``.

    Minimises ``sum_i MSE(truth[i], reconstruction[perm[i]])`` over permutations
    (``scipy.optimize.linear_sum_assignment``).
    """
    from scipy.optimize import linear_sum_assignment

    _check_pair(reconstruction, truth)
    cost = _pairwise_mse(truth, reconstruction)
    _, columns = linear_sum_assignment(cost.cpu().numpy())
    return torch.as_tensor(columns, dtype=torch.int64)


def match_among(reconstruction: Tensor, truth: Tensor) -> Tensor:
    """Hungarian matching of every truth image to its own image out of a reconstruction of at
    least as many (the reconstruction of several users' pooled batches, each user holding part
    of the truth): ``reconstruction[chosen[i]]`` is matched to ``truth[i]``, distinct ``chosen``
    minimising the summed MSE; the other reconstructed images go unmatched."""
    from scipy.optimize import linear_sum_assignment

    if reconstruction.shape[0] < truth.shape[0]:
        raise ValueError(f"the reconstruction has {reconstruction.shape[0]} images, fewer than "
                         f"the {truth.shape[0]} to match among them")
    _check_pair(reconstruction[:truth.shape[0]], truth)
    _, columns = linear_sum_assignment(_pairwise_mse(truth, reconstruction).cpu().numpy())
    return torch.as_tensor(columns, dtype=torch.int64)


def label_accuracy(predicted: Sequence[int] | Tensor, true: Sequence[int] | Tensor) -> float:
    """Multiset overlap: ``sum_k min(#pred == k, #true == k) / len(true)``.

    Order is ignored: ``[1, 1, 2]`` against ``[1, 2, 2]`` scores 2/3.
    """
    predicted_counts, true_counts = Counter(_as_ints(predicted)), Counter(_as_ints(true))
    total = sum(true_counts.values())
    if total == 0:
        raise ValueError("label_accuracy needs at least one true label")
    return sum((predicted_counts & true_counts).values()) / total


def score_reconstruction(
    reconstruction: Tensor,
    truth: Tensor,
    predicted_labels: Sequence[int] | Tensor | None = None,
    true_labels: Sequence[int] | Tensor | None = None,
    match: bool = True,
) -> BatchScore:
    """Score a reconstructed batch against the truth, image by image.

    With ``match`` the reconstruction is first reordered by :func:`match_one_to_one`; without
    it, ``reconstruction[i]`` is compared with ``truth[i]``. Label accuracy is computed when
    both label lists are given.
    """
    _check_pair(reconstruction, truth)
    if match:
        perm = match_one_to_one(reconstruction, truth)
    else:
        perm = torch.arange(truth.shape[0])
    matched = reconstruction[perm]
    psnr, ssim = psnr_per_image(matched, truth), ssim_per_image(matched, truth)
    mse = mse_per_image(matched, truth)
    images = [
        ImageScore(i, int(perm[i]), float(psnr[i]), float(ssim[i]), float(mse[i]))
        for i in range(truth.shape[0])
    ]
    labels = None
    if predicted_labels is not None and true_labels is not None:
        labels = label_accuracy(predicted_labels, true_labels)
    return BatchScore(images, float(psnr.mean()), float(ssim.mean()), float(mse.mean()), labels)


def _check_pair(reconstruction: Tensor, truth: Tensor) -> None:
    """Both ``[B, C, H, W]`` with equal shapes; the reconstruction finite."""
    for label, batch in (("reconstruction", reconstruction), ("truth", truth)):
        if not isinstance(batch, Tensor) or batch.dim() != 4:
            shape = tuple(batch.shape) if isinstance(batch, Tensor) else type(batch).__name__
            raise ValueError(f"{label} must be an image batch [B, C, H, W], got {shape}")
    if reconstruction.shape[1:] != truth.shape[1:]:
        raise ValueError(
            f"reconstruction images are {tuple(reconstruction.shape[1:])} (C, H, W) but truth "
            f"images are {tuple(truth.shape[1:])}; reconstruct at the data set's shape"
        )
    if reconstruction.shape[0] != truth.shape[0]:
        raise ValueError(
            f"reconstruction has {reconstruction.shape[0]} images but truth has "
            f"{truth.shape[0]}; submit one reconstruction per private image"
        )
    if not torch.isfinite(reconstruction).all():
        raise ValueError("reconstruction contains NaN or infinite values")


def _pairwise_mse(a: Tensor, b: Tensor) -> Tensor:
    """``[len(a), len(b)]`` matrix of ``MSE(a[i], b[j])``."""
    a_flat, b_flat = a.double().flatten(1), b.double().flatten(1)
    return torch.cdist(a_flat, b_flat).pow(2) / a_flat.shape[1]


def _largest_odd_at_most(n: int) -> int:
    return n if n % 2 == 1 else n - 1


def _as_ints(labels: Sequence[int] | Tensor) -> list[int]:
    if isinstance(labels, Tensor):
        return [int(v) for v in labels.flatten().tolist()]
    return [int(v) for v in labels]
