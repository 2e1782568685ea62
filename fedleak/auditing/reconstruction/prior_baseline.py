"""κ(η): how often the best *fixed* guess lands within η of a target drawn from the prior.

Reconstruction robustness (Balle et al. 2022; Hayes et al. 2023) measures an attack against
the prior's baseline κ = sup_ẑ P_{z∼π}[ρ(ẑ, z) ≤ η] — what a guess made without looking at
the mechanism's output achieves. For an ordinary attack scored by PSNR (or SSIM) with a
success threshold η, fedleak estimates κ on the *public* prior (a data set's other split):

    κ̂ = max_g  #{j : s(g, z_j) ≥ η} / N

over guesses g among the prior's own images and its mean image, where s is the similarity
(PSNR in dB, or SSIM) of every guess to every prior image, which the caller computes. Each
prior image counts itself as a hit, so κ̂ ≥ 1/N: a conservative (larger) baseline, hence a
larger bound. The maximum over a finite set of guesses may miss the supremum: :attr:`upper`
adds the Clopper–Pearson upper end of the winning guess's count to cover the sampling error;
the bound is then computed at ``upper`` so that it is not rounded toward "private" by the
sample (it can still be by a better guess outside the set — the caveat beside every figure).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedleak.auditing.game_statistics import success_rate


@dataclass(frozen=True)
class PriorBaseline:
    """κ̂ at one threshold, its one-sided upper confidence end, and the prior's size."""

    threshold: float
    metric: str          # "psnr" (dB) or "ssim"
    kappa: float         # the best fixed guess's hit rate on the prior
    upper: float         # Clopper–Pearson upper end (one-sided, at ``confidence``)
    prior_size: int
    guesses: int
    confidence: float = 0.95


def prior_baseline(similarity: np.ndarray, threshold: float, metric: str = "psnr",
                   confidence: float = 0.95) -> PriorBaseline:
    """κ̂ from ``similarity[g, j]`` = s(guess g, prior image j) (higher is closer)."""
    scores = np.asarray(similarity, dtype=np.float64)
    if scores.ndim != 2 or scores.shape[1] < 1:
        raise ValueError("similarity must be a [guesses, prior images] matrix")
    hits = (scores >= threshold).sum(axis=1)
    best = int(hits.max())
    n = scores.shape[1]
    # one-sided upper end at `confidence` = two-sided interval at 2·confidence − 1
    upper = success_rate(best, n, 2 * confidence - 1).high
    return PriorBaseline(float(threshold), metric, best / n, min(1.0, upper), n,
                         scores.shape[0], confidence)
