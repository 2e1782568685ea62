"""How many times each round (or user set, or release) may be scored: a submission is final.

``Score`` is evaluation, not part of the server's view: answering it repeatedly for the same
round would let a client climb the score (finite differences on the MSE read a private image
exactly). A :class:`ScoreBudget` counts accepted submissions per target — a round id with the
set of users it is scored against (secure aggregation), or a release id — and refuses the one
past the budget with ``FAILED_PRECONDITION`` naming the budget and how to raise it. Invalid
submissions are refused before they spend anything.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

from fedleak.harness.wire.errors import FailedPrecondition

#: Targets remembered (oldest forgotten first); a round forgotten by the victim cannot be scored.
MAX_TARGETS = 16_384


class ScoreBudgetExhausted(FailedPrecondition):
    """The target was already scored as often as the budget allows."""


class ScoreBudget:
    """At most ``limit`` accepted submissions per scored target (thread-safe)."""

    def __init__(self, limit: int = 1) -> None:
        if limit < 1:
            raise ValueError(f"the score budget must be >= 1, got {limit}")
        self.limit = limit
        self._spent: OrderedDict[Hashable, int] = OrderedDict()
        self._lock = threading.Lock()

    def spend(self, target: Hashable, what: str) -> None:
        """Count one submission for ``target`` (``what`` names it in the refusal)."""
        with self._lock:
            spent = self._spent.get(target, 0)
            if spent >= self.limit:
                raise ScoreBudgetExhausted(
                    f"{what} was already scored {spent} time(s) and this victim's score budget "
                    f"is {self.limit} (--score-budget): a submission is final. Attack a new "
                    "round, or, for research only, start the victim with a larger "
                    "--score-budget (unsafe: it makes Score an oracle)")
            self._spent[target] = spent + 1
            self._spent.move_to_end(target)
            while len(self._spent) > MAX_TARGETS:
                self._spent.popitem(last=False)

    def spent(self, target: Hashable) -> int:
        with self._lock:
            return self._spent.get(target, 0)
