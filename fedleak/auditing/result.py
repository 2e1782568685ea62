"""What an audit reports: one :class:`AuditBound` per estimator, each carrying everything a
figure needs to mean something — the estimator, ε, whether it is a bound or an estimate, its
confidence, the trials it was computed from, δ, the canary and the threat model."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

#: The estimators, by the name every output uses.
CLOPPER_PEARSON = "clopper-pearson"
GAUSSIAN_DP = "gaussian-dp"
ONE_RUN = "one-run"
ONE_SHOT = "one-shot"
ESTIMATORS = (CLOPPER_PEARSON, GAUSSIAN_DP, ONE_RUN, ONE_SHOT)
#: Where each comes from.
REFERENCES = {
    CLOPPER_PEARSON: "Jagielski et al. 2020; Nasr et al. 2021",
    GAUSSIAN_DP: "Nasr et al. 2023 (Gaussian DP, Dong et al. 2019)",
    ONE_RUN: "Steinke, Nasr & Jagielski 2023",
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

    @property
    def reference(self) -> str:
        return REFERENCES.get(self.estimator, "")

    def describe(self) -> str:
        """One line: ε, what it is, at what confidence, from how many trials."""
        kind = "estimate" if self.is_estimate else "lower bound"
        confidence = "" if self.confidence is None else f" at {self.confidence:.0%} confidence"
        return (f"{self.estimator}: ε {format_epsilon(self.epsilon)} ({kind}{confidence}, "
                f"{self.trials_in} canary-in / {self.trials_out} canary-out trials, "
                f"δ = {self.delta:g})")

    def to_json(self) -> dict[str, Any]:
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
