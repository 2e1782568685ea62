"""Choosing a test's threshold without touching the trials its bound is computed from.

A bound computed at the threshold that looks best on the same scores is biased upwards (the
maximum of many noisy bounds), so fedleak splits the trials at random before it looks: a
*calibration* share chooses the threshold, and the bound is computed on the other share only
(a held-out split; the coins are independent fair coins, so both shares are fair samples).
Each estimator chooses by its own criterion on the calibration share; candidates are the
midpoints between consecutive calibration scores. The distribution-free estimators
(Clopper–Pearson, one-run) maximise their own bound on the calibration trials; the
Gaussian-DP route, which assumes a Gaussian trade-off curve anyway, fits a Gaussian to each
hypothesis's calibration scores and takes the threshold whose *predicted* bound on the
evaluation share is largest (:func:`best_threshold_gaussian`) — smooth, so it does not chase
the calibration share's noise into the tails. The test is "score ≥ t ⇒ canary in":
scores are oriented so that larger means the canary more likely took part.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def candidate_thresholds(scores: np.ndarray, limit: int = 400) -> np.ndarray:
    """Return candidate thresholds between consecutive distinct scores.

    Midpoints between consecutive distinct scores (at most ``limit``, spread by rank), with one
    threshold below and one above them all.
    """
    values = np.unique(scores)
    if values.size == 0:
        return np.array([0.0])
    if values.size > limit + 1:
        values = values[np.unique(np.linspace(0, values.size - 1, limit + 1).round()
                                  .astype(int))]
    middles = (values[1:] + values[:-1]) / 2
    return np.concatenate([[values[0] - 1.0], middles, [values[-1] + 1.0]])


def error_counts(scores: np.ndarray, coins: np.ndarray, threshold: float) \
        -> tuple[int, int, int, int]:
    """Return the error counts of the test "score ≥ threshold ⇒ in".

    (false positives, canary-out trials, false negatives, canary-in trials) of the test "score ≥
    threshold ⇒ in".
    """
    guess_in = scores >= threshold
    return (int(np.sum(guess_in & ~coins)), int(np.sum(~coins)),
            int(np.sum(~guess_in & coins)), int(np.sum(coins)))


def best_threshold(scores: np.ndarray, coins: np.ndarray,
                   criterion: Callable[[int, int, int, int], float]) -> float:
    """Return the candidate threshold maximising ``criterion`` on these trials.

    The candidate threshold maximising ``criterion(FP, n_out, FN, n_in)`` on these trials (the
    calibration share); ties go to the lowest threshold, and when no candidate certifies anything,
    the midpoint between the two hypotheses' mean scores.
    """
    candidates = candidate_thresholds(scores)
    values = [criterion(*error_counts(scores, coins, float(t))) for t in candidates]
    return _chosen(candidates, values, scores, coins)


def _chosen(candidates: np.ndarray, values: list[float], scores: np.ndarray,
            coins: np.ndarray) -> float:
    if values and max(values) > 0:
        return float(candidates[int(np.argmax(values))])
    if coins.any() and (~coins).any():
        return float((scores[coins].mean() + scores[~coins].mean()) / 2)
    return float(np.median(scores)) if scores.size else 0.0


def best_threshold_gaussian(scores: np.ndarray, coins: np.ndarray, negatives: int,
                            positives: int,
                            criterion: Callable[[float, int, float, int], float]) -> float:
    """Return the threshold maximising ``criterion`` under fitted Gaussians.

    The candidate threshold maximising ``criterion(FP, n_out, FN, n_in)`` at the error counts that
    Gaussians fitted to these (calibration) trials predict for ``negatives`` canary-out and
    ``positives`` canary-in trials; :func:`best_threshold` when either side has fewer than two
    trials or no spread.
    """
    from scipy.stats import norm

    inside, outside = scores[coins], scores[~coins]
    if inside.size < 2 or outside.size < 2 or not (inside.std() > 0 and outside.std() > 0):
        return best_threshold(scores, coins, lambda fp, n0, fn, n1: criterion(fp, n0, fn, n1))
    candidates = candidate_thresholds(scores)
    fp = negatives * norm.sf(candidates, outside.mean(), outside.std(ddof=1))
    fn = positives * norm.cdf(candidates, inside.mean(), inside.std(ddof=1))
    values = [criterion(float(a), negatives, float(b), positives) for a, b in zip(fp, fn,
                                                                                   strict=True)]
    return _chosen(candidates, values, scores, coins)


def best_threshold_pair(scores: np.ndarray, coins: np.ndarray,
                        criterion: Callable[[int, int, int], float],
                        points: int = 12) -> tuple[float, float]:
    """Return the (lower, upper) thresholds of the three-way test.

    (lower, upper) thresholds maximising ``criterion(canaries, guesses, correct)`` for the three-way
    test "≥ upper ⇒ in, ≤ lower ⇒ out, abstain between" (the one-run bound's guesses), searched over
    a grid of score quantiles; lower = −∞ guesses no "out".
    """
    quantiles = np.quantile(scores, np.linspace(0, 1, points + 2)[1:-1]) if scores.size else \
        np.array([0.0])
    uppers = np.unique(quantiles)
    lowers = np.concatenate([[-np.inf], uppers])
    best, pair = -np.inf, (-np.inf, float(uppers[-1]))
    for upper in uppers:
        for lower in lowers[lowers < upper]:
            guesses, correct = guess_counts(scores, coins, float(lower), float(upper))
            value = criterion(scores.size, guesses, correct)
            if value > best:
                best, pair = value, (float(lower), float(upper))
    return pair


def guess_counts(scores: np.ndarray, coins: np.ndarray, lower: float, upper: float) \
        -> tuple[int, int]:
    """(guesses, correct guesses) of "≥ upper ⇒ in, ≤ lower ⇒ out, abstain between"."""
    guess_in, guess_out = scores >= upper, scores <= lower
    return (int(np.sum(guess_in | guess_out)),
            int(np.sum(guess_in & coins) + np.sum(guess_out & ~coins)))
