"""Reconstruction quality: per-image PSNR, SSIM and MSE after one-to-one matching.

All images are batches ``[B, C, H, W]`` on [0, 1], already de-normalised. A reconstructed
batch comes back in an arbitrary order, so it is first matched to the ground truth one-to-one
(Hungarian assignment on pairwise MSE), then every truth image is scored against its match.
Batch figures are means of the per-image values (the mean PSNR is not the PSNR of the batch
MSE). Labels are scored as a multiset, since label order carries no information.

*Counts* are not read off that assignment: the least-total-MSE matching may pair an exact copy
with the wrong image when that lowers the sum (a reconstruction padded with mean images moves
copies onto the images the padding scores worst against). The number of exact recoveries is
the largest one-to-one matching among the pairs at PSNR ≥ 40 dB (a maximum bipartite matching,
:func:`exact_matching`), over the submitted images that are not padding; the best image is the
best such pair. Padding slots (an attack's placeholders, e.g. the mean image) still take part
in the assignment behind the mean PSNR, and are flagged there.

Every batch is scored beside its trivial *floors* (:mod:`~fedleak.harness.metrics.floors`: a
flat grey image, the mean of the pool's other images, the image's own mean colour): a *success*
needs both PSNR ≥ :data:`SUCCESS_PSNR` and a PSNR at least :data:`~fedleak.harness.metrics.floors.
FLOOR_MARGIN_DB` above the image's floor, so a reconstruction no better than a constant guess
never counts, however high its PSNR (a smooth image's mean colour may score 20 dB).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedleak.harness.metrics.floors import (
    FLOOR_MARGIN_DB,
    FloorScores,
    FloorSummary,
    MeanPool,
    constant_guesses,
    summarise,
)

SSIM_WINDOW = 11
SSIM_SIGMA = 1.5
SSIM_K = (0.01, 0.03)
MSE_FLOOR = 1e-10  # relative to data_range**2: PSNR is capped at 100 dB
#: an image counts as recovered *exactly* at this PSNR on [0, 1] or above (an error of 1 % of
#: the range per pixel): what imprint, trap weights and spear promise, beside the mean PSNR
EXACT_PSNR = 40.0
#: An image counts as reconstructed (a *success*, reconstruction robustness; docs/bounds.md) at
#: this PSNR or above, and at least FLOOR_MARGIN_DB above its floor (module docstring).
SUCCESS_PSNR = 20.0


@dataclass
class ImageScore:
    """Scores of truth image ``index`` against reconstruction ``matched_index``; ``padding``:
    that reconstruction is one of the attack's placeholders; ``exact_index``: the reconstruction
    the exact matching pairs with this image (-1: not recovered exactly); ``floor_psnr`` /
    ``floor_ssim``: the best constant guess's scores on this image, ``floor_guess`` which guess
    it is (:mod:`~fedleak.harness.metrics.floors`)."""

    index: int
    matched_index: int
    psnr: float
    ssim: float
    mse: float
    padding: bool = False
    exact_index: int = -1
    floor_psnr: float | None = None
    floor_ssim: float | None = None
    floor_guess: str = ""


@dataclass
class BatchScore:
    """Per-image scores and their means; ``label_accuracy`` is None when labels were not given.

    ``exact``: the largest one-to-one matching of truth images to non-padding reconstructions
    at PSNR ≥ :data:`EXACT_PSNR`; ``best_psnr``: the best PSNR of any truth image against any
    non-padding reconstruction (None when every slot is padding); ``successes``: the same
    largest matching among the pairs at :data:`SUCCESS_PSNR` and at least the floor margin
    above the image's floor; ``floors``: the batch's trivial floors beside it.
    """

    images: list[ImageScore]
    mean_psnr: float
    mean_ssim: float
    mean_mse: float
    label_accuracy: float | None
    exact: int = 0
    best_psnr: float | None = None
    successes: int = 0
    floors: FloorSummary | None = None


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


def floor_scores(truth: Tensor, pool: MeanPool | None = None) -> FloorScores:
    """PSNR and SSIM of every constant guess of :mod:`~fedleak.harness.metrics.floors` (grey,
    the leave-one-out mean image of ``pool``, each image's own mean colour) against every
    image of ``truth``; ``pool`` None: ``truth`` itself."""
    guesses = constant_guesses(truth.float(), pool)
    return FloorScores({g: psnr_per_image(x, truth) for g, x in guesses.items()},
                       {g: ssim_per_image(x, truth) for g, x in guesses.items()})


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


def pairwise_psnr(reconstruction: Tensor, truth: Tensor, data_range: float = 1.0) -> Tensor:
    """``[len(truth), len(reconstruction)]`` PSNR of every pair, floored like
    :func:`psnr_per_image`."""
    floor = MSE_FLOOR * data_range**2
    return 10.0 * torch.log10(data_range**2 / _pairwise_mse(truth, reconstruction)
                              .clamp_min(floor))


def exact_matching(
    reconstruction: Tensor,
    truth: Tensor,
    threshold: float | Tensor = EXACT_PSNR,
    padding: Sequence[int] = (),
) -> list[tuple[int, int]]:
    """The largest one-to-one matching of truth images to reconstructions among the pairs at
    PSNR ≥ ``threshold``, padding slots left out: ``(truth index, reconstruction index)``.
    ``threshold`` may be one value per truth image (``[len(truth)]``: e.g. its floor plus a
    margin).

    A maximum bipartite matching (``scipy.sparse.csgraph.maximum_bipartite_matching``,
    Hopcroft–Karp): no other one-to-one pairing has more pairs at the threshold, so a count
    read from it never rounds toward "private".
    """
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_bipartite_matching

    if reconstruction.shape[0] == 0 or truth.shape[0] == 0:
        return []
    if reconstruction.shape[1:] != truth.shape[1:]:
        raise ValueError(f"reconstruction images are {tuple(reconstruction.shape[1:])} but "
                         f"truth images are {tuple(truth.shape[1:])}")
    bar = threshold.double().view(-1, 1) if isinstance(threshold, Tensor) else threshold
    good = pairwise_psnr(reconstruction, truth) >= bar
    skipped = [j for j in padding if 0 <= j < reconstruction.shape[0]]
    if skipped:
        good[:, skipped] = False
    if not bool(good.any()):
        return []
    matched = maximum_bipartite_matching(csr_matrix(good.cpu().numpy().astype(np.int8)),
                                         perm_type="column")
    return [(i, int(j)) for i, j in enumerate(matched) if j >= 0]


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
    padding: Sequence[int] = (),
    pool: MeanPool | None = None,
) -> BatchScore:
    """Score a reconstructed batch against the truth, image by image, beside its floors.

    With ``match`` the reconstruction is first reordered by :func:`match_one_to_one`; without
    it, ``reconstruction[i]`` is compared with ``truth[i]``. Label accuracy is computed when
    both label lists are given. ``padding`` lists the reconstruction's placeholder slots: they
    are flagged, and never counted as exact nor as the best image (module docstring).
    ``pool`` is the data the floors' data-set mean image is taken over, each image left out of
    its own (:class:`~fedleak.harness.metrics.floors.MeanPool`; None: the ``truth`` batch).
    """

    _check_pair(reconstruction, truth)
    padded = set(_check_padding(padding, reconstruction.shape[0]))
    if match:
        perm = match_one_to_one(reconstruction, truth)
    else:
        perm = torch.arange(truth.shape[0])
    matched = reconstruction[perm]
    psnr, ssim = psnr_per_image(matched, truth), ssim_per_image(matched, truth)
    mse = mse_per_image(matched, truth)
    pairs = exact_matching(reconstruction, truth, padding=sorted(padded))
    exact_of = dict(pairs)
    floors = floor_scores(truth, pool)
    floor, floor_ssim, guess = floors.best_psnr, floors.best_ssim, floors.best_guess
    images = [
        ImageScore(i, int(perm[i]), float(psnr[i]), float(ssim[i]), float(mse[i]),
                   padding=int(perm[i]) in padded, exact_index=exact_of.get(i, -1),
                   floor_psnr=float(floor[i]), floor_ssim=float(floor_ssim[i]),
                   floor_guess=guess[i])
        for i in range(truth.shape[0])
    ]
    labels = None
    if predicted_labels is not None and true_labels is not None:
        labels = label_accuracy(predicted_labels, true_labels)
    kept = [j for j in range(reconstruction.shape[0]) if j not in padded]
    best = float(pairwise_psnr(reconstruction[kept], truth).max()) if kept else None
    above_floor = floor + FLOOR_MARGIN_DB
    above = len(exact_matching(reconstruction, truth, threshold=above_floor,
                               padding=sorted(padded)))
    successes = len(exact_matching(reconstruction, truth,
                                   threshold=above_floor.clamp_min(SUCCESS_PSNR),
                                   padding=sorted(padded)))
    return BatchScore(images, float(psnr.mean()), float(ssim.mean()), float(mse.mean()), labels,
                      exact=len(pairs), best_psnr=best, successes=successes,
                      floors=summarise(floors, psnr, above))


def _check_padding(padding: Sequence[int], count: int) -> list[int]:
    """``padding`` as distinct indices of the ``count`` submitted images."""
    out = sorted({int(j) for j in padding})
    bad = [j for j in out if not 0 <= j < count]
    if bad:
        raise ValueError(f"padding indices {bad[:8]} lie outside the {count} submitted images")
    return out


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
