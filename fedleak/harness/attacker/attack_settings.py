"""How the server attacks: one typed object from the CLI (or a sweep) to the attack runs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from fedleak.harness.federated.protocol import ProtocolChanges


@dataclass(frozen=True)
class ReleaseRequest:
    """What the server asks of a model release (0 keeps the victim's default for that field).

    ``max_epochs`` may not exceed the victim's own budget.
    """

    learning_rate: float = 0.0
    max_epochs: int = 0
    target_loss: float = 0.0
    report_every: int = 0


@dataclass
class AttackSettings:
    """Which attack with which options, against which θ, on which device, for how long.

    ``protocol`` holds the fields of the victim's protocol the server chooses for each round
    (the rest stay the victim's); ``release`` and ``recovered_ssim`` apply to attacks on a
    released model (kkt).
    """

    attack: str = "inverting-gradients"
    options: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    seed: int = 0
    rounds: int = 1
    checkpoint: str | None = None
    model_seed: int | None = None
    protocol: ProtocolChanges = field(default_factory=lambda: ProtocolChanges())
    flip_labels: tuple[int, int] | None = None
    secagg_target: str = "sum"
    show_progress: bool = True
    release: ReleaseRequest = field(default_factory=ReleaseRequest)
    recovered_ssim: float = 0.0
    #: rounds attacked as one packed computation (same result per round; faster on a GPU)
    pack: int = 1

    def __post_init__(self) -> None:
        if self.pack < 1:
            raise ValueError(f"pack must be >= 1, got {self.pack}")
        target = self.secagg_target
        if target != "sum" and not (target.startswith("user:") and target[5:].isdigit()):
            raise ValueError(f"secagg target {target!r}: use sum or user:U")

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values, as ``metrics.json`` records them."""
        return jsonable(dataclasses.asdict(self))


def jsonable(value: Any) -> Any:
    """``value`` made of JSON types only (anything else as its ``str``)."""
    import json

    return json.loads(json.dumps(value, default=str))
