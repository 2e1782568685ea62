"""The victim's open audits, whose they are, and what audits may spend over its life.

**Budgets.** At most ``max_trials`` trials per audit (checked at ``BeginAudit``), at most
``budget`` audits answered over the victim's life, and at most ``budget × max_trials`` trials
run over its life, answered or not (:meth:`AuditBook.reserve`): opening audit after audit and
never submitting their scores does not buy more trials than the answers allow.

**Ownership.** An audit id is a bearer token (128 random bits): whoever holds it runs the
audit's trials and submits its scores, so it is given only to its opener. Who opened an audit
decides who may make it give its place to a new one: the *owner* is the holder of the
evaluator's score token when the victim has one (``evaluator``), else the client host. At most
:data:`MAX_OPEN_AUDITS` audits are open at once and :data:`MAX_OPEN_PER_OWNER` per owner; an
owner at its cap forgets its own oldest. When the victim is full, a new audit takes the place
of an audit that has not been used for :data:`IDLE_SECONDS` (never the evaluator's), or, when
the opener holds the evaluator's token, of the oldest audit of a client without it; otherwise
``BeginAudit`` is refused (``RESOURCE_EXHAUSTED``) and nothing is evicted. So a client without
the token cannot evict the evaluator's audit, and no client can evict another's audit while it
is in use.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from fedleak.harness.victim.audit.sessions import AuditOutcome, AuditSession, outcome
from fedleak.harness.victim.limits import DEFAULT_AUDIT_BUDGET, DEFAULT_MAX_AUDIT_TRIALS
from fedleak.harness.wire.request_errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)

#: Unanswered audits open at once, all owners together.
MAX_OPEN_AUDITS = 8
#: Unanswered audits one owner (a client host, or the evaluator) may hold.
MAX_OPEN_PER_OWNER = 4
#: An audit unused this long (no trial run, no scores) may give its place to anyone's new one.
IDLE_SECONDS = 600.0
#: What owns the audits opened with the evaluator's score token.
EVALUATOR = "evaluator"


class AuditBook:
    """The victim's audits by id, their owners, and the budgets (thread-safe)."""

    def __init__(self, budget: int = DEFAULT_AUDIT_BUDGET,
                 max_trials: int = DEFAULT_MAX_AUDIT_TRIALS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = budget
        self.max_trials = max_trials
        self.answered = 0
        self.trials_run = 0
        self.clock = clock
        self._sessions: OrderedDict[str, AuditSession] = OrderedDict()
        self._answered: OrderedDict[str, None] = OrderedDict()  # recent ids, for the message
        self._lock = threading.Lock()

    @property
    def left(self) -> int:
        with self._lock:
            return max(0, self.budget - self.answered)

    @property
    def trial_cap(self) -> int:
        """Trials the victim runs over its life: ``budget × max_trials``."""
        return self.budget * self.max_trials

    def check_open(self) -> None:
        if self.left <= 0:
            raise FailedPrecondition(
                f"this victim already answered {self.budget} audit(s), its budget over its "
                "life (--audit-budget); restart it or raise the budget")
        with self._lock:
            if self.trials_run >= self.trial_cap:
                raise FailedPrecondition(self._trials_spent())

    def _trials_spent(self) -> str:
        return (f"this victim already ran {self.trials_run} audit trials, its cap over its life "
                f"(--audit-budget {self.budget} × --max-audit-trials {self.max_trials}); "
                "restart it or raise the budget")

    def add(self, session: AuditSession, owner: str, evaluator: bool = False) -> None:
        """Keep ``session`` as ``owner``'s (the module docstring says whose place it takes);
        ``ResourceExhausted`` when it may take none."""
        session.owner = EVALUATOR if evaluator else owner
        session.evaluator = evaluator
        with self._lock:
            now = self.clock()
            session.touched = now
            own = [s for s in self._sessions.values() if s.owner == session.owner]
            if len(own) >= MAX_OPEN_PER_OWNER:
                del self._sessions[own[0].audit_id]
            elif len(self._sessions) >= MAX_OPEN_AUDITS:
                idle = [s for s in self._sessions.values()
                        if not s.evaluator and now - s.touched >= IDLE_SECONDS]
                others = [s for s in self._sessions.values() if not s.evaluator] \
                    if evaluator else []
                place = (idle + others)[:1]
                if not place:
                    raise ResourceExhausted(
                        f"{len(self._sessions)} audits are open, the most this victim keeps "
                        f"({MAX_OPEN_AUDITS}, {MAX_OPEN_PER_OWNER} per client); finish one "
                        f"(submit its scores), wait until one is unused for {IDLE_SECONDS:g} "
                        "s, or open it with the evaluator's score token")
                del self._sessions[place[0].audit_id]
            self._sessions[session.audit_id] = session

    def get(self, audit_id: str) -> AuditSession:
        with self._lock:
            session = self._sessions.get(audit_id)
            if session is not None:
                session.touched = self.clock()
            answered = audit_id in self._answered
        if answered:
            raise FailedPrecondition(f"audit {audit_id[:16]} was already answered: scores are "
                                     "submitted once; begin a new audit")
        if session is None:
            raise NotFound(f"no open audit {audit_id[:40]!r}: begin one with BeginAudit (an "
                           "audit is forgotten once answered, or when its opener opened "
                           f"{MAX_OPEN_PER_OWNER} more)")
        return session

    def reserve(self, session: AuditSession, count: int) -> range:
        """The session's next ``count`` trial indices, within the victim's lifetime cap on
        trials (fewer when fewer are left; ``FailedPrecondition`` when none are)."""
        with self._lock:
            allowed = min(count, self.trial_cap - self.trials_run)
            if allowed <= 0:
                raise FailedPrecondition(self._trials_spent())
            reserved = session.reserve(allowed)
            self.trials_run += len(reserved)
            return reserved

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
                self._sessions.pop(audit_id, None)  # answered: its place is free
                self._answered[audit_id] = None
                while len(self._answered) > 4 * MAX_OPEN_AUDITS:
                    self._answered.popitem(last=False)
            session.answered = True
        return outcome(session, values)
