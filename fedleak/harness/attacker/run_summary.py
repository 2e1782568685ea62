"""A run's headline: the means over its scored images and rounds, beside their floors.

:class:`RunSummary` is what ``metrics.json``'s ``summary`` (and ``inexact_summary``) holds and
what the terminal's summary lines read (:mod:`~fedleak.harness.attacker.records`): images and
rounds scored, mean PSNR / SSIM, label accuracy, exact recoveries, the best image, the Fisher
ceilings, the ε spent, and the trivial floors of every scored image
(:mod:`~fedleak.harness.metrics.floors`), weighted by images.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedleak.harness.metrics.floors import FloorSummary, combined

OMIT = {"omit_if_none": True}


@dataclass
class RunSummary:
    """Means over every scored image and round."""

    rounds: int
    images: int
    mean_psnr: float | None
    mean_ssim: float | None
    label_accuracy: float | None
    wall_time_s: float
    mean_feature_cosine: float | None = field(default=None, metadata=OMIT)
    mean_feature_relative_error: float | None = field(default=None, metadata=OMIT)
    #: ε the victim's accountant reports after the last round (DP defenses), and its δ
    epsilon: float | None = field(default=None, metadata=OMIT)
    delta: float | None = field(default=None, metadata=OMIT)
    #: exact recoveries over every round (each round's largest matching at EXACT_PSNR dB)
    exact: int | None = field(default=None, metadata=OMIT)
    #: the best image of any round (padding never counts)
    best_psnr: float | None = field(default=None, metadata=OMIT)
    #: the mean of the victim's Fisher PSNR ceilings over the images that have one
    mean_fisher_psnr_ceiling: float | None = field(default=None, metadata=OMIT)

    #: attacked rounds the victim (or node) did not score: left out of ``rounds`` and the means
    unscored: int | None = field(default=None, metadata=OMIT)
    #: the trivial floors of every scored image (weighted by images, counts summed)
    floors: FloorSummary | None = field(default=None, metadata=OMIT)

    @classmethod
    def of(cls, rounds: list[Any]) -> RunSummary:
        """Means over the scored ones of ``rounds`` (:class:`~fedleak.harness.attacker.records.
        RoundRecord` s; ``rounds`` counts those, ``unscored`` the others)."""
        unscored = [r for r in rounds if not r.images and r.label_accuracy is None
                    and r.mean_feature_cosine is None]
        rounds = [r for r in rounds if r not in unscored]
        psnrs = [img.psnr for r in rounds for img in r.images]
        ssims = [img.ssim for r in rounds for img in r.images]
        accs = [r.label_accuracy for r in rounds if r.label_accuracy is not None]
        cosines = [r.mean_feature_cosine for r in rounds if r.mean_feature_cosine is not None]
        errors = [r.mean_feature_relative_error for r in rounds
                  if r.mean_feature_relative_error is not None]
        privacy: dict[str, float] = next((r.privacy for r in reversed(rounds) if r.privacy),
                                         {})
        ceilings = [img.fisher_psnr_ceiling for r in rounds for img in r.images
                    if img.fisher_psnr_ceiling is not None]
        exacts = [r.exact for r in rounds if r.exact is not None]
        bests = [r.best_psnr for r in rounds if r.best_psnr is not None]
        return cls(
            rounds=len(rounds),
            images=len(psnrs),
            mean_psnr=float(np.mean(psnrs)) if psnrs else None,
            mean_ssim=float(np.mean(ssims)) if ssims else None,
            label_accuracy=float(np.mean(accs)) if accs else None,
            wall_time_s=float(sum(r.wall_time_s for r in rounds)),
            mean_feature_cosine=float(np.mean(cosines)) if cosines else None,
            mean_feature_relative_error=float(np.mean(errors)) if errors else None,
            epsilon=privacy.get("epsilon_total"),
            delta=privacy.get("delta"),
            exact=sum(exacts) if exacts else None,
            best_psnr=max(bests) if bests else None,
            mean_fisher_psnr_ceiling=float(np.mean(ceilings)) if ceilings else None,
            unscored=len(unscored) or None,
            floors=combined([r.floors for r in rounds if r.floors is not None]),
        )
