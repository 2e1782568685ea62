"""Gaussian-DP audit route of Nasr et al. 2023: μ from error rates, then ε at δ.

The Gaussian-DP route of Nasr et al. 2023 ("Tight Auditing of Differentially Private Machine
Learning", arXiv 2302.07956, Sec. 4): bound μ from the test's error rates, then read ε off the μ-GDP
trade-off curve at δ.

A mechanism is μ-GDP (Dong, Roth & Su 2019, "Gaussian Differential Privacy") when no test
tells neighbouring inputs apart better than one between N(0, 1) and N(μ, 1): every test with
false-positive rate α has false-negative rate at least Φ(Φ⁻¹(1 − α) − μ). A test observed with
FPR ≤ FPR_ub and FNR ≤ FNR_ub (Clopper–Pearson upper bounds, each at level α/2, so both hold
together with confidence 1 − α) therefore certifies

    μ ≥ μ_LB = Φ⁻¹(1 − FPR_ub) − Φ⁻¹(FNR_ub),

and since μ-GDP is exactly (ε, δ(ε))-DP for every ε ≥ 0 with (Dong et al., Corollary 2.13)

    δ(ε) = Φ(−ε/μ + μ/2) − e^ε · Φ(−ε/μ − μ/2),

the mechanism is not (ε, δ)-DP for any ε below ε(μ_LB, δ), the root of δ(ε) = δ. This
converts the two error rates through a one-parameter family instead of through the single
point ln((1 − δ − FNR)/FPR), which is why it needs far fewer trials than plain
Clopper–Pearson for mechanisms whose trade-off curve is Gaussian (DP-SGD, Gaussian noise).

Sharp edge: μ_LB is a bound on μ only if the mechanism's trade-off curve is (at least as
good as) some Gaussian one; ε(μ_LB) then lower-bounds ε. For mechanisms far from Gaussian
(pure ε-DP randomised response, Laplace) prefer the Clopper–Pearson estimator.
"""

from __future__ import annotations

import math

from fedleak.auditing.estimators.clopper_pearson import upper_bound


def delta_from_mu(epsilon: float, mu: float) -> float:
    """δ(ε) of μ-GDP: Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Dong et al. 2019, Cor. 2.13).

    Computed without e^ε: with t = ε/μ, e^ε φ(t + μ/2) = φ(t − μ/2) exactly, so the second
    term is φ(μ/2 − t) · R(t + μ/2) with R(x) = Φ(−x)/φ(x) = √(π/2) · erfcx(x/√2) the Mills
    ratio. Every factor stays finite for any ε and μ (the direct form overflows, or loses
    every digit to cancellation, once ε reaches a few hundred).
    """
    from scipy.special import erfcx
    from scipy.stats import norm

    if mu <= 0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    t = epsilon / mu
    mills = math.sqrt(math.pi / 2) * float(erfcx((t + mu / 2) / math.sqrt(2)))
    x = mu / 2 - t
    density = math.exp(-x * x / 2) / math.sqrt(2 * math.pi) if abs(x) < 40 else 0.0
    return max(0.0, float(norm.cdf(x)) - density * mills)


def epsilon_from_mu(mu: float, delta: float) -> float:
    """Return the smallest ε with μ-GDP ⊂ (ε, δ)-DP: the root of δ(ε) = δ (0 when δ(0) ≤ δ)."""
    from scipy.optimize import brentq

    if not 0 <= delta < 1:
        raise ValueError(f"delta must lie in [0, 1), got {delta}")
    if mu <= 0:
        return 0.0
    if math.isinf(mu) or delta == 0:
        return math.inf
    if delta_from_mu(0.0, mu) <= delta:
        return 0.0
    high = 1.0
    while delta_from_mu(high, mu) > delta:
        high *= 2
        if math.isinf(high):  # μ past ~1e154: ε ≈ μ²/2 is beyond a float
            return math.inf
    return float(brentq(lambda e: delta_from_mu(e, mu) - delta, 0.0, high, xtol=1e-12))


def mu_from_epsilon(epsilon: float, delta: float) -> float:
    """Return the μ whose (ε, δ) curve passes through (``epsilon``, ``delta``).

    Inverse of :func:`epsilon_from_mu` in μ.
    """
    from scipy.optimize import brentq

    if epsilon <= 0:
        return 0.0
    high = 1.0
    while epsilon_from_mu(high, delta) < epsilon:
        high *= 2
    return float(brentq(lambda m: epsilon_from_mu(m, delta) - epsilon, 1e-9, high, xtol=1e-12))


def mu_lower_bound(false_positives: float, negatives: int, false_negatives: float,
                   positives: int, alpha: float) -> float:
    """μ_LB = Φ⁻¹(1 − FPR_ub) − Φ⁻¹(FNR_ub), both rates bounded at α/2 (0 if negative)."""
    from scipy.stats import norm

    fpr = upper_bound(false_positives, negatives, alpha / 2)
    fnr = upper_bound(false_negatives, positives, alpha / 2)
    return max(0.0, float(norm.ppf(1 - fpr) - norm.ppf(fnr)))


def gdp_epsilon_lower_bound(false_positives: int, negatives: int, false_negatives: int,
                            positives: int, alpha: float, delta: float) -> tuple[float, float]:
    """(ε_LB, μ_LB) of the Gaussian-DP route at confidence 1 − ``alpha``."""
    mu = mu_lower_bound(false_positives, negatives, false_negatives, positives, alpha)
    return epsilon_from_mu(mu, delta), mu
