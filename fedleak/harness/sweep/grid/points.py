"""The points of a sweep's grid: what one measurement is, as typed, hashable data.

A :class:`Point` is one combination of attack × model × protocol × trained/untrained × defense
setting (or attack × a victim the user runs). Its ``point_id`` is a hash of the canonical JSON
of everything that is measured — the protocol by its user-facing names, as a spec writes it —
so the same spec always yields the same ids and a results store can skip finished points.
A point starts its victims from typed settings (:meth:`Point.victim_settings`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import asdict, dataclass
from typing import Any

from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.victim.settings import VictimSettings

SCHEDULES = ("cosine", "constant")
# Point fields that label a point for the report but do not change what is measured.
_LABEL_FIELDS = ("label", "group", "param", "strength", "reference")


class SpecError(ValueError):
    """A spec that cannot be expanded; the message names the table and what to change."""


@dataclass(frozen=True)
class UtilitySettings:
    """Federated training for the utility measurement: R rounds of B images at rate η.

    FedSGD: θ ← θ − η_r·g with η_r = η·½(1 + cos(π r/R)) (``cosine``) or η (``constant``).
    FedAvg: θ ← θ + Δ (the user's local learning rate is the protocol's ``lr``).
    """

    enabled: bool = True
    rounds: int = 150
    batch_size: int = 4
    lr: float = 0.5
    schedule: str = "cosine"
    evaluations: int = 10

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.batch_size < 1 or self.evaluations < 1:
            raise SpecError("sweep.utility: rounds, batch_size and evaluations must be >= 1")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise SpecError(f"sweep.utility: lr must be positive, got {self.lr}")
        if self.schedule not in SCHEDULES:
            raise SpecError(f"sweep.utility: schedule must be one of {', '.join(SCHEDULES)}, "
                            f"got {self.schedule!r}")


@dataclass(frozen=True)
class PointResources:
    """What one point needs of a Ray node (``[sweep.resources]``); not part of a point's id.

    A point given ``num_gpus > 0`` runs its attack with ``device=cuda`` on the GPU Ray gives it.
    """

    num_cpus: float = 1.0
    num_gpus: float = 0.0

    def __post_init__(self) -> None:
        for name in ("num_cpus", "num_gpus"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 \
                    or not math.isfinite(value):
                raise SpecError(f"sweep.resources.{name} must be a number >= 0, got {value!r}")
        if self.num_cpus == 0 and self.num_gpus == 0:
            raise SpecError("sweep.resources: a point needs some num_cpus or num_gpus")

    @property
    def device(self) -> str:
        """Where a point's attack runs."""
        return "cuda" if self.num_gpus > 0 else "cpu"

    @property
    def threads(self) -> int:
        """Torch threads for a point's attack and victims: its CPUs, at least one."""
        return max(1, int(self.num_cpus))


@dataclass(frozen=True)
class DefenseSetting:
    """One value of the defense axis: a chain of ``name:key=value`` specs and its labels."""

    chain: tuple[str, ...]
    label: str
    group: str
    param: str | None = None
    strength: float | None = None
    reference: bool = False
    #: users behind the victim (secure aggregation among them; 1 otherwise)
    users: int = 1
    #: the protocol this setting is deployed with, instead of the grid's (None: the grid's)
    protocol: Protocol | None = None
    #: fields of [sweep.utility] this setting overrides (e.g. more images per round)
    utility: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Point:
    """One measurement setting: attack K private batches, train for utility, read ε."""

    attack: str
    attack_options: dict[str, Any]
    model: str
    dataset: str
    split: str
    images: str
    protocol: Protocol | None
    defenses: tuple[str, ...]
    trained: bool | str
    rounds: int
    batch_size: int
    seed: int
    utility: dict[str, Any]
    train_epochs: int = 20
    data_root: str | None = None
    victim: str | None = None
    label: str = ""
    group: str = "none"
    param: str | None = None
    strength: float | None = None
    reference: bool = False
    #: users behind the victim, each with ``batch_size`` images per round (secure aggregation)
    users: int = 1
    #: the audit game to play against the point's victim (``[sweep.audit]``), or None
    audit: dict[str, Any] | None = None
    #: text data sets: tokens per sequence (None: the victim's default)
    seq_len: int | None = None

    def measured(self) -> dict[str, Any]:
        """Everything that determines the measurement, as plain JSON values (the protocol by
        its user-facing names, as the spec writes it). ``users`` appears only above 1 and
        ``audit`` only when set, so the ids of points without them are what they were before
        they existed."""
        data = self._json()
        for key in _LABEL_FIELDS:
            data.pop(key)
        if data.get("users") == 1:
            data.pop("users")
        if data.get("audit") is None:
            data.pop("audit", None)
        if data.get("seq_len") is None:
            data.pop("seq_len", None)
        return data

    def _json(self) -> dict[str, Any]:
        data = asdict(self)
        data["defenses"] = list(self.defenses)
        data["protocol"] = self.protocol.options() if self.protocol is not None else {}
        return data

    @property
    def point_id(self) -> str:
        """A stable id: the first 16 hex digits of SHA-256 over :meth:`measured` as JSON."""
        text = json.dumps(self.measured(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def utility_id(self) -> str:
        """The id of what the utility measurement depends on: :meth:`measured` without the
        attack, so the attacks of a portfolio share one utility measurement per setting."""
        data = {k: v for k, v in self.measured().items()
                if k not in ("attack", "attack_options", "rounds", "audit")}
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def audit_id(self) -> str:
        """The id of what the audit depends on: :meth:`measured` without the attack and the
        utility training (the game measures the victim's defended update, whoever attacks it),
        so the attacks of a portfolio share one audit per setting."""
        data = {k: v for k, v in self.measured().items()
                if k not in ("attack", "attack_options", "utility")}
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def utility_settings(self) -> UtilitySettings:
        return UtilitySettings(**self.utility)

    def to_json(self) -> str:
        return json.dumps(self._json(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Point:
        data = json.loads(text)
        data["defenses"] = tuple(data["defenses"])
        data["protocol"] = Protocol.from_options(data["protocol"]) if data["protocol"] else None
        return cls(**data)

    def victim_settings(self) -> VictimSettings:
        """The victim this point measures (its data, model, protocol, defenses), before the
        attack or utility measurement says which images it holds."""
        if self.protocol is None:
            raise ValueError(f"point {self.label!r} measures a victim the user runs "
                             f"({self.victim}); fedleak does not start it")
        settings = VictimSettings(dataset=self.dataset, model=self.model, seed=self.seed,
                                  protocol=self.protocol, data_root=self.data_root,
                                  defenses=self.defenses, users=self.users)
        if self.seq_len is not None:
            settings = dataclasses.replace(settings, seq_len=self.seq_len)
        return settings
