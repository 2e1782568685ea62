"""What the server asks of the audit game (``BeginAuditRequest`` without its tensors), with
the victim's defaults filled in and every value checked (:meth:`AuditRequest.checked`): the
canary's kind and direction, the trials, δ, the confidence and the threshold rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedleak.auditing.canaries import (
    CANARY_KINDS,
    CLIENT,
    DIRAC,
    DIRECTIONS,
    GRADIENT,
    INPUT,
    RANDOM,
)
from fedleak.harness.wire.quoting import quoted
from fedleak.harness.wire.request_errors import InvalidArgument

THRESHOLD_RULES = ("split", "half-shift", "declared")
DEFAULT_CALIBRATION = 0.2
DEFAULT_CONFIDENCE = 0.95


@dataclass(frozen=True)
class AuditRequest:
    """What the server asks for (``BeginAuditRequest`` without the tensors); 0/empty = default."""

    canary: str = GRADIENT
    direction: str = ""
    seed: int = 0
    norm: float = 0.0
    coordinate: int | None = None
    trials: int = 0
    delta: float = 0.0
    confidence: float = 0.0
    threshold_rule: str = ""
    threshold: float = 0.0
    calibration_fraction: float = 0.0

    def checked(self, max_trials: int, secagg: bool) -> AuditRequest:
        """The request with defaults filled in; ``InvalidArgument`` names what to change."""
        canary = self.canary or GRADIENT
        if canary not in CANARY_KINDS:
            raise InvalidArgument(f"canary {quoted(canary)} is unknown; use one of "
                                  f"{', '.join(CANARY_KINDS)}")
        if canary == CLIENT and not secagg:
            raise InvalidArgument("a canary client is an extra user of a secure-aggregation "
                                  "round: this victim has one user; use canary gradient or "
                                  "input, or start it with --users K --defense secagg")
        direction = self.direction or (RANDOM if canary == CLIENT else DIRAC)
        if canary == INPUT:
            direction = ""
        elif direction not in DIRECTIONS:
            raise InvalidArgument(f"direction {quoted(direction)} is unknown; use "
                                  f"{' or '.join(DIRECTIONS)}")
        if not 1 <= self.trials <= max_trials:
            raise InvalidArgument(f"trials must lie in 1..{max_trials} (this victim's "
                                  f"--max-audit-trials), got {self.trials}")
        if not (self.norm >= 0 and math.isfinite(self.norm) and self.norm <= 1e30):
            raise InvalidArgument(f"canary_norm must be a finite number >= 0 (0: the "
                                  f"default), got {self.norm}")
        if not 0 <= self.delta < 1:
            raise InvalidArgument(f"delta must lie in [0, 1) (0: the chain's), got {self.delta}")
        if not 0 <= self.confidence < 1:
            raise InvalidArgument(f"confidence must lie in (0, 1) (0: {DEFAULT_CONFIDENCE}), "
                                  f"got {self.confidence}")
        rule = self.threshold_rule or "split"
        if rule not in THRESHOLD_RULES:
            raise InvalidArgument(f"threshold_rule {quoted(rule)} is unknown; use one of "
                                  f"{', '.join(THRESHOLD_RULES)}")
        if rule == "declared" and not math.isfinite(self.threshold):
            raise InvalidArgument("a declared threshold must be a finite number")
        fraction = self.calibration_fraction or DEFAULT_CALIBRATION
        if rule == "split" and not 0 < fraction < 1:
            raise InvalidArgument(f"calibration_fraction must lie in (0, 1), got {fraction}")
        if rule == "split" and self.trials < 4:
            raise InvalidArgument("a held-out split needs at least 4 trials")
        return AuditRequest(canary, direction, self.seed, self.norm, self.coordinate,
                            self.trials, self.delta, self.confidence or DEFAULT_CONFIDENCE,
                            rule, self.threshold, fraction)
