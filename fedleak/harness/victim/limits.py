"""The most a server may ask of a victim, and the evaluation budget.

Every knob a server chooses has a victim-side cap, so no request can make the victim compute
for longer than its operator allowed: FedAvg's local epochs E and local steps E·⌈n/B⌉, the
local learning rate τ and the release's step size, the release's epochs (``--release-epochs``),
and how many computations may wait for the one that runs. A request beyond a cap is refused
with ``INVALID_ARGUMENT`` naming the cap and the flag that raises it; a victim busier than its
queue allows answers ``RESOURCE_EXHAUSTED``. What the victim keeps between calls has byte
budgets: secure-aggregation sessions (``--secagg-memory-mb``), round parameters kept for
scoring features (``--feature-memory-mb``) and released models (``--release-memory-mb``).

``score_budget`` is how many submissions ``Score`` accepts for one round (per user set in
secure aggregation) or one release: a submission is final. More than one turns ``Score`` into
an oracle a client can climb (finite differences on the scored MSE read a private image in a
few thousand calls), so a victim started with a larger budget warns that it is unsafe.
``image_score_budget`` bounds the answers that depend on one private image over the victim's
life, whatever the round, user set or release (:mod:`~fedleak.harness.victim.scoring.budget`).

``audit_budget`` is how many audits (``BeginAudit`` … ``SubmitAuditScores``) the victim answers
over its life, and ``max_audit_trials`` the most trials one audit may run
(:mod:`~fedleak.harness.victim.audit.sessions`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedleak.harness.federated.protocol import FEDAVG, Protocol
from fedleak.harness.victim.scoring.budget import DEFAULT_IMAGE_BUDGET
from fedleak.harness.wire.request_errors import InvalidArgument

#: Default audits answered over a victim's life (``--audit-budget``).
DEFAULT_AUDIT_BUDGET = 16
#: Default most trials one audit may run (``--max-audit-trials``).
DEFAULT_MAX_AUDIT_TRIALS = 20_000

#: Printed when a victim starts with a score budget above 1.
UNSAFE_BUDGET_WARNING = (
    "WARNING: --score-budget {budget} lets a client submit {budget} reconstructions per round "
    "and read the scores: Score becomes an oracle that leaks the private images (finite "
    "differences on the MSE). Use it for research only, never on a victim an untrusted "
    "client can reach."
)
#: Printed when a victim starts with a per-image score budget above the default.
UNSAFE_IMAGE_BUDGET_WARNING = (
    "WARNING: --image-score-budget {budget} lets a client get {budget} scores that depend on "
    "one private image; finite differences read one value of the image per score. Keep it "
    "small on a victim an untrusted client can reach."
)


@dataclass(frozen=True)
class VictimLimits:
    """Caps on server-chosen work (see the module docstring)."""

    score_budget: int = 1
    image_score_budget: int = DEFAULT_IMAGE_BUDGET
    max_local_epochs: int = 100
    max_local_steps: int = 10_000
    max_learning_rate: float = 10.0
    max_queued_computations: int = 2
    secagg_memory_mb: int = 1024
    feature_memory_mb: int = 512
    release_memory_mb: int = 512
    audit_budget: int = DEFAULT_AUDIT_BUDGET
    max_audit_trials: int = DEFAULT_MAX_AUDIT_TRIALS

    def __post_init__(self) -> None:
        for name in ("score_budget", "image_score_budget", "max_local_epochs",
                     "max_local_steps", "secagg_memory_mb", "feature_memory_mb",
                     "release_memory_mb", "audit_budget", "max_audit_trials"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got "
                                 f"{getattr(self, name)}")
        if self.max_queued_computations < 0:
            raise ValueError("the computation queue length must be >= 0")
        if not (self.max_learning_rate > 0 and math.isfinite(self.max_learning_rate)):
            raise ValueError(f"--max-lr must be a positive number, got {self.max_learning_rate}")

    def check_protocol(self, protocol: Protocol, num_images: int, *, source: str) -> None:
        """Refuse a protocol beyond the caps; ``source`` says who chose it (for the message)."""
        if protocol.kind != FEDAVG:
            return
        if protocol.local_epochs > self.max_local_epochs:
            raise InvalidArgument(
                f"{source}: local_epochs {protocol.local_epochs} exceeds this victim's cap "
                f"{self.max_local_epochs} (--max-local-epochs); ask for fewer")
        steps = protocol.local_steps(num_images)
        if steps > self.max_local_steps:
            raise InvalidArgument(
                f"{source}: {steps} local steps (E={protocol.local_epochs} epochs of "
                f"⌈{num_images}/B⌉ batches, B={protocol.batch_size}) exceed this victim's cap "
                f"{self.max_local_steps} (--max-local-steps); ask for fewer epochs or a larger "
                "local batch size")
        self.check_learning_rate(protocol.learning_rate, "learning_rate", source=source)

    def check_learning_rate(self, value: float, name: str, *, source: str) -> None:
        if value > self.max_learning_rate:
            raise InvalidArgument(
                f"{source}: {name} {value:g} exceeds this victim's cap "
                f"{self.max_learning_rate:g} (--max-lr); ask for a smaller one")
