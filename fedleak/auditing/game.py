"""The distinguishing game's statistics.

From per-trial scores and the secret coins to an ε lower bound by every registered estimator.

Trial i flips a fair coin b_i and runs the mechanism with the canary (b_i = 1) or without it;
the auditor, who never sees b_i, submits one score s_i per trial, larger meaning "the canary
was in". The holder of the coins then

1. splits the trials at random into a calibration share and an evaluation share
   (:mod:`fedleak.auditing.thresholds`: the threshold is never chosen on the trials the bound
   is computed from) — unless the auditor *declared* its threshold before the first trial
   (from public knowledge, e.g. half the shift the canary is expected to cause), in which
   case no trial is spent on choosing it and every trial is evaluated;
2. runs every registered estimator (:mod:`fedleak.auditing.estimator_registry`): the bounds of
   the primary scores (:mod:`fedleak.auditing.estimators.primary`), the tests of the declared
   mechanism over many canaries (:mod:`fedleak.auditing.estimators.declared_mechanism`), and the
   one-shot estimate — an estimate, not a bound, reported with its interval;
3. decides with a family-wise false-alarm rate (:mod:`fedleak.auditing.verdict`).

Every :class:`~fedleak.auditing.result.AuditBound` says what it is and how it was made.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedleak.auditing.estimator_registry import Game, GameSettings
from fedleak.auditing.estimators.primary import one_shot_interval
from fedleak.auditing.result import AuditBound
from fedleak.auditing.verdict import evaluate

__all__ = ["GameSettings", "ScoreHistogram", "audit_bounds", "calibration_split",
           "one_shot_estimate", "score_histogram"]


def calibration_split(trials: int, fraction: float, generator: np.random.Generator) \
        -> np.ndarray:
    """Return a random mask of ⌊fraction · trials⌋ calibration trials (the rest are evaluated)."""
    if not 0 < fraction < 1:
        raise ValueError(f"the calibration fraction must lie in (0, 1), got {fraction}")
    mask = np.zeros(trials, dtype=bool)
    mask[generator.permutation(trials)[: int(fraction * trials)]] = True
    return mask


def checked_game(scores: np.ndarray, coins: np.ndarray, calibration: np.ndarray,
                 settings: GameSettings, declared_threshold: float | None = None) -> Game:
    """Return a :class:`Game` of the primary scores, its inputs checked."""
    scores, coins = np.asarray(scores, dtype=float), np.asarray(coins, dtype=bool)
    calibration = np.asarray(calibration, dtype=bool)
    if not scores.shape == coins.shape == calibration.shape or scores.ndim != 1:
        raise ValueError("scores, coins and the calibration mask must be equally long vectors")
    if not np.isfinite(scores).all():
        raise ValueError("scores must be finite")
    if declared_threshold is not None and not math.isfinite(declared_threshold):
        raise ValueError("a declared threshold must be finite")
    return Game(scores, coins, calibration, settings, declared_threshold)


def audit_bounds(scores: np.ndarray, coins: np.ndarray, calibration: np.ndarray,
                 settings: GameSettings, declared_threshold: float | None = None) \
        -> list[AuditBound]:
    """Return every estimator's figure for these trials of the primary canary.

    Every estimator's figure for these trials of the primary canary, without a claim or streams (see
    the module docstring; :func:`fedleak.auditing.verdict.evaluate` for the whole audit). With
    ``declared_threshold`` (fixed before any trial ran) the calibration mask is ignored: every
    estimator tests "score ≥ threshold" on every trial.
    """
    return evaluate(checked_game(scores, coins, calibration, settings,
                                 declared_threshold)).bounds


def one_shot_estimate(scores: np.ndarray, coins: np.ndarray, delta: float) -> float | None:
    """Return the one-shot estimate alone (bias-corrected; None when it cannot be fitted)."""
    found = one_shot_interval(np.asarray(scores, float), np.asarray(coins, bool), delta, 0.95)
    return None if found is None else found[0]


@dataclass(frozen=True)
class ScoreHistogram:
    """Counts of canary-in and canary-out scores in shared bins (``edges`` has one more)."""

    edges: list[float]
    canary_in: list[int]
    canary_out: list[int]


def score_histogram(scores: np.ndarray, coins: np.ndarray, bins: int = 40) -> ScoreHistogram:
    """Return the two hypotheses' score histograms over shared bins."""
    scores, coins = np.asarray(scores, dtype=float), np.asarray(coins, dtype=bool)
    edges = np.histogram_bin_edges(scores, bins=bins) if scores.size else np.linspace(0, 1, 2)
    return ScoreHistogram([float(e) for e in edges],
                          [int(c) for c in np.histogram(scores[coins], edges)[0]],
                          [int(c) for c in np.histogram(scores[~coins], edges)[0]])
