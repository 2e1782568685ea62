"""Verdict of an audit: estimators, corrected tests, and what could have been caught.

The verdict of an audit: every registered estimator run, their tests of the declaration corrected
for multiplicity, and what a verdict without a violation could have caught.

Each estimator returns ε figures and tests (:mod:`fedleak.auditing.estimator_registry`). With
m tests in all, each runs at the share α/m of the family-wise false-alarm rate α (the bounds
the tests rest on are recomputed at that level), and Holm's step-down procedure (Holm 1979)
rejects: sort the p-values, reject p₍ᵢ₎ ≤ α/(m − i + 1) until the first that is not. The
probability that a correct mechanism is called a violation is then at most α, however many
parameter groups were probed.

A verdict that finds no violation says what it could have caught: the noise shortfall each
noise-ratio test detects with the stated power
(:func:`fedleak.auditing.estimators.noise_ratio.power`), for the whole mechanism and for the weakest
group. "Consistent" never stands alone.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from fedleak.auditing.estimator_registry import (
    BUILTIN_ORDER,
    ESTIMATOR_REGISTRY,
    Estimator,
    Game,
)
from fedleak.auditing.estimators import primary  # noqa: F401  (registers the built-ins)
from fedleak.auditing.estimators.declared_mechanism import POOLED
from fedleak.auditing.result import (
    GAUSSIAN_SCORES,
    NOISE_LEVEL,
    AuditBound,
    DeclarationTest,
    format_confidence,
    format_epsilon,
)


def estimator_names() -> tuple[str, ...]:
    """Every registered estimator, in the order they report (built-ins first)."""
    names = ESTIMATOR_REGISTRY.names()
    builtin = [n for n in BUILTIN_ORDER if n in names]
    return tuple(builtin + [n for n in names if n not in builtin])


def estimators() -> list[Estimator]:
    """One default-configured instance of every registered estimator."""
    return [ESTIMATOR_REGISTRY.create(name) for name in estimator_names()]


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
        """Return the noise-ratio tests."""
        return [t for t in self.tests if t.test == GAUSSIAN_SCORES]

    @property
    def noise_tests(self) -> list[DeclarationTest]:
        """Return the χ² noise-level tests."""
        return [t for t in self.tests if t.test == NOISE_LEVEL]

    def detectable_noise(self) -> float | None:
        """Return the noise shortfall the whole-mechanism tests catch with the stated power.

        Noise below this factor of the declared std (the noise-level test's where it ran, else the
        noise-ratio test's).
        """
        for tests in (self.noise_tests, self.ratio_tests):
            if tests:
                whole = _whole(tests)
                return whole.detectable_noise if whole is not None else None
        return None

    def detectable_ratio(self) -> float | None:
        """Return the detectable shortfall of the whole-mechanism noise-ratio test.

        How much better than declared the canary must be told apart, by any cause, for the
        whole-mechanism noise-ratio test to catch it with the stated power (∞: never).
        """
        whole = _whole(self.ratio_tests)
        if whole is None or whole.detectable_noise is None:
            return None
        return math.inf if whole.detectable_noise <= 0 else 1 / whole.detectable_noise


def _whole(tests: list[DeclarationTest]) -> DeclarationTest | None:
    """Return the pooled test, else the most powerful single one."""
    if not tests:
        return None
    pooled = next((t for t in tests if t.group == POOLED), None)
    return pooled or max(tests, key=lambda t: t.detectable_noise or 0.0)


def _weakest(tests: list[DeclarationTest]) -> DeclarationTest | None:
    groups = [t for t in tests if t.group != POOLED]
    return min(groups, key=lambda t: t.detectable_noise or 0.0) if len(groups) > 1 else None


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
    """Return what a verdict without a violation could have caught, in one sentence."""
    parts = []
    noise = _whole(evaluation.noise_tests)
    if noise is not None and noise.detectable_noise:
        text = f"noise below {noise.detectable_noise:.3f}× the declared std"
        weakest = _weakest(evaluation.noise_tests)
        if weakest is not None and weakest.detectable_noise:
            text += (f" (below {weakest.detectable_noise:.3f}× in any single tensor; weakest: "
                     f"{weakest.group})")
        parts.append(text)
    ratio = evaluation.detectable_ratio()
    if ratio is not None and math.isfinite(ratio):
        text = (f"a mechanism that tells the canaries apart {ratio:.2f}× better than declared, "
                f"whatever the cause (noise {1 / ratio:.2f}× short, a looser or wrongly shaped "
                "clip, other sampling)")
        weakest = _weakest(evaluation.ratio_tests)
        if weakest is not None and weakest.detectable_noise:
            text += (f", {1 / weakest.detectable_noise:.2f}× in any single group (weakest: "
                     f"{weakest.group})")
        parts.append(text)
    if not parts:
        return ("its power is not stated: no declaration test ran (the chain declares no "
                "Gaussian mechanism for this canary, or coverage is off with a canary whose "
                "shift the declaration does not fix)")
    return (f"it would have caught {'; and '.join(parts)}; each with {power:.0%} probability "
            "at these trials")


def verdict_text(evaluation: Evaluation, claimed_epsilon: float, delta: float,
                 power: float) -> str:
    """Return the one-paragraph verdict (violation, no claim, or no violation with its power)."""
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
