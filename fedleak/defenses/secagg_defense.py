"""``secagg``: the transport-stage defense that runs secure aggregation among the victim's users.

The mechanism is :mod:`fedleak.defenses.secagg` (Bonawitz et al. 2017). This registry entry
carries its public parameters — the Shamir threshold t and the clipping range c of the
fixed-point quantisation — so ``--defense secagg:threshold=3,clip=0.05`` configures it and
``Describe`` publishes it. The server learns only Σ_{u∈U3} clip(Δ_u) (up to quantisation).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedleak.defenses.defense_registry import register_defense
from fedleak.defenses.mechanism import PER_COORDINATE, TRANSPORT, Clip, Mechanism
from fedleak.defenses.secagg import SecAggConfig
from fedleak.defenses.stages import TransportDefense


@dataclass
class SecAggDefenseConfig:
    """Secure aggregation's public parameters: the Shamir threshold t and the clip range c."""

    threshold: int = field(default=0, metadata={
        "help": "Shamir threshold t (0: a majority, floor(K/2)+1, at least 2)"})
    clip: float = field(default=1.0, metadata={
        "help": "each update coordinate is clipped to [-clip, clip] before quantisation"})
    allow_minority: bool = field(default=False, metadata={
        "help": "accept a threshold t <= K/2 (unsafe: a server that sends different survivor "
                "lists to different users can unmask one user's update)"})

    def __post_init__(self) -> None:
        """Refuse a threshold of 1 or below 0 and a clip range that is not positive."""
        if self.threshold < 0 or self.threshold == 1:
            raise ValueError(f"threshold must be 0 (majority) or >= 2, got {self.threshold}")
        if not self.clip > 0:
            raise ValueError(f"clip must be positive, got {self.clip}")


@register_defense("secagg")
class SecAgg(TransportDefense):
    """Secure aggregation of K users' updates; only the (clipped, quantised) sum is revealed."""

    stage = "transport"
    Config = SecAggDefenseConfig

    def threshold(self, num_users: int) -> int:
        """Return t of the t-of-K Shamir sharing: a majority of users unless allowed otherwise.

        Below a majority the honest-but-curious guarantee rests on the server sending every
        user the same survivor list in the unmasking round: with two disjoint lists, two
        groups of t users each reveal a different secret of the same user (its self-mask seed
        to one group, its mask key to the other), and that user's update is unmasked. The full
        protocol (Bonawitz et al. 2017, the "active" version) adds a consistency round in which
        users sign and exchange the survivor list; fedleak does not implement it, so it refuses
        t <= K/2 unless ``allow-minority=true``.
        """
        t = self.config.threshold or max(2, num_users // 2 + 1)
        if not 2 <= t <= num_users:
            raise ValueError(f"secagg threshold {t} needs 2 <= t <= users ({num_users}); "
                             "start the victim with more --users or lower the threshold")
        if 2 * t <= num_users and not self.config.allow_minority:
            raise ValueError(
                f"secagg threshold {t} of {num_users} users is not a majority: a server that "
                "sends different survivor lists to different users could unmask one user's "
                f"update; use threshold >= {num_users // 2 + 1}, or add allow-minority=true "
                "to accept that risk (docs/security.md)")
        return t

    def minority_warning(self, num_users: int) -> str | None:
        """Return a warning to print when a minority threshold was explicitly allowed."""
        t = self.threshold(num_users)
        if 2 * t > num_users:
            return None
        return (f"WARNING: secure aggregation with threshold {t} of {num_users} users (not a "
                "majority, allow-minority=true): a server that sends different survivor lists "
                "to different users can unmask one user's update")

    def session_config(self, num_users: int, vector_length: int, session: int) -> SecAggConfig:
        """Return the public parameters of one aggregation round."""
        return SecAggConfig(threshold=self.threshold(num_users), clip=self.config.clip,
                            vector_length=vector_length, num_users=num_users, session=session)

    def mechanism(self) -> Mechanism:
        """Declare the transport stage: each coordinate clipped to ±clip and quantised.

        No noise: secure aggregation hides single updates from the server, it adds no DP of its
        own.
        """
        return Mechanism(TRANSPORT, clip=Clip(self.config.clip, PER_COORDINATE))
