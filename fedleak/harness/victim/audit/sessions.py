"""The audit game on the victim's side: sessions, secret coins, budgets and the bounds.

``BeginAudit`` opens an :class:`AuditSession` at the server's θ: the victim builds the public
canary (:func:`~fedleak.harness.victim.audit.canary.build_canary`), flips one secret fair coin
per trial, splits the trials for threshold calibration, and states what its chain claims for
one trial (:mod:`~fedleak.harness.victim.audit.claim`). Trials then run in order, each exactly
once (``RunAuditTrials`` several per call, or one ``BeginSecAgg`` round each on a
secure-aggregation victim): the victim's defended update with the canary when the coin says
so, entering before the defense chain. ``SubmitAuditScores`` takes one score per trial run,
once, and answers with every estimator's bound (:func:`fedleak.auditing.audit_bounds`), the
claim, whether a bound exceeds it (a violation), and score histograms — statistics of the
coins, never the coins of single trials, and nothing of a private image.

Budgets and ownership are :class:`~fedleak.harness.victim.audit.book.AuditBook`'s. What the
server asks is :class:`~fedleak.harness.victim.audit.request.AuditRequest`; the canary is built in
:mod:`~fedleak.harness.victim.audit.canary`.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from fedleak.auditing import (
    AuditBound,
    DeclarationTest,
    GameSettings,
    ScoreHistogram,
    calibration_split,
    verdict_text,
)
from fedleak.auditing.canaries import CLIENT, DIRAC, INPUT
from fedleak.auditing.verdict import power_statement
from fedleak.defenses import DefenseChain
from fedleak.harness.federated.private_update import TrialCanary
from fedleak.harness.federated.protocol import FEDSGD, Protocol
from fedleak.harness.victim.audit.canary import AuditCanary
from fedleak.harness.victim.audit.claim import TrialClaim, chain_delta, trial_claim
from fedleak.harness.victim.audit.coverage import Coverage
from fedleak.harness.victim.audit.histogram import released_histogram, withheld_rates
from fedleak.harness.victim.audit.plan import (
    choose_trials,
    covered_groups,
    plan_coverage,
    verdict_game,
)
from fedleak.harness.victim.audit.request import AuditRequest
from fedleak.harness.wire.request_errors import FailedPrecondition
from fedleak.harness.zoo.datasets import DatasetInfo

#: the canary-free phase's releases per audit (a sixteenth of the scored trials, within these)
MIN_CANARY_FREE = 8
MAX_CANARY_FREE = 64
#: an asked-for trial count gets the phase (out of it) from this many trials on
CANARY_FREE_FROM = 128


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
    tests: list[DeclarationTest] = field(default_factory=list)
    power_statement: str = ""
    detectable_noise: float | None = None
    false_alarm: float = 0.0
    coverage: str = ""


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
    coverage: Coverage | None = None
    trials: int = 0
    served: int = 0
    answered: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: who opened it (a client host, or "evaluator" for a holder of the score token), and
    #: when it was last used (time.monotonic): :class:`~fedleak.harness.victim.audit.book.
    #: AuditBook` keeps others from evicting it
    owner: str = ""
    evaluator: bool = False
    touched: float = 0.0

    @property
    def left(self) -> int:
        return self.trials - self.served

    def reserve(self, count: int) -> range:
        """The next ``count`` trial indices (fewer when fewer are left); each runs once. The
        victim's lifetime cap is :meth:`~fedleak.harness.victim.audit.book.AuditBook.reserve`'s
        (call that one)."""
        with self.lock:
            if self.answered:
                raise FailedPrecondition(f"audit {self.audit_id[:16]} was already answered; "
                                         "begin a new audit")
            start = self.served
            self.served = min(self.trials, start + count)
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
        if c.sparse is not None and c.sparse[0].size > 1:
            where = f"the quietest coordinate of each of {c.sparse[0].size} tensors"
        return f"{what}, {c.direction} direction ({where}), norm {c.norm:g}"

    def canary_for(self, trial: int, parameters: dict[str, torch.Tensor]) \
            -> TrialCanary | None:
        """What trial ``trial`` adds before the chain (None: nothing)."""
        from fedleak.harness.victim.audit.plan import trial_canary

        return trial_canary(self.canary, self.coverage, self.trial_canary,
                            bool(self.coins[trial]), trial, parameters)


def outcome(session: AuditSession, scores: np.ndarray) -> AuditOutcome:
    """Bounds, tests, verdict and histograms of an answered audit."""
    coverage = session.coverage
    scored = ~coverage.bare[:scores.size] if coverage is not None else \
        np.ones(scores.size, dtype=bool)
    scores = scores[scored]  # the canary-free phase's releases are not scored
    served = scores.size
    coins = session.coins[:scored.size][scored]
    calibration = session.calibration[:scored.size][scored]
    if session.threshold is None and (calibration.all() or not calibration.any()):
        calibration = np.arange(served) < max(1, served // 5)  # too few trials to split
    claim, request = session.claim, session.request
    evaluation = verdict_game(scores, coins, calibration, session.settings(),
                              session.threshold, claim, session.coverage, request,
                              released=scored.size)
    verdict = verdict_text(evaluation, claim.epsilon, claim.delta, request.power)
    evaluated = ~calibration if session.threshold is None else np.ones(served, dtype=bool)
    return AuditOutcome(session.audit_id, withheld_rates(evaluation.bounds, scores, evaluated),
                        claim, evaluation.violation, verdict,
                        released_histogram(scores, coins), scored.size,
                        session.describe_canary(), session.threat_model,
                        tests=evaluation.tests,
                        power_statement=power_statement(evaluation, request.power)
                        if claim.claims else "",
                        detectable_noise=evaluation.detectable_noise(),
                        false_alarm=request.false_alarm,
                        coverage=covered_groups(session.coverage))


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
                canary_user: int, rng: np.random.Generator, chain: DefenseChain | None = None,
                num_images: int = 0, noise_users: int = 1, max_trials: int = 0) \
        -> AuditSession:
    """A session with its coverage, its trials (asked for, or chosen for the requested power),
    its secret coins (fair, independent) and calibration split, drawn from ``rng`` (the
    victim's secret randomness)."""
    names = list(parameters)
    sizes = [int(p.numel()) for p in parameters.values()]
    most = max_trials or request.trials or request.max_chosen_trials
    trials = request.trials or most
    coverage = None
    if chain is not None:
        coverage = plan_coverage(request, canary, chain, names, sizes, protocol, num_images,
                                 noise_users, most, rng)
        trials = choose_trials(request, coverage, claim, most, canary.expected_shift)
    if coverage is not None:
        bare = canary_free_trials(coverage, trials, chosen=not request.trials)
        trials = trials if request.trials else min(trials + bare, most)
        coverage.keep_trials(trials)
        coverage.canary_free(bare, rng)
    coins = coverage.coins[:trials, 0].copy() if coverage is not None else \
        rng.random(trials) < 0.5
    rule = request.threshold_rule
    if rule == "half-shift" and not canary.expected_shift > 0:
        rule = "split"  # the default where public settings do not fix the shift
    calibration = calibration_split(trials, request.calibration_fraction, rng) \
        if rule == "split" else np.zeros(trials, dtype=bool)
    threshold: float | None = None
    if rule == "declared":
        threshold = request.threshold
    elif rule == "half-shift":
        threshold = canary.expected_shift / 2
    if rule != request.threshold_rule:
        request = dataclasses.replace(request, threshold_rule=rule)
    return AuditSession(secrets.token_hex(16), request, canary, canary.trial_canary(info), coins,
                        calibration, parameters, buffers, protocol, claim, describe,
                        secagg, canary_user, threshold, coverage, trials)


def canary_free_trials(coverage: Coverage, trials: int, chosen: bool = True) -> int:
    """How many canary-free releases the audit interleaves (the data-dependence phase:
    :mod:`fedleak.auditing.estimators.canary_free`): a sixteenth of the scored trials, 8 to
    64, where the noise level is read. With trials the victim chose they come on top of
    them (or out of them where its trial cap leaves no room); a count the server asked for
    is kept as the number of releases, so the phase comes out of it, and only from
    CANARY_FREE_FROM trials on (fewer keep every trial scored)."""
    if not coverage.noise_coordinates.size or trials < 16 or \
            (not chosen and trials < CANARY_FREE_FROM):
        return 0
    return min(MAX_CANARY_FREE, max(MIN_CANARY_FREE, trials // 16))


def session_claim(request: AuditRequest, chain: DefenseChain, canary: AuditCanary,
                  protocol: Protocol, num_images: int, users: int,
                  names: list[str] | None = None) -> TrialClaim:
    """The chain's claim for one trial of this audit (δ: the request's, else the chain's)."""
    delta = request.delta or chain_delta(chain)
    noise_users = users + (1 if request.canary == CLIENT else 0)
    return trial_claim(chain, request.canary, canary.norm, protocol, num_images, noise_users,
                       delta, [str(n) for n in names or []])
