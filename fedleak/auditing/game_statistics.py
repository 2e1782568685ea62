"""A success rate measured over repeated trials, with its exact confidence interval.

k successes in n independent trials of one game estimate its success probability p by k/n;
the Clopper–Pearson interval (Clopper & Pearson 1934) at level 1 − α is

    [B⁻¹(α/2; k, n − k + 1),  B⁻¹(1 − α/2; k + 1, n − k)]

with B⁻¹ the Beta quantile (lower end 0 when k = 0, upper end 1 when k = n). It is exact
(conservative): it covers p with probability at least 1 − α for every p. A measured rate
"exceeds a bound beyond its interval" when the interval's lower end lies above the bound.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SuccessRate:
    """k of n trials succeeded; the rate and its Clopper–Pearson interval."""

    successes: int
    trials: int
    low: float
    high: float
    confidence: float

    @property
    def rate(self) -> float:
        """Return the observed rate successes / trials (0 without trials)."""
        return self.successes / self.trials if self.trials else 0.0

    def describe(self) -> str:
        """Describe the rate and its Clopper–Pearson interval in one line."""
        return (f"{self.successes}/{self.trials} = {self.rate:.3f} "
                f"[{self.low:.3f}, {self.high:.3f}] ({self.confidence:.0%} Clopper–Pearson)")


def success_rate(successes: int, trials: int, confidence: float = 0.95) -> SuccessRate:
    """Return the Clopper–Pearson interval of ``successes`` in ``trials`` at ``confidence``."""
    if trials < 0 or not 0 <= successes <= max(trials, 0):
        raise ValueError(f"need 0 <= successes <= trials, got {successes} of {trials}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if trials == 0:
        return SuccessRate(0, 0, 0.0, 1.0, confidence)
    from scipy.stats import beta  # here, not at import: every attacker process imports this

    alpha = 1 - confidence
    low = 0.0 if successes == 0 else float(beta.ppf(alpha / 2, successes,
                                                     trials - successes + 1))
    high = 1.0 if successes == trials else float(beta.ppf(1 - alpha / 2, successes + 1,
                                                          trials - successes))
    return SuccessRate(successes, trials, low, high, confidence)
