"""The clients' local procedure, read from the round's train config, and how well it replays.

fedleak's replay (:mod:`fedleak.harness.shared.local_update`) is the user's local update:
E epochs of in-order mini-batches of B at learning rate τ, plain SGD, BatchNorm as
``batchnorm`` says. A Flower ClientApp trains as its author wrote it, so the audit takes the
procedure from the config the server sends with every train message (the same keys the
ClientApp reads), and says loudly what it cannot replay: a key the config leaves out (fedleak's
default is then assumed), momentum (every step after the first moves differently), shuffled
batches (the replay cannot know the order), or a node that trained with its own loop and did
not report fedleak's marker. Breaching #20 is the failure this prevents: an attack on many
shuffled local steps that no replay modelled, failing silently.

Config keys (ConfigRecord of the train message, or ``[tool.flwr.app.config]``):
``fedleak-protocol`` (fedsgd | fedavg), ``local-epochs``, ``local-batch-size`` (0 = all),
``lr``, ``batchnorm`` (train | eval), ``momentum`` (0), ``shuffle`` (false).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedleak.harness.shared.protocol import Protocol, ProtocolError

#: config key → the user-facing protocol option (``OPTION_FIELDS`` of the protocol module)
PROTOCOL_KEYS = {"fedleak-protocol": "kind", "local-epochs": "local_epochs",
                 "local-batch-size": "local_batch_size", "lr": "lr", "batchnorm": "batchnorm"}
#: a reply metric a node sets when it trained with fedleak's own local update (the train helper)
REPLAYABLE_METRIC = "fedleak-replayable"


@dataclass(frozen=True)
class LocalProcedure:
    """What a client does locally each round, and what the config left unsaid."""

    protocol: Protocol
    momentum: float = 0.0
    shuffle: bool = False
    missing: tuple[str, ...] = ()

    def replay_warnings(self) -> list[str]:
        """Why a replay of this procedure may not be the client's update (empty: exact)."""
        out = []
        if self.momentum:
            out.append(f"the clients train with momentum {self.momentum:g}; fedleak replays "
                       "plain SGD, so every local step after the first differs and the attack "
                       "inverts the wrong update")
        if self.shuffle:
            out.append("the clients shuffle their local batches; fedleak replays them in order "
                       "and cannot know the order, so a multi-step replay is wrong (breaching "
                       "#20's silent failure): set shuffle = false, or use one local step")
        if self.missing:
            out.append("the train config does not state " + ", ".join(self.missing) +
                       f"; fedleak assumed {self.assumed()}: if the clients do otherwise the "
                       "replay is wrong")
        return out

    def assumed(self) -> str:
        p = self.protocol
        return (f"{p.kind}, {p.local_epochs} epoch(s), batch {p.batch_size or 'all'}, lr "
                f"{p.learning_rate:g}, batchnorm {p.batchnorm}")

    def config(self) -> dict[str, Any]:
        """The ConfigRecord entries that state this procedure (sent with every train message)."""
        p = self.protocol
        return {"fedleak-protocol": p.kind, "local-epochs": p.local_epochs,
                "local-batch-size": p.batch_size, "lr": float(p.learning_rate),
                "batchnorm": p.batchnorm, "momentum": float(self.momentum),
                "shuffle": self.shuffle}


def procedure_from_config(config: Mapping[str, Any]) -> LocalProcedure:
    """The procedure a train config states; missing keys take fedleak's defaults (and are
    named in :meth:`LocalProcedure.replay_warnings`). Raises ``ProtocolError`` on bad values."""
    options = {option: config[key] for key, option in PROTOCOL_KEYS.items() if key in config}
    protocol = Protocol.from_options(options)
    missing = [key for key in PROTOCOL_KEYS if key not in config]
    if protocol.kind == "fedsgd":  # one gradient: epochs and batches do not apply
        missing = [k for k in missing if k not in ("local-epochs", "local-batch-size")]
    momentum = config.get("momentum", 0.0)
    if isinstance(momentum, bool) or not isinstance(momentum, int | float) or momentum < 0:
        raise ProtocolError(f"momentum must be a number >= 0, got {momentum!r}")
    shuffle = config.get("shuffle", False)
    if not isinstance(shuffle, bool):
        raise ProtocolError(f"shuffle must be true or false, got {shuffle!r}")
    for key in ("momentum", "shuffle"):
        if key not in config and protocol.kind == "fedavg":
            missing.append(key)
    return LocalProcedure(protocol, float(momentum), shuffle, tuple(missing))
