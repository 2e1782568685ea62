"""The verdict of an audit: every registered estimator run, their tests of the declaration
corrected for multiplicity, and what a verdict without a violation could have caught.

Each estimator returns ε figures and tests (:mod:`fedleak.auditing.estimator_registry`). With
m tests in all, each runs at the share α/m of the family-wise false-alarm rate α (the bounds
the tests rest on are recomputed at that level), and Holm's step-down procedure (Holm 1979)
rejects: sort the p-values, reject p₍ᵢ₎ ≤ α/(m − i + 1) until the first that is not. The
probability that a correct mechanism is called a violation is then at most α, however many
parameter groups were probed.

A verdict that finds no violation says what it could have caught: the noise shortfall each
noise-ratio test detects with the stated power (:func:`fedleak.auditing.noise_ratio.power`),
for the whole mechanism and for the weakest group. "Consistent" never stands alone.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from fedleak.auditing.declaration_estimators import POOLED
from fedleak.auditing.estimator_registry import Game, estimators
from fedleak.auditing.result import (
    GAUSSIAN_SCORES,
    AuditBound,
    DeclarationTest,
    format_confidence,
    format_epsilon,
)


def holm(p_values: list[float], alpha: float) -> list[bool]:
    """Holm's step-down rejections at family-wise level ``alpha``, in the input's order."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    m = len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] <= alpha / (m - rank):
            rejected[i] = True
        else:
            break
    return rejected


@dataclass(frozen=True)
class Evaluation:
    """Every estimator's figures and tests, and the family-wise decision."""

    bounds: list[AuditBound]
    tests: list[DeclarationTest]
    violation: bool
    false_alarm: float
    level: float

    @property
    def ratio_tests(self) -> list[DeclarationTest]:
        return [t for t in self.tests if t.test == GAUSSIAN_SCORES]

    def detectable_noise(self) -> float | None:
        """The shortfall the whole-mechanism test would catch (the pooled test, else the
        strongest single group's): noise below this factor of the declared std."""
        tests = self.ratio_tests
        if not tests:
            return None
        pooled = next((t for t in tests if t.group == POOLED), None)
        if pooled is not None:
            return pooled.detectable_noise
        return max(t.detectable_noise or 0.0 for t in tests)

    def weakest_group(self) -> DeclarationTest | None:
        """The group test with the least power (the smallest detectable shortfall factor)."""
        groups = [t for t in self.ratio_tests if t.group != POOLED]
        return min(groups, key=lambda t: t.detectable_noise or 0.0) if groups else None


def evaluate(game: Game) -> Evaluation:
    """Run every registered estimator on ``game`` and decide (module docstring)."""
    found = estimators()
    m = sum(e.tests(game) for e in found)
    level = game.false_alarm / max(m, 1)
    bounds: list[AuditBound] = []
    tests: list[DeclarationTest] = []
    for estimator in found:
        findings = estimator.run(game, level)
        bounds += findings.bounds
        tests += findings.tests
    rejected = holm([t.p_value for t in tests], game.false_alarm)
    tests = [dataclasses.replace(t, rejected=r) for t, r in zip(tests, rejected, strict=True)]
    return Evaluation(bounds, tests, any(rejected), game.false_alarm, level)


def power_statement(evaluation: Evaluation, power: float) -> str:
    """What a verdict without a violation could have caught, in one sentence."""
    whole = evaluation.detectable_noise()
    if whole is None:
        return ("its power is not stated: no noise-ratio test ran (no declared Gaussian "
                "mechanism for these canaries, or coverage off with a canary whose shift the "
                "declaration does not fix)")
    if whole <= 0:
        return (f"it had too few samples to catch any noise shortfall with {power:.0%} "
                "probability: run more trials (--detect-shortfall)")
    text = (f"it would have caught noise below {whole:.2f}× the declared std on the whole "
            f"mechanism with {power:.0%} probability at these trials")
    weakest = evaluation.weakest_group()
    if weakest is not None and weakest.group and len(evaluation.ratio_tests) > 1:
        factor = weakest.detectable_noise or 0.0
        what = f"below {factor:.2f}×" if factor > 0 else "no shortfall"
        text += f", and {what} in any single group (weakest: {weakest.group})"
    return text


def verdict_text(evaluation: Evaluation, claimed_epsilon: float, delta: float,
                 power: float) -> str:
    """The one-paragraph verdict (violation, no claim, or no violation with its power)."""
    bounds = [b for b in evaluation.bounds if not b.is_estimate]
    strongest = max(bounds, key=lambda b: b.epsilon) if bounds else None
    largest = (f"largest ε_LB {format_epsilon(strongest.epsilon)} ({strongest.estimator}"
               f"{', ' + strongest.group if strongest.group else ''})" if strongest else
               "no bound")
    alarm = f"false-alarm rate {evaluation.false_alarm:g}, Holm over {len(evaluation.tests)} tests"
    if evaluation.violation:
        first = min((t for t in evaluation.tests if t.rejected), key=lambda t: t.p_value)
        return (f"VIOLATION: {first.statement} (p = {first.p_value:.2g}; {alarm}): the "
                f"mechanism is not what the chain declares (claimed ε "
                f"{format_epsilon(claimed_epsilon)} at δ = {delta:g}); {largest}")
    if math.isinf(claimed_epsilon):
        return (f"no claim to test: the chain declares no DP for this canary; {largest} "
                "measures how far it is from private")
    above = strongest is not None and strongest.epsilon > claimed_epsilon * (1 + 1e-9)
    relation = (f"{largest} at {format_confidence(strongest.confidence or 0)} exceeds the "
                f"claimed ε {format_epsilon(claimed_epsilon)}, but not at the family-wise "
                "level: suspicious, rerun with more trials" if above and strongest else
                f"{largest} does not exceed the claimed ε {format_epsilon(claimed_epsilon)}")
    return (f"no violation found ({alarm}): {relation}; {power_statement(evaluation, power)}. "
            "A gap is a weak canary or a loose accountant, never more privacy")
