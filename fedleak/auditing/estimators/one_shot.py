"""One-shot empirical privacy estimate of Andrew et al. 2024 (ICLR 2024).

The one-shot empirical privacy *estimate* of Andrew et al. 2024, "One-shot Empirical Privacy
Estimation for Federated Learning" (ICLR 2024, arXiv 2302.03098).

Canary clients send updates along random unit directions c_i ∈ R^d. After training, the
statistic of canary i is the cosine of c_i with the final model delta. An *unobserved* canary
(one that never took part) is a random direction independent of the delta, so its cosine
follows the exact null of Sec. 4,

    T² ~ Beta(½, (d − 1)/2),   density ∝ (1 − t²)^((d − 3)/2),   ≈ N(0, 1/d) for large d,

and the observed canaries' cosines are fitted by a Gaussian N(μ̂, σ̂²). The estimate is the ε
at δ of the pair (null, fit): for two Gaussians P = N(μ₁, σ₁²), Q = N(μ₂, σ₂²) exactly

    δ(ε) = max over the two orders of  P(A) − e^ε Q(A),   A = { x : ln p(x) − ln q(x) > ε },

A being one or two half-lines cut by the roots of a quadratic (Steinke 2022, "Composition of
Differential Privacy & Privacy Amplification by Subsampling", Sec. 5). fedleak's trials carry
both observed (canary in) and unobserved (canary out) scores, so the game fits a Gaussian to
each; :func:`one_shot_epsilon` is the paper's form with the closed-form null.

This is an **estimate, not a bound**: it assumes both score distributions are Gaussian and
uses no confidence interval. Andrew et al. also sweep a threshold over the observed
statistics with Jeffreys intervals (:func:`jeffreys_threshold_epsilon`,
:func:`jeffreys_null_epsilon`); choosing the threshold on the scores it is evaluated on makes
that an estimate too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.optimize import brentq, minimize_scalar
from scipy.special import betainc, logsumexp
from scipy.stats import beta, norm

#: From this dimension on the cosine null is its Gaussian approximation N(0, 1/d).
GAUSSIAN_NULL_DIM = 1000


def _log_mass(kind: str, low: float, high: float, mean: float, std: float) -> float:
    """Return log P(X ∈ region) for X ~ N(mean, std²).

    log P(X ∈ region) for X ~ N(mean, std²): ``outside`` (−∞, low) ∪ (high, ∞) or ``inside`` (low,
    high), computed in log space.
    """
    a, b = (low - mean) / std, (high - mean) / std
    if kind == "outside":
        return float(np.logaddexp(norm.logcdf(a), norm.logsf(b)))
    if a >= 0:  # both in the right tail: difference of survival functions
        return float(logsumexp([norm.logsf(a), norm.logsf(b)], b=[1, -1]))
    return float(logsumexp([norm.logcdf(b), norm.logcdf(a)], b=[1, -1]))


def _log_delta(m1: float, s1: float, m2: float, s2: float, epsilon: float) -> float:
    """Return log of P(A) − e^ε Q(A) for P = N(m1, s1²), Q = N(m2, s2²) (−∞ when not positive)."""
    a = 0.5 / s2**2 - 0.5 / s1**2
    b = m1 / s1**2 - m2 / s2**2
    c = m2**2 / (2 * s2**2) - m1**2 / (2 * s1**2) + math.log(s2 / s1)
    if a == 0:  # equal variances: A is a half-line (or nothing)
        if b == 0:
            return -math.inf
        cut = (epsilon - c) / b
        log_p = norm.logsf(cut, m1, s1) if b > 0 else norm.logcdf(cut, m1, s1)
        log_q = norm.logsf(cut, m2, s2) if b > 0 else norm.logcdf(cut, m2, s2)
    else:
        discriminant = b * b - 4 * a * (c - epsilon)
        if discriminant <= 0:
            return -math.inf  # A is empty, or everything (and then δ = 1 − e^ε ≤ 0)
        root = math.sqrt(discriminant)
        low, high = sorted(((-b - root) / (2 * a), (-b + root) / (2 * a)))
        kind = "outside" if a > 0 else "inside"
        log_p = _log_mass(kind, low, high, m1, s1)
        log_q = _log_mass(kind, low, high, m2, s2)
    gap = epsilon + log_q - log_p
    if not gap < 0:
        return -math.inf
    return float(log_p + math.log1p(-math.exp(gap)))


def epsilon_two_gaussians(m1: float, s1: float, m2: float, s2: float, delta: float) -> float:
    """Return the exact ε at ``delta`` of telling N(m1, s1²) and N(m2, s2²) apart (both orders)."""
    if not (s1 > 0 and s2 > 0):
        raise ValueError(f"standard deviations must be positive, got {s1} and {s2}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")

    def log_delta(e: float) -> float:
        return max(_log_delta(m1, s1, m2, s2, e), _log_delta(m2, s2, m1, s1, e))

    target = math.log(delta)
    if log_delta(0.0) <= target:
        return 0.0
    low, high = 0.0, 1.0
    while log_delta(high) > target:
        low, high = high, 2 * high
        if high > 1e4:
            return math.inf
    return float(brentq(lambda e: log_delta(e) - target, low, high, xtol=1e-12))


class CosineNull:
    """The cosine of a uniformly random unit vector in R^d with a fixed one (Andrew et al., Sec. 4).

    T² ~ Beta(½, (d − 1)/2), symmetric about 0; N(0, 1/d) from d = 1000 on.
    """

    def __init__(self, dim: int) -> None:
        if dim < 2:
            raise ValueError(f"the dimension must be >= 2, got {dim}")
        self.dim = dim

    def log_sf(self, t: float) -> float:
        """Return log P(T > t)."""
        if self.dim >= GAUSSIAN_NULL_DIM:
            return float(norm.logsf(t, scale=self.dim ** -0.5))
        if t >= 1:
            return -math.inf
        if t <= -1:
            return 0.0
        tail = 0.5 * (1 - float(betainc(0.5, (self.dim - 1) / 2, t * t)))  # P(T > |t|)
        if t < 0:
            return math.log1p(-tail)
        return math.log(tail) if tail > 0 else -math.inf

    def ppf(self, p: float) -> float:
        """Return the p-quantile."""
        return float(brentq(lambda t: -math.expm1(self.log_sf(t)) - p, -1 + 1e-15, 1 - 1e-15))


def _epsilon_from_log_rates(log_fpr: float, fnr: float, delta: float) -> float:
    """max(ln(1 − δ − FNR) − ln FPR, ln(1 − δ − FPR) − ln FNR), clamped at 0."""
    best = 0.0
    if 1 - delta - fnr > 0:
        best = max(best, math.log(1 - delta - fnr) - log_fpr)
    fpr = math.exp(log_fpr)
    if 1 - delta - fpr > 0 and fnr > 0:
        best = max(best, math.log(1 - delta - fpr) - math.log(fnr))
    return best


def epsilon_gaussian_alternative(mean: float, std: float, dim: int, delta: float) -> float:
    """Return ε at δ of the cosine null in R^``dim`` against N(mean, std²).

    ε at δ of the cosine null in R^``dim`` against N(mean, std²) (Andrew et al.'s estimate from a
    Gaussian fit to the observed canaries' cosines).
    """
    if dim >= GAUSSIAN_NULL_DIM:
        return epsilon_two_gaussians(0.0, dim ** -0.5, mean, std, delta)
    if mean <= 0:
        raise ValueError(f"the observed canaries' mean cosine must be positive, got {mean}")
    null = CosineNull(dim)

    def epsilon_at(t: float) -> float:  # test "cosine > t"
        return _epsilon_from_log_rates(null.log_sf(t), float(norm.cdf(t, mean, std)), delta)

    grid = np.linspace(null.ppf(delta), float(norm.ppf(1 - delta, mean, std)), 2001)
    values = [epsilon_at(float(t)) for t in grid]
    best = int(np.argmax(values))
    low, high = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    refined = minimize_scalar(lambda t: -epsilon_at(t), bounds=(low, high), method="bounded",
                              options={"xatol": 1e-12})
    return max(values[best], -float(refined.fun))


def one_shot_epsilon(observed_cosines: Sequence[float], dim: int, delta: float) -> float:
    """Andrew et al.'s one-shot estimate.

    a Gaussian fitted to the observed canaries' cosines (mean, unbiased std) against the closed-form
    null in R^``dim``.
    """
    values = np.asarray(observed_cosines, dtype=float)
    if values.size < 2:
        raise ValueError("the estimate needs at least two observed canaries")
    return epsilon_gaussian_alternative(float(values.mean()), float(values.std(ddof=1)), dim,
                                        delta)


def _jeffreys_upper(successes: np.ndarray, trials: int, alpha: float) -> np.ndarray:
    """Jeffreys one-sided upper bound: the (1 − α) quantile of Beta(k + ½, n − k + ½)."""
    return np.asarray(beta.ppf(1 - alpha, successes + 0.5, trials - successes + 0.5))


def jeffreys_threshold_epsilon(seen: Sequence[float], unseen: Sequence[float], alpha: float,
                               delta: float) -> float:
    """Return the largest ε over every threshold, rates bounded with Jeffreys intervals.

    The largest ε over every threshold between the pooled statistics, rates bounded with Jeffreys
    intervals at level ``alpha`` (Andrew et al.'s ``optimal_epsilon_lower_bound``). The threshold is
    chosen on the same statistics: an estimate.
    """
    observed, null = np.asarray(seen, float), np.asarray(unseen, float)
    labels = np.concatenate([np.ones(observed.size), np.zeros(null.size)])
    order = np.lexsort((labels, np.concatenate([observed, null])))  # ties: unseen first
    sorted_labels = labels[order]
    false_negatives = np.concatenate([[0], np.cumsum(sorted_labels)])
    false_positives = null.size - np.concatenate([[0], np.cumsum(1 - sorted_labels)])
    fprs = _jeffreys_upper(false_positives, null.size, alpha)
    fnrs = _jeffreys_upper(false_negatives, observed.size, alpha)
    return max(_epsilon_from_log_rates(math.log(fpr), float(fnr), delta)
               for fpr, fnr in zip(fprs, fnrs, strict=True))


def jeffreys_null_epsilon(seen_cosines: Sequence[float], dim: int, alpha: float,
                          delta: float) -> float:
    """Return the Jeffreys threshold ε with the closed-form cosine null.

    As :func:`jeffreys_threshold_epsilon` with the closed-form cosine null for the false positives
    (Andrew et al.'s ``optimal_epsilon_lower_bound_closed_form_null``): thresholds at the observed
    cosines, the one at t not counted as a false negative.
    """
    thresholds = np.sort(np.asarray(seen_cosines, float))
    null = CosineNull(dim)
    fnrs = _jeffreys_upper(np.arange(thresholds.size), thresholds.size, alpha)
    return max(_epsilon_from_log_rates(null.log_sf(float(t)), float(fnr), delta)
               for t, fnr in zip(thresholds, fnrs, strict=True))
