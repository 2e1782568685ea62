"""Clopper–Pearson ε lower bound of a distinguishing game (Jagielski et al. 2020).

The Clopper–Pearson ε lower bound of a distinguishing game (Jagielski, Ullman & Oprea 2020,
"Auditing Differentially Private Machine Learning", arXiv 2006.07709, Sec. 3; Nasr et al. 2021,
"Adversary Instantiation", arXiv 2101.04535, Sec. 3).

If a mechanism M is (ε, δ)-DP, every test T of "canary in" against "canary out" satisfies

    P[T = in | in] ≤ e^ε · P[T = in | out] + δ,   i.e.   1 − FNR ≤ e^ε · FPR + δ,

and the same with the hypotheses swapped, 1 − FPR ≤ e^ε · FNR + δ. An observed test whose
rates are bounded above, FPR ≤ FPR_ub and FNR ≤ FNR_ub, therefore shows that M is not
(ε, δ)-DP for

    ε < ε_LB = max( ln((1 − δ − FNR_ub) / FPR_ub),  ln((1 − δ − FPR_ub) / FNR_ub) ),

clamped at 0. The upper bounds are exact (Clopper–Pearson 1934) one-sided binomial bounds,

    FPR_ub = sup { p : P[Binomial(n_out, p) ≤ FP] ≥ α/2 } = Beta⁻¹(1 − α/2; FP + 1, n_out − FP),

each at level α/2, so both hold together, and ε_LB holds, with confidence 1 − α (a union
bound). Example: 500 trials per hypothesis without a single error, α/2 = 0.5 % per side and
δ = 0 give FPR_ub = FNR_ub = 1 − 0.005^(1/500) ≈ 0.0105 and ε_LB ≈ 4.54 — the most 1,000
trials can ever certify at that confidence.
"""

from __future__ import annotations

import math


def upper_bound(successes: float, trials: int, alpha: float) -> float:
    """Return the one-sided Clopper–Pearson upper bound on a binomial rate.

    One-sided Clopper–Pearson upper bound on a binomial rate at confidence 1 − ``alpha``
    (``successes`` may be a predicted, non-integer count).
    """
    from scipy.stats import beta

    if trials <= 0:
        return 1.0
    if not 0 <= successes <= trials:
        raise ValueError(f"{successes} successes out of {trials} trials")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if successes == trials:
        return 1.0
    return float(beta.ppf(1 - alpha, successes + 1, trials - successes))


def epsilon_from_rates(fpr: float, fnr: float, delta: float) -> float:
    """max(ln((1 − δ − FNR)/FPR), ln((1 − δ − FPR)/FNR)), clamped at 0 (∞ at a zero rate)."""
    best = 0.0
    for a, b in ((fnr, fpr), (fpr, fnr)):
        numerator = 1 - delta - a
        if numerator <= 0:
            continue
        best = max(best, math.inf if b <= 0 else math.log(numerator / b))
    return best


def clopper_pearson_epsilon(false_positives: float, negatives: int, false_negatives: float,
                            positives: int, alpha: float, delta: float) -> float:
    """ε_LB of the module docstring at confidence 1 − ``alpha`` (each rate at α/2)."""
    fpr = upper_bound(false_positives, negatives, alpha / 2)
    fnr = upper_bound(false_negatives, positives, alpha / 2)
    return epsilon_from_rates(fpr, fnr, delta)
