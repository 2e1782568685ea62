"""What an audit reports: ε bounds per estimator and tests of the declaration.

What an audit reports: one :class:`AuditBound` per estimator (and group), each carrying everything a
figure needs to mean something — the estimator, ε, whether it is a bound or an estimate, its
confidence, the trials it was computed from, δ, the canary and the threat model — and one
:class:`DeclarationTest` per test of the declared mechanism, with its p-value, whether the
family-wise correction rejects it and the power it had.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

#: The built-in estimators, by the name every output uses (the registry,
#: :mod:`fedleak.auditing.estimator_registry`, holds them and any plug-in's).
CLOPPER_PEARSON = "clopper-pearson"
GAUSSIAN_DP = "gaussian-dp"
ONE_RUN = "one-run"
SUBSAMPLED_GAUSSIAN = "subsampled-gaussian"
GAUSSIAN_SCORES = "gaussian-scores"
SAMPLING = "sampling"
NOISE_LEVEL = "noise-level"
INTERFERENCE = "interference"
ONE_SHOT = "one-shot"
ESTIMATORS = (CLOPPER_PEARSON, GAUSSIAN_DP, ONE_RUN, SUBSAMPLED_GAUSSIAN, GAUSSIAN_SCORES,
              NOISE_LEVEL, INTERFERENCE, SAMPLING, ONE_SHOT)
#: Where each comes from.
REFERENCES = {
    CLOPPER_PEARSON: "Jagielski et al. 2020; Nasr et al. 2021",
    GAUSSIAN_DP: "Nasr et al. 2023 (Gaussian DP, Dong et al. 2019)",
    ONE_RUN: "Steinke, Nasr & Jagielski 2023",
    SUBSAMPLED_GAUSSIAN: "Dong, Roth & Su 2019 (Theorem 4.2); Nasr et al. 2023",
    GAUSSIAN_SCORES: "Nasr et al. 2023; Andrew et al. 2024; Steinke et al. 2023 (many canaries)",
    SAMPLING: "Chua et al. 2024 (shuffled batches accounted as Poisson)",
    NOISE_LEVEL: "a χ² test of the released coordinates' spread against the declared noise",
    INTERFERENCE: "per-example canaries clipped on their own do not interact",
    ONE_SHOT: "Andrew et al. 2024 (estimate, not a bound)",
}


@dataclass(frozen=True)
class AuditBound:
    """ε_LB of one estimator (or, when ``is_estimate``, an ε estimate with no guarantee).

    ``trials_in``/``trials_out`` count the trials the figure was computed from (canary in /
    out); ``threshold_rule`` says how the decision threshold was chosen without looking at
    those trials. The test guesses "canary in" when a score is at least ``threshold`` (and,
    for the one-run bound, "out" when it is at most ``lower_threshold``).
    """

    estimator: str
    epsilon: float
    is_estimate: bool
    confidence: float | None
    trials_in: int
    trials_out: int
    delta: float
    canary: str
    threat_model: str
    threshold_rule: str
    threshold: float | None = None
    lower_threshold: float | None = None
    fpr_upper: float | None = None
    fnr_upper: float | None = None
    mu: float | None = None
    guesses: int | None = None
    correct: int | None = None
    #: the parameter group the figure is about ("" for the primary canary's score)
    group: str = ""
    #: estimates: a two-sided interval at ``interval_level``, and what the figure assumes
    interval_low: float | None = None
    interval_high: float | None = None
    interval_level: float | None = None
    note: str = ""

    @property
    def reference(self) -> str:
        """Return the estimator's paper reference ('' when none is listed)."""
        return REFERENCES.get(self.estimator, "")

    def describe(self) -> str:
        """One line: ε, what it is, at what confidence, from how many trials."""
        kind = "estimate" if self.is_estimate else "lower bound"
        confidence = "" if self.confidence is None else \
            f" at {format_confidence(self.confidence)} confidence"
        interval = ""
        if self.interval_low is not None and self.interval_high is not None:
            interval = (f" [{format_epsilon(self.interval_low)}, "
                        f"{format_epsilon(self.interval_high)}]")
        group = f" ({self.group})" if self.group else ""
        return (f"{self.estimator}{group}: ε {format_epsilon(self.epsilon)}{interval} ({kind}"
                f"{confidence}, {self.trials_in} canary-in / {self.trials_out} canary-out "
                f"samples, δ = {self.delta:g})")

    def to_json(self) -> dict[str, Any]:
        """Return the bound as JSON data (non-finite figures as null, ε kept)."""
        data = dataclasses.asdict(self)
        data["reference"] = self.reference
        return {k: (None if isinstance(v, float) and not math.isfinite(v) and k != "epsilon"
                    else v) for k, v in data.items()}


def format_epsilon(epsilon: float | None) -> str:
    """ε for people: three significant figures, ∞, or – when absent."""
    if epsilon is None:
        return "–"
    if math.isinf(epsilon):
        return "∞"
    return f"{epsilon:.3g}"


def format_confidence(confidence: float) -> str:
    """95%, 99.99%: at most three decimals, rounded down (never overstating it)."""
    percent = math.floor(100 * confidence * 1000 + 1e-6) / 1000
    return f"{percent:.3f}".rstrip("0").rstrip(".") + "%"


@dataclass(frozen=True)
class DeclarationTest:
    """One test of the declared mechanism.

    Its p-value, whether the family-wise correction (Holm) rejects it — a violation — and, for
    noise-ratio tests, the ratio r̂ of how much better the canary is told apart than declared, its
    lower bound, and the smallest noise shortfall the test would have caught with ``power``.
    """

    test: str
    group: str
    p_value: float
    rejected: bool
    statement: str
    samples_in: int = 0
    samples_out: int = 0
    ratio: float | None = None
    ratio_lower: float | None = None
    detectable_noise: float | None = None
    power: float | None = None
    epsilon_lb: float | None = None
    level: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the test as JSON data (non-finite figures as null, ε and ratios kept)."""
        return {k: (None if isinstance(v, float) and not math.isfinite(v) and k not in
                    ("epsilon_lb", "ratio", "ratio_lower") else v)
                for k, v in dataclasses.asdict(self).items()}
