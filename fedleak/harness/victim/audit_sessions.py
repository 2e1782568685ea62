"""The audit game on the victim's side: sessions, secret coins, budgets and the bounds.

``BeginAudit`` opens an :class:`AuditSession` at the server's θ: the victim builds the public
canary (:func:`~fedleak.harness.victim.audit_canary.build_canary`), flips one secret fair coin
per trial, splits the trials for threshold calibration, and states what its chain claims for
one trial (:mod:`~fedleak.harness.victim.audit_claim`). Trials then run in order, each exactly
once (``RunAuditTrials`` several per call, or one ``BeginSecAgg`` round each on a
secure-aggregation victim): the victim's defended update with the canary when the coin says
so, entering before the defense chain. ``SubmitAuditScores`` takes one score per trial run,
once, and answers with every estimator's bound (:func:`fedleak.auditing.audit_bounds`), the
claim, whether a bound exceeds it (a violation), and score histograms — statistics of the
coins, never the coins of single trials, and nothing of a private image.

Budgets and ownership are :class:`~fedleak.harness.victim.audit_book.AuditBook`'s. What the
server asks is :class:`~fedleak.harness.victim.audit_request.AuditRequest`; the canary is built in
:mod:`~fedleak.harness.victim.audit_canary`.
"""

from __future__ import annotations

import math
import secrets
import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from fedleak.auditing import (
    AuditBound,
    GameSettings,
    ScoreHistogram,
    audit_bounds,
    calibration_split,
    format_epsilon,
)
from fedleak.auditing.canaries import CLIENT, DIRAC, INPUT
from fedleak.defenses import DefenseChain
from fedleak.harness.federated.private_update import TrialCanary
from fedleak.harness.federated.protocol import FEDSGD, Protocol
from fedleak.harness.victim.audit_canary import AuditCanary
from fedleak.harness.victim.audit_claim import TrialClaim, chain_delta, trial_claim
from fedleak.harness.victim.audit_histogram import released_histogram, withheld_rates
from fedleak.harness.victim.audit_request import AuditRequest
from fedleak.harness.wire.request_errors import FailedPrecondition, InvalidArgument
from fedleak.harness.zoo.datasets import DatasetInfo


@dataclass
class AuditOutcome:
    """The victim's answer to the scores: bounds, claim, verdict, histograms."""

    audit_id: str
    bounds: list[AuditBound]
    claim: TrialClaim
    violation: bool
    verdict: str
    histogram: ScoreHistogram
    trials: int
    canary: str
    threat_model: str


@dataclass
class AuditSession:
    """One audit: its θ, canary, secret coins and what has been run and answered."""

    audit_id: str
    request: AuditRequest
    canary: AuditCanary
    trial_canary: TrialCanary
    coins: np.ndarray
    calibration: np.ndarray
    parameters: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    protocol: Protocol
    claim: TrialClaim
    threat_model: str
    secagg: bool
    canary_user: int = -1
    threshold: float | None = None
    served: int = 0
    answered: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: who opened it (a client host, or "evaluator" for a holder of the score token), and
    #: when it was last used (time.monotonic): :class:`~fedleak.harness.victim.audit_book.
    #: AuditBook` keeps others from evicting it
    owner: str = ""
    evaluator: bool = False
    touched: float = 0.0

    @property
    def left(self) -> int:
        return self.request.trials - self.served

    def reserve(self, count: int) -> range:
        """The next ``count`` trial indices (fewer when fewer are left); each runs once. The
        victim's lifetime cap is :meth:`~fedleak.harness.victim.audit_book.AuditBook.reserve`'s
        (call that one)."""
        with self.lock:
            if self.answered:
                raise FailedPrecondition(f"audit {self.audit_id[:16]} was already answered; "
                                         "begin a new audit")
            start = self.served
            self.served = min(self.request.trials, start + count)
            return range(start, self.served)

    def settings(self) -> GameSettings:
        return GameSettings(self.claim.delta, self.request.confidence, self.describe_canary(),
                            self.threat_model)

    def describe_canary(self) -> str:
        c = self.canary
        if c.kind == INPUT:
            return f"input canary (seeded noise image, label {c.label}, seed {self.request.seed})"
        where = f"coordinate {c.coordinate}" if c.direction == DIRAC else \
            f"seed {self.request.seed}"
        what = "canary client" if c.kind == CLIENT else "gradient canary"
        return f"{what}, {c.direction} direction ({where}), norm {c.norm:g}"


def outcome(session: AuditSession, scores: np.ndarray) -> AuditOutcome:
    """Bounds, verdict and histograms of an answered audit."""
    served = scores.size
    coins = session.coins[:served]
    calibration = session.calibration[:served]
    if session.threshold is None and (calibration.all() or not calibration.any()):
        calibration = np.arange(served) < max(1, served // 5)  # too few trials to split
    bounds = audit_bounds(scores, coins, calibration, session.settings(), session.threshold)
    evaluated = ~calibration if session.threshold is None else np.ones(served, dtype=bool)
    bounds = withheld_rates(bounds, scores, evaluated)
    claim = session.claim
    strongest = max((b for b in bounds if not b.is_estimate), key=lambda b: b.epsilon)
    violation = strongest.epsilon > claim.epsilon * (1 + 1e-9)
    if violation:
        verdict = (f"VIOLATION: {strongest.estimator} ε_LB {format_epsilon(strongest.epsilon)} "
                   f"exceeds the claimed ε {format_epsilon(claim.epsilon)} (δ = "
                   f"{claim.delta:g}) at {strongest.confidence:.0%} confidence: the mechanism "
                   "is not what the chain claims")
    elif math.isinf(claim.epsilon):
        verdict = (f"no claim to test: the chain claims no DP for this canary; ε_LB "
                   f"{format_epsilon(strongest.epsilon)} ({strongest.estimator}) measures how "
                   "far it is from private")
    else:
        verdict = (f"consistent: the largest ε_LB, {format_epsilon(strongest.epsilon)} "
                   f"({strongest.estimator}), does not exceed the claimed ε "
                   f"{format_epsilon(claim.epsilon)}; a gap is a weak canary or a loose "
                   "accountant, never more privacy")
    return AuditOutcome(session.audit_id, bounds, claim, violation, verdict,
                        released_histogram(scores, coins), served, session.describe_canary(),
                        session.threat_model)


def threat_model(secagg: bool, users: int, canary: str, protocol: Protocol) -> str:
    """What the server sees per trial, in words."""
    update = "gradient (FedSGD)" if protocol.kind == FEDSGD else \
        f"parameter delta (FedAvg, {protocol.local_epochs} local epoch(s))"
    if secagg:
        extra = " and a canary client" if canary == CLIENT else ""
        return (f"honest server that sees only the secure-aggregation sum of {users} users' "
                f"defended updates{extra} per trial ({update})")
    return f"honest server that sees the user's whole defended update per trial ({update})"


def new_session(request: AuditRequest, canary: AuditCanary, claim: TrialClaim,
                parameters: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                protocol: Protocol, info: DatasetInfo, describe: str, secagg: bool,
                canary_user: int, rng: np.random.Generator) -> AuditSession:
    """A session with its secret coins (fair, independent) and calibration split drawn from
    ``rng`` (the victim's secret randomness)."""
    coins = rng.random(request.trials) < 0.5
    calibration = calibration_split(request.trials, request.calibration_fraction, rng) \
        if request.threshold_rule == "split" else np.zeros(request.trials, dtype=bool)
    threshold: float | None = None
    if request.threshold_rule == "declared":
        threshold = request.threshold
    elif request.threshold_rule == "half-shift":
        if not canary.expected_shift > 0:
            raise InvalidArgument("threshold_rule half-shift needs the canary's expected "
                                  "shift, which public settings do not determine here (input "
                                  "canaries, per-layer clipping of a random direction); use "
                                  "split or declared")
        threshold = canary.expected_shift / 2
    return AuditSession(secrets.token_hex(16), request, canary, canary.trial_canary(info), coins,
                        calibration, parameters, buffers, protocol, claim, describe,
                        secagg, canary_user, threshold)


def session_claim(request: AuditRequest, chain: DefenseChain, canary: AuditCanary,
                  protocol: Protocol, num_images: int, users: int) -> TrialClaim:
    """The chain's claim for one trial of this audit (δ: the request's, else the chain's)."""
    delta = request.delta or chain_delta(chain)
    noise_users = users + (1 if request.canary == CLIENT else 0)
    return trial_claim(chain, request.canary, canary.norm, protocol, num_images, noise_users,
                       delta)
