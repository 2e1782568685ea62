"""How often ``Score`` may answer: per target (a submission is final) and per private image over
the victim's whole life.

``Score`` is evaluation, not part of the server's view: answering it repeatedly would let a
client climb the score (finite differences on the MSE read a private image exactly). Two
budgets bound it:

- **per target** (``--score-budget``, default 1): a round id with the set of users it is scored
  against (secure aggregation), or a release id, accepts at most ``limit`` submissions;
- **per private image** (``--image-score-budget``, default :data:`DEFAULT_IMAGE_BUDGET`): every
  answered submission is charged once to each private image it was scored against (the round's
  batch, the chosen users' images, a release's training set), and an image charged
  ``image_limit`` times is never scored again while the victim runs. Fresh rounds, other user
  sets and new releases are new *targets* but not new *images*, so the count of answers that
  depend on one private image x is at most ``image_limit`` whatever the client does.

Why this bounds the oracle: a finite-difference reader needs one answer per value it reads
(MSE(g + δe_i) − MSE(g) = (2δ(g − x_i) + δ²)/D gives x_i), so with ``image_limit`` answers it
reads at most ``image_limit − 1`` of the D = C·H·W values of x (D = 64 for a digit, 3,072 for a
32×32 photo). Every answer is at report precision (about 27 bits in all: MSE to three
significant figures, SSIM to 1e-4, PSNR derived), so ``image_limit`` answers carry at most
≈ 27·``image_limit`` bits about x, against 8·D bits in the image. An invalid submission is
refused before it spends anything; a refusal is ``FAILED_PRECONDITION`` naming the budget and
its flag.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable

from fedleak.harness.wire.request_errors import FailedPrecondition

#: Targets remembered (oldest forgotten first); a round forgotten by the victim cannot be scored.
MAX_TARGETS = 16_384
#: Answers that may depend on one private image over the victim's life (``--image-score-budget``).
DEFAULT_IMAGE_BUDGET = 8


class ScoreBudgetExhausted(FailedPrecondition):
    """The target, or one of its private images, was already scored as often as allowed."""


class ScoreBudget:
    """At most ``limit`` accepted submissions per scored target and ``image_limit`` per private
    image over the victim's life (thread-safe)."""

    def __init__(self, limit: int = 1, image_limit: int = DEFAULT_IMAGE_BUDGET) -> None:
        if limit < 1:
            raise ValueError(f"the score budget must be >= 1, got {limit}")
        if image_limit < 1:
            raise ValueError(f"the image score budget must be >= 1, got {image_limit}")
        self.limit = limit
        self.image_limit = image_limit
        self._spent: OrderedDict[Hashable, int] = OrderedDict()
        self._image_spent: dict[int, int] = {}
        self._lock = threading.Lock()

    def spend(self, target: Hashable, what: str, images: Iterable[int] = ()) -> None:
        """Count one submission for ``target`` and for each private image (pool index) in
        ``images``; refuse, spending nothing, when either budget is used up (``what`` names the
        target in the refusal)."""
        pool = sorted({int(i) for i in images})
        with self._lock:
            spent = self._spent.get(target, 0)
            if spent >= self.limit:
                raise ScoreBudgetExhausted(
                    f"{what} was already scored {spent} time(s) and this victim's score budget "
                    f"is {self.limit} (--score-budget): a submission is final. Attack a new "
                    "round, or, for research only, start the victim with a larger "
                    "--score-budget (unsafe: it makes Score an oracle)")
            used = [i for i in pool if self._image_spent.get(i, 0) >= self.image_limit]
            if used:
                raise ScoreBudgetExhausted(
                    f"{what} depends on {len(used)} private image(s) already scored "
                    f"{self.image_limit} time(s), this victim's budget per image over its life "
                    f"(--image-score-budget): more answers would let a client read the image "
                    "from the scores. Evaluate on other private images (a victim with another "
                    "--images), or restart the victim")
            self._spent[target] = spent + 1
            self._spent.move_to_end(target)
            while len(self._spent) > MAX_TARGETS:
                self._spent.popitem(last=False)
            for i in pool:
                self._image_spent[i] = self._image_spent.get(i, 0) + 1

    def spent(self, target: Hashable) -> int:
        with self._lock:
            return self._spent.get(target, 0)

    def image_scores_left(self) -> int:
        """The fewest answers any private image has left (``image_limit`` if none was scored)."""
        with self._lock:
            return self.image_limit - max(self._image_spent.values(), default=0)

    def images_exhausted(self) -> int:
        """How many private images can no longer be scored."""
        with self._lock:
            return sum(1 for n in self._image_spent.values() if n >= self.image_limit)
