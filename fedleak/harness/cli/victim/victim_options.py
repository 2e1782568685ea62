"""Every option that says which victim ``fedleak victim serve`` is, by concern.

:class:`VictimOptions` holds one typed object per concern (private data, text data, model,
protocol, federated users, defenses, scoring, audit games, model release, request limits, memory);
:func:`victim_options` declares all their options and hands the command one
:class:`VictimOptions`; :data:`VICTIM_SECTIONS` is how ``--help`` heads them. A new option goes
into its concern's object and decorator (``data_options.py``, ``federation_options.py``,
``game_options.py``, ``limit_options.py``); a new concern into all three here.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedleak.harness.cli.help_sections import Section
from fedleak.harness.cli.options import F, ProtocolOptions, packed, protocol_options
from fedleak.harness.cli.text_options import TextOptions, text_options
from fedleak.harness.cli.victim.data_options import (
    DataOptions,
    ModelOptions,
    data_options,
    model_options,
)
from fedleak.harness.cli.victim.federation_options import (
    DefenseOptions,
    FederatedUserOptions,
    defense_options,
    federation_options,
)
from fedleak.harness.cli.victim.game_options import (
    AuditOptions,
    ReleaseOptions,
    ScoringOptions,
    audit_options,
    release_options,
    scoring_options,
)
from fedleak.harness.cli.victim.limit_options import (
    MemoryOptions,
    RequestLimitOptions,
    memory_options,
    request_limit_options,
)


@dataclass(frozen=True)
class VictimOptions:
    """Which victim to serve, as the options give it, by concern."""

    data: DataOptions
    text: TextOptions
    model: ModelOptions
    protocol: ProtocolOptions
    federation: FederatedUserOptions
    defenses: DefenseOptions
    scoring: ScoringOptions
    audit: AuditOptions
    release: ReleaseOptions
    requests: RequestLimitOptions
    memory: MemoryOptions


def victim_options(function: F) -> F:
    """Every option of the victim, handed to the command as ``victim``."""
    return packed(VictimOptions, "victim", [
        data_options, text_options, model_options, protocol_options(victim=True),
        federation_options, defense_options, scoring_options, audit_options, release_options,
        request_limit_options, memory_options,
    ])(function)


#: The headings of the victim's options in ``--help``, in order.
VICTIM_SECTIONS: tuple[Section, ...] = (
    ("Private data", DataOptions), ("Text data", TextOptions), ("Model", ModelOptions),
    ("Protocol", ProtocolOptions), ("Federated users", FederatedUserOptions),
    ("Defenses", DefenseOptions), ("Scoring and reveal", ScoringOptions),
    ("Audit games", AuditOptions), ("Model release", ReleaseOptions),
    ("What a server may ask", RequestLimitOptions), ("State kept", MemoryOptions),
)
