"""The FL protocol: how a user turns global parameters and private data into an update.

One typed object, :class:`Protocol`, carries it from every place a person or a server chooses it
to the maths: the CLI (``--protocol``, ``--local-epochs``, ``--local-batch-size``, ``--lr``,
``--batchnorm``, ``--momentum``, ``--weight-decay``, ``--nesterov``, ``--shuffle-batches``), a sweep
spec's ``[[sweep.protocol]]`` table (the same names), the attacker's per-round request (a
:class:`ProtocolChanges`), the wire (``fedleak.harness.wire.protocol_spec``) and the user's local
update (:mod:`fedleak.harness.federated.local_update`). The user-facing names are converted to the
fields in one place, :data:`OPTION_FIELDS`.

- ``kind``: ``fedsgd`` sends one gradient over the n private images; ``fedavg`` sends the
  parameter delta after E local epochs of mini-batches of B at learning rate τ (Inverting
  Gradients supplement eq. 1).
- ``local_epochs`` E, ``batch_size`` B (0 = all n images in one batch) and ``learning_rate`` τ
  only matter for FedAvg.
- ``batchnorm``: ``train`` normalises with the batch's statistics, ``eval`` with the running
  ones (Geiping et al.'s setting); no effect on models without BatchNorm.
- ``momentum`` μ, ``weight_decay`` λ, ``nesterov``: FedAvg's local optimiser is
  ``torch.optim.SGD`` with these settings (dampening 0), the loop people write; 0, 0, False is
  plain SGD.
- ``shuffle``: FedAvg draws a new order of its n images every epoch (a ``DataLoader`` with
  ``shuffle=True``) from a generator the server never sees; False takes them in order.

All four only matter for FedAvg (FedSGD sends one gradient, no optimiser step).
"""

from __future__ import annotations

import dataclasses
import math
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

FEDSGD = "fedsgd"
FEDAVG = "fedavg"
PROTOCOLS = (FEDSGD, FEDAVG)
BATCHNORM_MODES = ("train", "eval")

#: User-facing option name (CLI flag without ``--``, sweep TOML key) → :class:`Protocol` field.
OPTION_FIELDS = {
    "kind": "kind",
    "local_epochs": "local_epochs",
    "local_batch_size": "batch_size",
    "lr": "learning_rate",
    "batchnorm": "batchnorm",
    "momentum": "momentum",
    "weight_decay": "weight_decay",
    "nesterov": "nesterov",
    "shuffle_batches": "shuffle",
}
#: the optimiser and order fields, left out of :meth:`Protocol.options` at their defaults (so
#: point ids of specs written before they existed do not change)
OPTIMISER_DEFAULTS = {"momentum": 0.0, "weight_decay": 0.0, "nesterov": False,
                      "shuffle_batches": False}


class ProtocolError(ValueError):
    """Protocol settings that cannot describe a local update; the message says what to change."""


class ProtocolChanges(TypedDict, total=False):
    """A server's choice of some protocol fields for one round; the rest stay the user's."""

    kind: str
    local_epochs: int
    batch_size: int
    learning_rate: float
    batchnorm: str
    momentum: float
    weight_decay: float
    nesterov: bool
    shuffle: bool


@dataclass(frozen=True)
class Protocol:
    """How the user turns global parameters and private data into an update (module doc)."""

    kind: str = FEDSGD
    local_epochs: int = 1
    batch_size: int = 0
    learning_rate: float = 1e-4
    batchnorm: str = "train"
    momentum: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    shuffle: bool = False

    def __post_init__(self) -> None:
        for name in ("local_epochs", "batch_size", "learning_rate", "momentum", "weight_decay"):
            if isinstance(getattr(self, name), bool):
                raise ProtocolError(f"{name} must be a number, got {getattr(self, name)!r}")
        for name in ("learning_rate", "momentum", "weight_decay"):
            if isinstance(getattr(self, name), int):  # lr = 1 in a TOML file
                object.__setattr__(self, name, float(getattr(self, name)))
        if self.kind not in PROTOCOLS:
            raise ProtocolError(f"unknown protocol {reprlib.repr(self.kind)}; choose one of "
                                f"{PROTOCOLS}")
        if not isinstance(self.local_epochs, int) or self.local_epochs < 1:
            raise ProtocolError(f"local_epochs must be an integer >= 1, got {self.local_epochs!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 0:
            raise ProtocolError(f"batch_size must be an integer >= 0 (0 = full batch), got "
                                f"{self.batch_size!r}")
        if not (isinstance(self.learning_rate, int | float) and self.learning_rate > 0
                and math.isfinite(self.learning_rate)):
            raise ProtocolError(f"learning_rate must be positive, got {self.learning_rate!r}")
        if self.batchnorm not in BATCHNORM_MODES:
            raise ProtocolError(f"unknown batchnorm mode {reprlib.repr(self.batchnorm)}; choose "
                                f"one of {BATCHNORM_MODES}")
        for name in ("momentum", "weight_decay"):
            value = getattr(self, name)
            if not (isinstance(value, float) and value >= 0 and math.isfinite(value)):
                raise ProtocolError(f"{name} must be a number >= 0, got {value!r}")
        for name in ("nesterov", "shuffle"):
            if not isinstance(getattr(self, name), bool):
                raise ProtocolError(f"{name} must be true or false, got "
                                    f"{getattr(self, name)!r}")
        if self.nesterov and self.momentum == 0:
            raise ProtocolError("nesterov needs a momentum > 0 (torch.optim.SGD refuses it "
                                "too); set momentum or drop nesterov")

    def local_steps(self, num_images: int) -> int:
        """Number of SGD steps the user takes over ``num_images`` images."""
        if self.kind == FEDSGD:
            return 1
        return self.local_epochs * len(local_batches(num_images, self.batch_size))

    def batches_per_epoch(self, num_images: int) -> int:
        """How many mini-batches one local epoch over ``num_images`` images takes (FedAvg)."""
        return len(local_batches(num_images, self.batch_size))

    def order_matters(self, num_images: int) -> bool:
        """Whether the user's unseen shuffling changes its update: FedAvg with ``shuffle`` and
        more than one mini-batch per epoch (one batch of all n images is the same set, whatever
        its order: the mean loss and the batch statistics do not depend on it)."""
        return (self.kind == FEDAVG and self.shuffle
                and self.batches_per_epoch(num_images) > 1)

    def step_weights(self, num_images: int) -> list[float]:
        """The first-order weight w_s of local step s's gradient in the delta: with every
        gradient taken at θ_k, Δ ≈ −τ Σ_s w_s g_s. ``torch.optim.SGD``'s heavy ball sums
        v_m = Σ_{s≤m} μ^{m−s} g_s over the L steps, so w_s = Σ_{m=s}^{L} μ^{m−s}; Nesterov's
        step g_m + μ v_m gives w_s = 1 + μ Σ_{m=s}^{L} μ^{m−s}; plain SGD, w_s = 1 (weight
        decay adds a term that does not depend on the data). FedSGD: [1]."""
        steps = self.local_steps(num_images)
        mu = self.momentum if self.kind == FEDAVG else 0.0
        heavy = [sum(mu ** (m - s) for m in range(s, steps)) for s in range(steps)]
        return [1 + mu * h for h in heavy] if self.nesterov and mu else heavy

    def optimiser(self) -> str:
        """The local optimiser in words (``SGD``, ``SGD momentum 0.9, weight decay 5e-4``)."""
        parts = []
        if self.momentum:
            parts.append(("Nesterov " if self.nesterov else "") + f"momentum {self.momentum:g}")
        if self.weight_decay:
            parts.append(f"weight decay {self.weight_decay:g}")
        return "SGD" + (" " + ", ".join(parts) if parts else "")

    def update_kind(self) -> str:
        """``gradient`` for FedSGD, ``delta`` for FedAvg."""
        return "gradient" if self.kind == FEDSGD else "delta"

    @property
    def local_learning_rate(self) -> float | None:
        """τ when the user trains locally (FedAvg), None for FedSGD."""
        return self.learning_rate if self.kind == FEDAVG else None

    def with_changes(self, changes: ProtocolChanges | Mapping[str, Any]) -> Protocol:
        """This protocol with the given fields replaced (validated like any protocol)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ProtocolError(f"unknown protocol field(s) {unknown}")
        try:
            return dataclasses.replace(self, **changes)
        except TypeError as err:
            raise ProtocolError(str(err)) from None

    def options(self) -> dict[str, Any]:
        """The user-facing form (sweep TOML keys); ``batchnorm`` only when not ``train``, the
        optimiser and order fields only when not at their defaults."""
        out: dict[str, Any] = {name: getattr(self, field) for name, field in
                               OPTION_FIELDS.items()
                               if name != "batchnorm" and name not in OPTIMISER_DEFAULTS}
        out["lr"] = float(out["lr"])
        if self.batchnorm != "train":
            out["batchnorm"] = self.batchnorm
        for name, default in OPTIMISER_DEFAULTS.items():
            if getattr(self, OPTION_FIELDS[name]) != default:
                out[name] = getattr(self, OPTION_FIELDS[name])
        return out

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Protocol:
        """Build from user-facing names (unset or None keys keep the defaults)."""
        return cls().with_changes(changes_from_options(options))


def changes_from_options(options: Mapping[str, Any]) -> ProtocolChanges:
    """User-facing names → protocol fields, dropping unset (None) ones; unknown names refused."""
    unknown = sorted(set(options) - set(OPTION_FIELDS))
    if unknown:
        raise ProtocolError(f"unknown protocol option(s) {', '.join(unknown)}; valid: "
                            f"{', '.join(OPTION_FIELDS)}")
    changes: dict[str, Any] = {OPTION_FIELDS[k]: v for k, v in options.items() if v is not None}
    return ProtocolChanges(**changes)  # type: ignore[typeddict-item]


def local_batches(n: int, batch_size: int) -> list[slice]:
    """The user's in-order mini-batches of ``batch_size`` over ``n`` images (0: one batch)."""
    size = n if batch_size in (0, None) or batch_size >= n else batch_size
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]
