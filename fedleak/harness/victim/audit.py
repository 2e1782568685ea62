"""The audit game on the victim's side: canaries, secret coins, and the bounds.

``BeginAudit`` opens an :class:`AuditSession` at the server's θ: the victim builds the public
canary (:func:`build_canary`), flips one secret fair coin per trial, splits the trials for
threshold calibration, and states what its chain claims for one trial
(:mod:`~fedleak.harness.victim.audit_claim`). Trials then run in order, each exactly once
(``RunAuditTrials`` several per call, or one ``BeginSecAgg`` round each on a
secure-aggregation victim): the victim's defended update with the canary when the coin says
so, entering before the defense chain. ``SubmitAuditScores`` takes one score per trial run,
once, and answers with every estimator's bound (:func:`fedleak.auditing.audit_bounds`), the
claim, whether a bound exceeds it (a violation), and score histograms — statistics of the
coins, never the coins of single trials, and nothing of a private image.

Budgets (:class:`AuditBook`): at most ``max_trials`` trials per audit, at most ``budget``
audits answered over the victim's life, at most :data:`MAX_OPEN_AUDITS` unanswered audits
kept (the oldest forgotten). Every refusal names the limit and its flag.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from fedleak.auditing import (
    AuditBound,
    GameSettings,
    ScoreHistogram,
    audit_bounds,
    calibration_split,
    format_epsilon,
    score_histogram,
)
from fedleak.auditing.canaries import (
    CANARY_KINDS,
    CLIENT,
    DIRAC,
    DIRECTIONS,
    GRADIENT,
    INPUT,
    RANDOM,
    dirac,
    input_canary,
    quiet_coordinate,
    random_direction,
)
from fedleak.defenses import DefenseChain
from fedleak.defenses.dpsgd import DPSGD
from fedleak.harness.federated.local_update import local_update
from fedleak.harness.federated.private_update import TrialCanary, per_example_gradients
from fedleak.harness.federated.protocol import FEDSGD, Protocol, local_batches
from fedleak.harness.victim.audit_claim import TrialClaim, chain_delta, trial_claim
from fedleak.harness.victim.limits import DEFAULT_AUDIT_BUDGET, DEFAULT_MAX_AUDIT_TRIALS
from fedleak.harness.wire.request_errors import FailedPrecondition, InvalidArgument, NotFound
from fedleak.harness.zoo.datasets import DatasetInfo, normalize

#: Unanswered audits kept; opening another forgets the oldest.
MAX_OPEN_AUDITS = 8
THRESHOLD_RULES = ("split", "half-shift", "declared")
DEFAULT_CALIBRATION = 0.2
DEFAULT_CONFIDENCE = 0.95
#: Images of the public synthetic batch that picks a Dirac canary's coordinate.
SYNTHETIC_BATCH = 16
#: A DP-SGD gradient canary is this many times the clip norm by default (clipping binds).
PER_EXAMPLE_CANARY_FACTOR = 10.0


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
            raise InvalidArgument(f"canary {canary!r} is unknown; use one of "
                                  f"{', '.join(CANARY_KINDS)}")
        if canary == CLIENT and not secagg:
            raise InvalidArgument("a canary client is an extra user of a secure-aggregation "
                                  "round: this victim has one user; use canary gradient or "
                                  "input, or start it with --users K --defense secagg")
        direction = self.direction or (RANDOM if canary == CLIENT else DIRAC)
        if canary == INPUT:
            direction = ""
        elif direction not in DIRECTIONS:
            raise InvalidArgument(f"direction {direction!r} is unknown; use "
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
            raise InvalidArgument(f"threshold_rule {rule!r} is unknown; use one of "
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


@dataclass
class AuditCanary:
    """The public canary of an audit, and how a trial's score is expected to move with it."""

    kind: str
    direction: str
    norm: float
    #: the unit direction u the server scores along (input canaries: their gradient at θ)
    unit: list[torch.Tensor]
    coordinate: int = -1
    image: torch.Tensor | None = None  # input canary on [0, 1]
    label: int = -1
    score_sign: float = 1.0
    expected_shift: float = 0.0

    def trial_canary(self, info: DatasetInfo) -> TrialCanary:
        """What a canary-in trial adds to the user's computation."""
        if self.kind == INPUT:
            assert self.image is not None
            return TrialCanary(image=normalize(self.image[None], info)[0], label=self.label)
        return TrialCanary(gradient=[self.norm * u for u in self.unit])


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

    @property
    def left(self) -> int:
        return self.request.trials - self.served

    def reserve(self, count: int) -> range:
        """The next ``count`` trial indices (fewer when fewer are left); each runs once."""
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


class AuditBook:
    """The victim's audits by id, and the budget of answers (thread-safe)."""

    def __init__(self, budget: int = DEFAULT_AUDIT_BUDGET,
                 max_trials: int = DEFAULT_MAX_AUDIT_TRIALS) -> None:
        self.budget = budget
        self.max_trials = max_trials
        self.answered = 0
        self._sessions: OrderedDict[str, AuditSession] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def left(self) -> int:
        with self._lock:
            return max(0, self.budget - self.answered)

    def check_open(self) -> None:
        if self.left <= 0:
            raise FailedPrecondition(
                f"this victim already answered {self.budget} audit(s), its budget over its "
                "life (--audit-budget); restart it or raise the budget")

    def add(self, session: AuditSession) -> None:
        with self._lock:
            self._sessions[session.audit_id] = session
            while len(self._sessions) > MAX_OPEN_AUDITS:
                self._sessions.popitem(last=False)

    def get(self, audit_id: str) -> AuditSession:
        with self._lock:
            session = self._sessions.get(audit_id)
        if session is None:
            raise NotFound(f"no open audit {audit_id[:40]!r}: begin one with BeginAudit (a "
                           f"victim keeps its latest {MAX_OPEN_AUDITS} unanswered audits)")
        return session

    def answer(self, audit_id: str, scores: list[float]) -> AuditOutcome:
        """Validate the scores (one per trial run, finite), spend the budget, compute."""
        session = self.get(audit_id)
        with session.lock:
            if session.answered:
                raise FailedPrecondition(f"audit {audit_id[:16]} was already answered: scores "
                                         "are submitted once")
            if session.served == 0:
                raise FailedPrecondition("no trial of this audit has run yet: run its trials "
                                         "(RunAuditTrials or BeginSecAgg with audit_id) first")
            if len(scores) != session.served:
                raise InvalidArgument(f"{len(scores)} scores for the {session.served} trials "
                                      "run so far: submit exactly one score per trial, in "
                                      "trial order")
            values = np.asarray(scores, dtype=float)
            if not np.isfinite(values).all():
                raise InvalidArgument("scores must be finite numbers")
            with self._lock:
                if self.answered >= self.budget:
                    raise FailedPrecondition(
                        f"this victim already answered {self.budget} audit(s) "
                        "(--audit-budget); restart it or raise the budget")
                self.answered += 1
            session.answered = True
        return outcome(session, values)


def outcome(session: AuditSession, scores: np.ndarray) -> AuditOutcome:
    """Bounds, verdict and histograms of an answered audit."""
    served = scores.size
    coins = session.coins[:served]
    calibration = session.calibration[:served]
    if session.threshold is None and (calibration.all() or not calibration.any()):
        calibration = np.arange(served) < max(1, served // 5)  # too few trials to split
    bounds = audit_bounds(scores, coins, calibration, session.settings(), session.threshold)
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
                        score_histogram(scores, coins), served, session.describe_canary(),
                        session.threat_model)


# --------------------------------------------------------------------------- the canary


def build_canary(request: AuditRequest, chain: DefenseChain, model: nn.Module,
                 parameters: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor],
                 protocol: Protocol, info: DatasetInfo, num_images: int) -> AuditCanary:
    """The public canary of ``request`` at θ, its default norm, and the score's orientation and
    expected shift (0 where public settings do not determine it)."""
    shapes = [tuple(p.shape) for p in parameters.values()]
    per_example = chain.per_example is not None and request.canary != CLIENT
    gradient_kind = protocol.kind == FEDSGD
    if request.canary == INPUT:
        image, label = input_canary(info.shape, info.num_classes, request.seed)
        x = normalize(image[None], info).to(next(iter(parameters.values())).device)
        y = torch.tensor([label], device=x.device)
        grads = per_example_gradients(model, dict(parameters), dict(buffers), x, y)
        unit = _unit([g[0] for g in grads])
        return AuditCanary(INPUT, "", 0.0, unit, image=image, label=label,
                           score_sign=1.0 if gradient_kind else -1.0)
    coordinate = -1
    if request.direction == DIRAC:
        coordinate = request.coordinate if request.coordinate is not None else \
            _quiet_coordinate(model, parameters, buffers, info, request.seed)
        total = sum(int(np.prod(s, dtype=np.int64)) for s in shapes)
        if not 0 <= coordinate < total:
            raise InvalidArgument(f"coordinate must lie in [0, {total}) (the model's "
                                  f"parameter count), got {coordinate}")
        unit = dirac(shapes, coordinate)
    else:
        unit = random_direction(shapes, request.seed)
    unit = [u.to(p.device, p.dtype) for u, p in zip(unit, parameters.values(), strict=True)]
    norm = request.norm or default_norm(chain, per_example)
    sign, shift = 1.0, norm
    if per_example:
        sign = 1.0 if gradient_kind else -1.0
        shift = _per_example_shift(chain, norm, request.direction, len(shapes), protocol,
                                   num_images)
    return AuditCanary(request.canary, request.direction, norm, unit, coordinate,
                       score_sign=sign, expected_shift=shift)


def default_norm(chain: DefenseChain, per_example: bool) -> float:
    """‖c‖ when the request leaves it 0: DP-SGD's clip norm × 10 (clipping binds), else the
    first clip norm an update defense claims, else 1."""
    if per_example and isinstance(chain.per_example, DPSGD):
        return PER_EXAMPLE_CANARY_FACTOR * chain.per_example.config.max_grad_norm
    for defense in chain.update:
        claim = defense.gaussian_claim()
        if claim is not None and claim.clip_norm is not None:
            return claim.clip_norm
    return 1.0


def _per_example_shift(chain: DefenseChain, norm: float, direction: str, layers: int,
                       protocol: Protocol, num_images: int) -> float:
    """How far a DP-SGD canary moves the score: min(‖c‖, C)/B per step holding it (× τ and
    the steps holding it for FedAvg); 0 where it is not determined (per-layer clipping of a
    random direction, another per-example defense)."""
    defense = chain.per_example
    if not isinstance(defense, DPSGD):
        return 0.0
    c = defense.config
    if c.clipping == "per-layer":
        if direction != DIRAC:
            return 0.0
        clip = c.max_grad_norm / math.sqrt(layers)
    else:
        clip = c.max_grad_norm
    q = defense.sample_rate(num_images, protocol.batch_size)
    if q is not None:
        batch = max(round(q * num_images), 1)
    elif protocol.kind == FEDSGD:
        batch = num_images
    else:
        last = local_batches(num_images, protocol.batch_size)[-1]
        batch = last.stop - last.start
    per_step = min(norm, clip) / batch
    if protocol.kind == FEDSGD:
        return per_step
    steps = protocol.local_epochs if q is None else \
        q * protocol.local_epochs * max(1, round(1 / q))
    return protocol.learning_rate * steps * per_step


def _unit(vectors: list[torch.Tensor]) -> list[torch.Tensor]:
    norm = math.sqrt(sum(float((v.double() ** 2).sum()) for v in vectors))
    if not norm > 0:
        raise FailedPrecondition("the input canary has a zero gradient at these parameters; "
                                 "use another canary_seed or a gradient canary")
    return [(v / norm).detach() for v in vectors]


def _quiet_coordinate(model: nn.Module, parameters: Mapping[str, torch.Tensor],
                      buffers: Mapping[str, torch.Tensor], info: DatasetInfo, seed: int) -> int:
    """The coordinate a public synthetic batch (seeded noise images, seeded labels) moves
    least at θ: where a Dirac canary stands out from what data does."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.rand((SYNTHETIC_BATCH, *info.shape), generator=generator)
    labels = torch.randint(0, info.num_classes, (SYNTHETIC_BATCH,), generator=generator)
    device = next(iter(parameters.values())).device
    gradient = local_update(model, parameters, {k: v.clone() for k, v in buffers.items()},
                            normalize(images, info).to(device), labels.to(device), Protocol())
    return quiet_coordinate(gradient)


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
    return AuditSession(uuid.uuid4().hex, request, canary, canary.trial_canary(info), coins,
                        calibration, parameters, buffers, protocol, claim, describe,
                        secagg, canary_user, threshold)


def session_claim(request: AuditRequest, chain: DefenseChain, canary: AuditCanary,
                  protocol: Protocol, num_images: int, users: int) -> TrialClaim:
    """The chain's claim for one trial of this audit (δ: the request's, else the chain's)."""
    delta = request.delta or chain_delta(chain)
    noise_users = users + (1 if request.canary == CLIENT else 0)
    return trial_claim(chain, request.canary, canary.norm, protocol, num_images, noise_users,
                       delta)

