"""The distinguishing game's statistics: from per-trial scores and the secret coins to an ε
lower bound by every estimator.

Trial i flips a fair coin b_i and runs the mechanism with the canary (b_i = 1) or without it;
the auditor, who never sees b_i, submits one score s_i per trial, larger meaning "the canary
was in". The holder of the coins then

1. splits the trials at random into a calibration share and an evaluation share
   (:mod:`fedleak.auditing.thresholds`: the threshold is never chosen on the trials the bound
   is computed from) — unless the auditor *declared* its threshold before the first trial
   (from public knowledge, e.g. half the shift the canary is expected to cause), in which
   case no trial is spent on choosing it and every trial is evaluated;
2. per estimator, chooses its threshold on the calibration share and computes its bound on the
   evaluation share at confidence 1 − α: Clopper–Pearson
   (:mod:`~fedleak.auditing.clopper_pearson`), the Gaussian-DP route
   (:mod:`~fedleak.auditing.gaussian_dp`) and the one-run bound
   (:mod:`~fedleak.auditing.one_run`, its guesses from two thresholds);
3. adds Andrew et al.'s one-shot estimate (:mod:`~fedleak.auditing.one_shot`: Gaussians fitted
   to the canary-in and canary-out scores of every trial) — an estimate, not a bound.

Every :class:`~fedleak.auditing.result.AuditBound` says what it is and how it was made.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedleak.auditing.clopper_pearson import clopper_pearson_epsilon, upper_bound
from fedleak.auditing.gaussian_dp import gdp_epsilon_lower_bound, mu_lower_bound
from fedleak.auditing.one_run import one_run_epsilon
from fedleak.auditing.one_shot import epsilon_two_gaussians
from fedleak.auditing.result import (
    CLOPPER_PEARSON,
    GAUSSIAN_DP,
    ONE_RUN,
    ONE_SHOT,
    AuditBound,
)
from fedleak.auditing.thresholds import (
    best_threshold,
    best_threshold_gaussian,
    best_threshold_pair,
    error_counts,
    guess_counts,
)


@dataclass(frozen=True)
class GameSettings:
    """δ and confidence of the bounds, and what was audited (carried into every result)."""

    delta: float
    confidence: float
    canary: str
    threat_model: str

    def __post_init__(self) -> None:
        if not 0 <= self.delta < 1:
            raise ValueError(f"delta must lie in [0, 1), got {self.delta}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must lie in (0, 1), got {self.confidence}")

    @property
    def alpha(self) -> float:
        return 1 - self.confidence


def calibration_split(trials: int, fraction: float, generator: np.random.Generator) \
        -> np.ndarray:
    """A random mask of ⌊fraction · trials⌋ calibration trials (the rest are evaluated)."""
    if not 0 < fraction < 1:
        raise ValueError(f"the calibration fraction must lie in (0, 1), got {fraction}")
    mask = np.zeros(trials, dtype=bool)
    mask[generator.permutation(trials)[: int(fraction * trials)]] = True
    return mask


def audit_bounds(scores: np.ndarray, coins: np.ndarray, calibration: np.ndarray,
                 settings: GameSettings, declared_threshold: float | None = None) \
        -> list[AuditBound]:
    """Every estimator's figure for these trials (see the module docstring).

    With ``declared_threshold`` (fixed before any trial ran) the calibration mask is ignored:
    every estimator tests "score ≥ threshold" on every trial (the one-run bound guesses every
    trial).
    """
    scores, coins = np.asarray(scores, dtype=float), np.asarray(coins, dtype=bool)
    calibration = np.asarray(calibration, dtype=bool)
    if not scores.shape == coins.shape == calibration.shape or scores.ndim != 1:
        raise ValueError("scores, coins and the calibration mask must be equally long vectors")
    if not np.isfinite(scores).all():
        raise ValueError("scores must be finite")
    if declared_threshold is not None:
        if not math.isfinite(declared_threshold):
            raise ValueError("a declared threshold must be finite")
        calibration = np.zeros_like(coins)
        rule = ("declared threshold: fixed by the auditor before the first trial, every "
                f"trial evaluated ({scores.size})")
    else:
        rule = (f"held-out split: thresholds chosen on {int(calibration.sum())} calibration "
                f"trials, the bound computed on the other {int((~calibration).sum())}")
    cal_s, cal_c = scores[calibration], coins[calibration]
    ev_s, ev_c = scores[~calibration], coins[~calibration]
    fixed = declared_threshold
    a, d = settings.alpha, settings.delta
    common = dict(confidence=settings.confidence, trials_in=int(ev_c.sum()),
                  trials_out=int((~ev_c).sum()), delta=d, canary=settings.canary,
                  threat_model=settings.threat_model, threshold_rule=rule)
    out = []

    t = fixed if fixed is not None else best_threshold(
        cal_s, cal_c, lambda fp, n0, fn, n1: clopper_pearson_epsilon(fp, n0, fn, n1, a, d))
    fp, n0, fn, n1 = error_counts(ev_s, ev_c, t)
    out.append(AuditBound(CLOPPER_PEARSON, clopper_pearson_epsilon(fp, n0, fn, n1, a, d),
                          False, threshold=t, fpr_upper=upper_bound(fp, n0, a / 2),
                          fnr_upper=upper_bound(fn, n1, a / 2), **common))  # type: ignore[arg-type]

    t = fixed if fixed is not None else best_threshold_gaussian(
        cal_s, cal_c, int((~ev_c).sum()), int(ev_c.sum()),
        lambda fp, n0, fn, n1: mu_lower_bound(fp, n0, fn, n1, a))
    fp, n0, fn, n1 = error_counts(ev_s, ev_c, t)
    epsilon, mu = gdp_epsilon_lower_bound(fp, n0, fn, n1, a, d)
    out.append(AuditBound(GAUSSIAN_DP, epsilon, False, threshold=t, mu=mu,
                          fpr_upper=upper_bound(fp, n0, a / 2),
                          fnr_upper=upper_bound(fn, n1, a / 2), **common))  # type: ignore[arg-type]

    lower, upper = (np.nextafter(fixed, -np.inf), fixed) if fixed is not None else \
        best_threshold_pair(cal_s, cal_c, lambda m, r, v: one_run_epsilon(m, r, v, a, d))
    guesses, correct = guess_counts(ev_s, ev_c, lower, upper)
    out.append(AuditBound(ONE_RUN, one_run_epsilon(ev_s.size, guesses, correct, a, d), False,
                          threshold=upper, lower_threshold=None if math.isinf(lower) else lower,
                          guesses=guesses, correct=correct, **common))  # type: ignore[arg-type]

    estimate = one_shot_estimate(scores, coins, d)
    if estimate is not None:
        out.append(AuditBound(ONE_SHOT, estimate, True, confidence=None,
                              trials_in=int(coins.sum()), trials_out=int((~coins).sum()),
                              delta=d, canary=settings.canary,
                              threat_model=settings.threat_model,
                              threshold_rule="none: Gaussians fitted to the canary-in and "
                                             "canary-out scores of every trial"))
    return out


def one_shot_estimate(scores: np.ndarray, coins: np.ndarray, delta: float) -> float | None:
    """ε at δ between Gaussians fitted to the canary-out and canary-in scores (Andrew et al.
    2024); None when δ = 0 or either side has fewer than two trials or no spread."""
    inside, outside = scores[coins], scores[~coins]
    if delta <= 0 or inside.size < 2 or outside.size < 2:
        return None
    s_in, s_out = float(inside.std(ddof=1)), float(outside.std(ddof=1))
    if not (s_in > 0 and s_out > 0):
        return None
    return epsilon_two_gaussians(float(outside.mean()), s_out, float(inside.mean()), s_in, delta)


@dataclass(frozen=True)
class ScoreHistogram:
    """Counts of canary-in and canary-out scores in shared bins (``edges`` has one more)."""

    edges: list[float]
    canary_in: list[int]
    canary_out: list[int]


def score_histogram(scores: np.ndarray, coins: np.ndarray, bins: int = 40) -> ScoreHistogram:
    """The two hypotheses' score histograms over shared bins."""
    scores, coins = np.asarray(scores, dtype=float), np.asarray(coins, dtype=bool)
    edges = np.histogram_bin_edges(scores, bins=bins) if scores.size else np.linspace(0, 1, 2)
    return ScoreHistogram([float(e) for e in edges],
                          [int(c) for c in np.histogram(scores[coins], edges)[0]],
                          [int(c) for c in np.histogram(scores[~coins], edges)[0]])
