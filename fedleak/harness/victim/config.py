"""What defines a victim (:class:`VictimConfig`): its model, protocol, defense chain, users,
limits and which of the server's requests it answers; public except the data and the token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedleak.defenses import DefenseChain
from fedleak.harness.federated.protocol import FEDAVG, Protocol
from fedleak.harness.victim.limits import VictimLimits
from fedleak.harness.victim.release.releaser import ReleaseSettings
from fedleak.harness.zoo.models import ModelSpec


@dataclass(frozen=True)
class VictimConfig:
    """Everything that defines a victim; public except the data itself and the token."""

    model: ModelSpec
    protocol: Protocol
    num_images: int = 1
    reveal_enabled: bool = False
    device: str = "cpu"
    defenses: DefenseChain = field(default_factory=DefenseChain)
    num_users: int = 1
    secagg_drops: dict[int, str] = field(default_factory=dict)
    release: ReleaseSettings = field(default_factory=ReleaseSettings)
    limits: VictimLimits = field(default_factory=VictimLimits)
    #: which split of the data set the private pool was drawn from (public: Describe says it)
    split: str = ""
    #: when an update carries the buffers local training left (:data:`BUFFER_MODES`)
    buffers_returned: str = "fedavg"
    #: whether the victim plays the audit game (``--allow-audit``)
    audit_enabled: bool = False

    def __post_init__(self) -> None:
        if self.buffers_returned not in BUFFER_MODES:
            raise ValueError(f"buffers must be one of {', '.join(BUFFER_MODES)}, got "
                             f"{self.buffers_returned!r}")

    def returns_buffers(self, protocol: Protocol) -> bool:
        """Whether a round run under ``protocol`` sends its buffers with the update."""
        return self.buffers_returned == "always" or (
            self.buffers_returned == "fedavg" and protocol.kind == FEDAVG)


#: When a victim's updates carry its buffers: never, in FedAvg rounds (as a FedAvg client
#: sending its ``state_dict`` does; the default), always.
BUFFER_MODES = ("never", "fedavg", "always")
