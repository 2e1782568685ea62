"""``secagg``: the transport-stage defense that runs secure aggregation among the victim's users.

The mechanism is :mod:`fedleak.defenses.secagg` (Bonawitz et al. 2017). This registry entry
carries its public parameters — the Shamir threshold t and the clipping range c of the
fixed-point quantisation — so ``--defense secagg:threshold=3,clip=0.05`` configures it and
``Describe`` publishes it. The server learns only Σ_{u∈U3} clip(Δ_u) (up to quantisation).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedleak.defenses.base import TransportDefense
from fedleak.defenses.registry import register_defense
from fedleak.defenses.secagg import SecAggConfig


@dataclass
class SecAggDefenseConfig:
    threshold: int = field(default=0, metadata={
        "help": "Shamir threshold t (0: a majority, floor(K/2)+1, at least 2)"})
    clip: float = field(default=1.0, metadata={
        "help": "each update coordinate is clipped to [-clip, clip] before quantisation"})

    def __post_init__(self) -> None:
        if self.threshold < 0 or self.threshold == 1:
            raise ValueError(f"threshold must be 0 (majority) or >= 2, got {self.threshold}")
        if not self.clip > 0:
            raise ValueError(f"clip must be positive, got {self.clip}")


@register_defense("secagg")
class SecureAggregation(TransportDefense):
    """Secure aggregation of K users' updates; only the (clipped, quantised) sum is revealed."""

    stage = "transport"
    Config = SecAggDefenseConfig

    def threshold(self, num_users: int) -> int:
        t = self.config.threshold or max(2, num_users // 2 + 1)
        if not 2 <= t <= num_users:
            raise ValueError(f"secagg threshold {t} needs 2 <= t <= users ({num_users}); "
                             "start the victim with more --users or lower the threshold")
        return t

    def session_config(self, num_users: int, vector_length: int, session: int) -> SecAggConfig:
        """The public parameters of one aggregation round."""
        return SecAggConfig(threshold=self.threshold(num_users), clip=self.config.clip,
                            vector_length=vector_length, num_users=num_users, session=session)
