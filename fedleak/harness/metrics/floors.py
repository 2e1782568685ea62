"""Trivial floors: what a reconstruction that read nothing of the update scores.

A PSNR means something only beside what a guess made without the update scores on the same
image. For every private image x (``[C, H, W]`` on [0, 1]) three constant guesses are scored
with the same PSNR and SSIM as the reconstruction:

- ``grey``: the flat image 0.5 everywhere;
- ``data-set mean``: the mean image of the data the images come from *without the image
  itself* (the victim's private pool; on a Flower node, the batch it trained on), the
  leave-one-out mean x̄₋ᵢ = (Σ_n x_n − x_i) / (N − 1) — with the image in it, a pool of one
  would "guess" the image exactly; left out when the pool holds no other image;
- ``own mean colour``: the image's own mean per channel, μ_c(x) = mean_{h,w} x_{c,h,w}, the
  flat image closest to x in MSE (an oracle no attacker holds: a reconstruction that is not
  above it shows at most the image's average colour).

The image's *floor* is the best of the three (the highest PSNR; its SSIM the highest SSIM of
the three), and its *margin* the reconstruction's PSNR minus that floor. A reconstruction
*above its floor* beats the floor by at least :data:`FLOOR_MARGIN_DB`: 3 dB, an error power
half the best constant guess's. Counts of images above the floor (and successes, which need
the success threshold too) are the largest one-to-one matching of private images to
non-padding reconstructions among the pairs that meet it (the rule of every count,
:mod:`~fedleak.harness.metrics.image_metrics`). Where no image is above its floor, a report
says so in words: "no image recovered beyond a constant guess".

Geiping et al. 2020 compare with a "random image"; Hayes et al. 2023 count success relative
to a prior baseline κ (:mod:`~fedleak.harness.metrics.success_bounds`); these floors are the
per-image, per-round counterpart a reader needs beside every PSNR.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

#: the constant guesses, in the order they are reported
GREY, DATASET_MEAN, MEAN_COLOUR = "grey", "data-set mean", "own mean colour"
GUESSES = (GREY, DATASET_MEAN, MEAN_COLOUR)
#: a reconstruction is above its floor at this many dB over the best constant guess or more
FLOOR_MARGIN_DB = 3.0
#: the words a report uses when no image is above its floor
NOTHING_RECOVERED = "no image recovered beyond a constant guess"


@dataclass
class FloorScores:
    """Per-image PSNR and SSIM of each constant guess (:data:`GUESSES`), ``[n]`` each."""

    psnr: dict[str, Tensor]
    ssim: dict[str, Tensor]

    @property
    def made(self) -> list[str]:
        """The guesses made, in :data:`GUESSES` order (the data-set mean needs another
        image)."""
        return [g for g in GUESSES if g in self.psnr]

    @property
    def best_psnr(self) -> Tensor:
        """The floor's PSNR of each image: the best of the guesses."""
        return torch.stack([self.psnr[g] for g in self.made]).max(0).values

    @property
    def best_ssim(self) -> Tensor:
        """The floor's SSIM of each image: the best of the guesses' SSIMs."""
        return torch.stack([self.ssim[g] for g in self.made]).max(0).values

    @property
    def best_guess(self) -> list[str]:
        """Which guess gives each image's floor PSNR."""
        made = self.made
        index = torch.stack([self.psnr[g] for g in made]).argmax(0)
        return [made[int(i)] for i in index]


@dataclass
class FloorSummary:
    """A batch's floors beside its reconstruction: each guess's mean PSNR and SSIM, the mean
    of the per-image floors, the mean margin over them, and how many images are above their
    floor by ``margin_db`` (the largest one-to-one matching, padding left out)."""

    guesses: dict[str, tuple[float, float]]
    mean_psnr: float
    mean_ssim: float
    mean_margin: float
    above: int
    images: int
    margin_db: float = FLOOR_MARGIN_DB

    @property
    def recovered_nothing(self) -> bool:
        """No image is above its floor: nothing recovered beyond a constant guess."""
        return self.above == 0


@dataclass(frozen=True)
class MeanPool:
    """The data the data-set mean guess is taken over: the sum of its ``count`` images and
    whether the scored images are among them (then each is left out of its own guess)."""

    total: Tensor
    count: int
    holds_truth: bool = True

    @classmethod
    def of(cls, images: Tensor) -> MeanPool:
        """The pool of ``images`` ``[N, C, H, W]``, the scored images among them."""
        return cls(images.double().sum(0), int(images.shape[0]))


def constant_guesses(truth: Tensor, pool: MeanPool | None = None) -> dict[str, Tensor]:
    """The guesses for each image of ``truth`` ``[n, C, H, W]``, each ``[n, C, H, W]``: grey,
    the pool's leave-one-out mean (``pool`` None: ``truth`` itself; left out when no other
    image is in it) and the image's own mean colour."""
    pool = MeanPool.of(truth) if pool is None else pool
    if tuple(pool.total.shape) != tuple(truth.shape[1:]):
        raise ValueError(f"the data set's mean image is {tuple(pool.total.shape)}; the images "
                         f"are {tuple(truth.shape[1:])}")
    out = {GREY: torch.full_like(truth, 0.5)}
    others = pool.count - (1 if pool.holds_truth else 0)
    if others >= 1:
        rest = pool.total.to(torch.float64) - (truth.double() if pool.holds_truth else 0.0)
        out[DATASET_MEAN] = (rest / others).to(truth.dtype).expand_as(truth).clone()
    out[MEAN_COLOUR] = truth.mean(dim=(2, 3), keepdim=True).expand_as(truth).clone()
    return out


def summarise(floors: FloorScores, psnr: Tensor, above: int,
              margin_db: float = FLOOR_MARGIN_DB) -> FloorSummary:
    """The batch's :class:`FloorSummary`; ``psnr`` ``[n]`` the reconstruction's per-image PSNR
    (after matching), ``above`` the count of images above their floor."""
    best = floors.best_psnr
    return FloorSummary(
        {g: (float(floors.psnr[g].mean()), float(floors.ssim[g].mean())) for g in floors.made},
        float(best.mean()), float(floors.best_ssim.mean()), float((psnr.double() - best).mean()),
        above, int(best.numel()), margin_db)


def combined(floors: list[FloorSummary]) -> FloorSummary | None:
    """Several batches' floors as one: means weighted by their images, counts summed (None:
    no batch had floors)."""
    floors = [f for f in floors if f.images]
    if not floors:
        return None
    total = sum(f.images for f in floors)

    def mean(values: list[float]) -> float:
        return sum(v * f.images for v, f in zip(values, floors, strict=True)) / total

    guesses = {g: (mean([f.guesses[g][0] for f in floors]),
                   mean([f.guesses[g][1] for f in floors]))
               for g in floors[0].guesses if all(g in f.guesses for f in floors)}
    return FloorSummary(guesses, mean([f.mean_psnr for f in floors]),
                        mean([f.mean_ssim for f in floors]),
                        mean([f.mean_margin for f in floors]), sum(f.above for f in floors),
                        total, floors[0].margin_db)


def floor_words(floor: FloorSummary | None, label_accuracy: float | None = None) -> str:
    """One line beside a figure: the floors and, when nothing is above them, that in words
    (with the labels, which may leak when the images do not)."""
    if floor is None:
        return ""
    guesses = ", ".join(f"{g} {p:.2f} dB" for g, (p, _) in floor.guesses.items())
    where = (f"floor (best constant guess per image) {floor.mean_psnr:.2f} dB, SSIM "
             f"{floor.mean_ssim:.3f} [{guesses}]; margin {floor.mean_margin:+.2f} dB")
    if floor.recovered_nothing:
        labels = "" if label_accuracy is None else f"; labels {label_accuracy:.0%}"
        return f"{NOTHING_RECOVERED}{labels} ({where})"
    return (f"{floor.above} of {floor.images} image(s) above their floor by "
            f"≥ {floor.margin_db:g} dB ({where})")

