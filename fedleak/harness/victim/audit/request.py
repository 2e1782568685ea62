"""What the server asks of the audit game (``BeginAuditRequest`` without its tensors), with
the victim's defaults filled in and every value checked (:meth:`AuditRequest.checked`): the
canary's kind and direction, the trials (or the noise shortfall they must detect, and with
what power), δ, the confidence, the false-alarm rate of the verdict, coverage, and the
threshold rule.

One default threshold rule everywhere: ``half-shift`` (fixed before the first trial at half
the canary's expected score shift, every trial evaluated), falling back to a held-out
``split`` where public settings do not fix the shift (input canaries).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedleak.auditing.audit_defaults import (
    DEFAULT_CALIBRATION,
    DEFAULT_CONFIDENCE,
    DEFAULT_FALSE_ALARM,
    DEFAULT_POWER,
    DEFAULT_SHORTFALL,
    DEFAULT_THRESHOLD_RULE,
)
from fedleak.auditing.canaries import (
    CANARY_KINDS,
    CLIENT,
    DIRAC,
    DIRECTIONS,
    GRADIENT,
    INPUT,
)
from fedleak.harness.wire.quoting import quoted
from fedleak.harness.wire.request_errors import InvalidArgument

THRESHOLD_RULES = ("split", "half-shift", "declared")
#: DEFAULT_FALSE_ALARM: a correct mechanism is called a violation with at most this
#: probability, over every group and estimator together; DEFAULT_SHORTFALL / DEFAULT_POWER:
#: without a trial count the victim chooses the trials that catch noise this short of the
#: declared std with this power (capped by its --max-audit-trials and DEFAULT_MAX_CHOSEN; a
#: secure-aggregation trial is a whole protocol round, so those are capped lower). All in
#: :mod:`fedleak.auditing.audit_defaults`.
DEFAULT_MAX_CHOSEN = 4000
SECAGG_MAX_CHOSEN = 1000
#: Trials when the chain claims nothing (nothing to fall short of) and none are asked for.
DEFAULT_TRIALS = 2000


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
    #: 0: the defaults above; coverage False: the primary canary alone
    detect_shortfall: float = 0.0
    power: float = 0.0
    false_alarm: float = 0.0
    coverage: bool = True
    max_chosen_trials: int = 0

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
        direction = self.direction or DIRAC
        if canary == INPUT:
            direction = ""
        elif direction not in DIRECTIONS:
            raise InvalidArgument(f"direction {quoted(direction)} is unknown; use "
                                  f"{' or '.join(DIRECTIONS)}")
        if not 0 <= self.trials <= max_trials:
            raise InvalidArgument(f"trials must lie in 1..{max_trials} (this victim's "
                                  f"--max-audit-trials; 0: as many as --detect-shortfall "
                                  f"needs), got {self.trials}")
        shortfall = self.detect_shortfall or DEFAULT_SHORTFALL
        if not 0 < shortfall < 1:
            raise InvalidArgument(f"detect_shortfall must lie in (0, 1) (the noise factor to "
                                  f"catch, e.g. 0.9), got {shortfall}")
        power = self.power or DEFAULT_POWER
        if not 0 < power < 1:
            raise InvalidArgument(f"power must lie in (0, 1), got {power}")
        false_alarm = self.false_alarm or DEFAULT_FALSE_ALARM
        if not 0 < false_alarm < 0.5:
            raise InvalidArgument(f"false_alarm must lie in (0, 0.5), got {false_alarm}")
        chosen = self.max_chosen_trials or min(
            SECAGG_MAX_CHOSEN if secagg else DEFAULT_MAX_CHOSEN, max_trials)
        if not 4 <= chosen <= max_trials:
            raise InvalidArgument(f"max_chosen_trials must lie in 4..{max_trials}, got "
                                  f"{chosen}")
        if not (self.norm >= 0 and math.isfinite(self.norm) and self.norm <= 1e30):
            raise InvalidArgument(f"canary_norm must be a finite number >= 0 (0: the "
                                  f"default), got {self.norm}")
        if not 0 <= self.delta < 1:
            raise InvalidArgument(f"delta must lie in [0, 1) (0: the chain's), got {self.delta}")
        if not 0 <= self.confidence < 1:
            raise InvalidArgument(f"confidence must lie in (0, 1) (0: {DEFAULT_CONFIDENCE}), "
                                  f"got {self.confidence}")
        rule = self.threshold_rule or DEFAULT_THRESHOLD_RULE
        if rule not in THRESHOLD_RULES:
            raise InvalidArgument(f"threshold_rule {quoted(rule)} is unknown; use one of "
                                  f"{', '.join(THRESHOLD_RULES)}")
        if rule == "declared" and not math.isfinite(self.threshold):
            raise InvalidArgument("a declared threshold must be a finite number")
        fraction = self.calibration_fraction or DEFAULT_CALIBRATION
        if not 0 < fraction < 1:
            raise InvalidArgument(f"calibration_fraction must lie in (0, 1), got {fraction}")
        if rule == "split" and 0 < self.trials < 4:
            raise InvalidArgument("a held-out split needs at least 4 trials")
        return AuditRequest(canary, direction, self.seed, self.norm, self.coordinate,
                            self.trials, self.delta, self.confidence or DEFAULT_CONFIDENCE,
                            rule, self.threshold, fraction, shortfall, power, false_alarm,
                            self.coverage, chosen)
