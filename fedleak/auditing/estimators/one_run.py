"""One-run audit bound of Steinke, Nasr & Jagielski 2023.

The one-run bound of Steinke, Nasr & Jagielski 2023, "Privacy Auditing with One (1) Training Run"
(arXiv 2305.08846).

m canaries are each included independently with probability ½ (coins S_i ∈ {in, out}); the
auditor sees the output, guesses "in" for some canaries, "out" for others and abstains on the
rest: r guesses, W of them correct. If the mechanism is ε-DP in every single canary, W is
stochastically dominated by Binomial(r, q) with q = e^ε / (1 + e^ε), the accuracy of ε-DP
randomised response (Theorem 3.1). With δ > 0 (Theorem 5.2, their Algorithm's p-value),

    P[W ≥ v] ≤ P[W' ≥ v] + 2 m δ · max_{i = 1..v} P[v > W' ≥ v − i] / i,   W' ~ Binomial(r, q),

so observing v correct guesses rejects "(ε, δ)-DP" at level p whenever that right-hand side is
below p. ε_LB is the largest such ε (found by bisection: the right-hand side grows with ε),
holding with confidence 1 − p. The guesses may be any function of the output that does not
look at the coins; fedleak guesses "in" above one threshold and "out" below another, both
chosen on held-out trials.

The coins must be independent fair coins, and each canary's inclusion must be what the claim
covers (one example for DP-SGD, one user for client-level DP). It holds as well when every
canary gets its own run — fedleak's trials — where it is a looser but assumption-light cousin
of the per-trial Clopper–Pearson bound. With δ = 0 and every guess right, q^r = p gives
ε_LB = ln(q / (1 − q)) at q = p^(1/r): 100 right guesses at 95 % give ε_LB ≈ 3.49.
"""

from __future__ import annotations

import math

import numpy as np


def p_value(epsilon: float, delta: float, canaries: int, guesses: int, correct: int) -> float:
    """Return the right-hand side of Theorem 5.2.

    How likely ≥ ``correct`` right guesses are under (ε, δ)-DP (capped at 1).
    """
    from scipy.stats import binom

    if not 0 <= correct <= guesses <= canaries:
        raise ValueError(f"need 0 <= correct ({correct}) <= guesses ({guesses}) <= canaries "
                         f"({canaries})")
    q = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(binom.sf(correct - 1, guesses, q))  # P[W' >= v]
    if delta > 0 and correct > 0:
        i = np.arange(1, correct + 1)
        window = np.cumsum(binom.pmf(correct - i, guesses, q))  # P[v > W' >= v - i]
        tail += 2 * canaries * delta * float(np.max(window / i))
    return min(tail, 1.0)


def one_run_epsilon(canaries: int, guesses: int, correct: int, alpha: float, delta: float,
                    precision: float = 1e-6) -> float:
    """ε_LB: the largest ε whose p-value is below ``alpha`` (0 if none is)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if guesses == 0 or p_value(0.0, delta, canaries, guesses, correct) >= alpha:
        return 0.0
    low, high = 0.0, 1.0
    while p_value(high, delta, canaries, guesses, correct) < alpha:
        low, high = high, 2 * high
        if high > 1e3:  # never rejected: every ε would be refuted (cannot happen for r > 0)
            return math.inf
    while high - low > precision:
        middle = (low + high) / 2
        if p_value(middle, delta, canaries, guesses, correct) < alpha:
            low = middle
        else:
            high = middle
    return low
