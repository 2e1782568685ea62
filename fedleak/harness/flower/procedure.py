"""The clients' local procedure, read from the round's train config, and how well it replays.

fedleak's replay (:mod:`fedleak.harness.federated.local_update`) is the user's local update: E
epochs of mini-batches of B at learning rate τ with ``torch.optim.SGD``'s momentum, weight
decay and Nesterov, batches in order or shuffled every epoch, BatchNorm as ``batchnorm`` says
— the loop people write. A Flower ClientApp trains as its author wrote it, so the audit takes
the procedure from what the server states: the config sent with every train message (the keys
the ClientApp reads) over the procedure given to the audit (``LeakageAudit(...,
procedure=LocalProcedure(...))``, for a ClientApp that reads its settings elsewhere, e.g.
Flower's quickstart, whose epochs and batch size come from the run config). It says what it
cannot replay: a key neither states (fedleak's default is then assumed: a warning), an
optimiser other than SGD, and a shuffled order that matters (the round is *inexact*,
:mod:`~fedleak.harness.federated.replay_fidelity`). Breaching #20 is the failure this prevents:
an attack on many shuffled momentum steps that no replay modelled, reported as a result.

Config keys (ConfigRecord of the train message, or ``[tool.flwr.app.config]``):
``fedleak-protocol`` (fedsgd | fedavg), ``local-epochs``, ``local-batch-size`` (0 = all),
``lr``, ``batchnorm`` (train | eval), ``momentum`` (0), ``weight-decay`` (0), ``nesterov``
(false), ``shuffle`` (false), ``optimizer`` (sgd; anything else cannot be replayed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedleak.harness.federated.protocol import Protocol, ProtocolError, changes_from_options

#: config key → the user-facing protocol option (``OPTION_FIELDS`` of the protocol module)
PROTOCOL_KEYS = {"fedleak-protocol": "kind", "local-epochs": "local_epochs",
                 "local-batch-size": "local_batch_size", "lr": "lr", "batchnorm": "batchnorm",
                 "momentum": "momentum", "weight-decay": "weight_decay",
                 "nesterov": "nesterov", "shuffle": "shuffle_batches"}
#: keys whose absence only matters for FedAvg (FedSGD sends one gradient)
FEDAVG_KEYS = ("local-epochs", "local-batch-size", "momentum", "weight-decay", "nesterov",
               "shuffle")
#: the local optimisers fedleak replays (``optimizer`` config key)
REPLAYED_OPTIMISERS = ("sgd",)
#: a reply metric a node sets when it trained with fedleak's own local update (the train helper)
REPLAYABLE_METRIC = "fedleak-replayable"
#: a reply metric naming the node's ``partition-id`` (its stable name in the audit's run)
PARTITION_METRIC = "fedleak-partition-id"


@dataclass(frozen=True)
class LocalProcedure:
    """What a client does locally each round, and what the config left unsaid."""

    protocol: Protocol
    missing: tuple[str, ...] = ()
    optimizer: str = "sgd"

    @property
    def momentum(self) -> float:
        return self.protocol.momentum

    @property
    def shuffle(self) -> bool:
        return self.protocol.shuffle

    def replay_warnings(self) -> list[str]:
        """Doubts that do not make the replay known-wrong (keys assumed)."""
        if not self.missing:
            return []
        return ["the train config does not state " + ", ".join(self.missing) +
                f"; fedleak assumed {self.assumed()}: if the clients do otherwise the replay is "
                "wrong (state them in the train config, or give LeakageAudit(procedure=...))"]

    def inexact_reasons(self, num_images: int) -> list[str]:
        """Why fedleak's replay cannot be the clients' update over ``num_images`` images, from
        the procedure alone (empty: it replays it; the shuffled order is judged per round by
        :func:`~fedleak.harness.federated.replay_fidelity.inexact_reasons`)."""
        if self.protocol.kind == "fedavg" and self.optimizer not in REPLAYED_OPTIMISERS:
            return [f"the clients train with optimizer {self.optimizer!r}; fedleak replays "
                    f"{'/'.join(REPLAYED_OPTIMISERS)} (momentum, weight decay, Nesterov) only"]
        return []

    def assumed(self) -> str:
        p = self.protocol
        if p.kind == "fedsgd":
            return f"fedsgd (one step at lr {p.learning_rate:g}), batchnorm {p.batchnorm}"
        return (f"{p.kind}, {p.local_epochs} epoch(s), batch {p.batch_size or 'all'}, lr "
                f"{p.learning_rate:g}, {p.optimiser()}, "
                f"{'shuffled' if p.shuffle else 'in-order'} batches, batchnorm {p.batchnorm}")

    def config(self) -> dict[str, Any]:
        """The ConfigRecord entries that state this procedure (sent with every train message)."""
        p = self.protocol
        return {"fedleak-protocol": p.kind, "local-epochs": p.local_epochs,
                "local-batch-size": p.batch_size, "lr": float(p.learning_rate),
                "batchnorm": p.batchnorm, "momentum": float(p.momentum),
                "weight-decay": float(p.weight_decay), "nesterov": p.nesterov,
                "shuffle": p.shuffle, "optimizer": self.optimizer}

    @classmethod
    def of(cls, **options: Any) -> LocalProcedure:
        """A stated procedure from the protocol's user-facing names (``kind="fedavg",
        local_epochs=1, local_batch_size=32, lr=0.1, momentum=0.9, shuffle=True``; ``shuffle``
        is the config key's name for ``shuffle_batches``)."""
        optimizer = str(options.pop("optimizer", "sgd")).lower()
        if "shuffle" in options:
            options["shuffle_batches"] = options.pop("shuffle")
        try:
            return cls(Protocol.from_options(options), optimizer=optimizer)
        except ProtocolError as err:
            raise ValueError(f"LocalProcedure: {err}") from None


def procedure_from_config(config: Mapping[str, Any], stated: LocalProcedure | None = None
                          ) -> LocalProcedure:
    """The procedure a train config states over ``stated`` (what the server said its clients
    do); keys neither gives take fedleak's defaults and are named in
    :meth:`LocalProcedure.replay_warnings`. Raises ``ProtocolError`` on bad values."""
    base = stated.protocol if stated is not None else Protocol()
    options = {option: config[key] for key, option in PROTOCOL_KEYS.items() if key in config}
    for key in ("momentum", "weight-decay"):  # a ConfigRecord may carry 0 as an int
        if isinstance(options.get(PROTOCOL_KEYS[key]), int) and \
                not isinstance(options[PROTOCOL_KEYS[key]], bool):
            options[PROTOCOL_KEYS[key]] = float(options[PROTOCOL_KEYS[key]])
    protocol = base.with_changes(changes_from_options(options))  # validated
    missing: list[str] = []
    if stated is None:
        missing = [key for key in PROTOCOL_KEYS if key not in config]
        if protocol.kind == "fedsgd":  # one gradient: epochs, batches, optimiser do not apply
            missing = [k for k in missing if k not in FEDAVG_KEYS]
    optimizer = config.get("optimizer", stated.optimizer if stated is not None else "sgd")
    if not isinstance(optimizer, str):
        raise ProtocolError(f"optimizer must be a name (sgd), got {optimizer!r}")
    return LocalProcedure(protocol, tuple(missing), optimizer.lower())

