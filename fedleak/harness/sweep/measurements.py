"""The typed measurements of one sweep point, as the results store keeps them (JSON).

A point has at most one :class:`AttackMeasurement` (leakage over K attacked rounds) and one
:class:`UtilityMeasurement` (test accuracy after federated training through the defended path).
Both are written to the store with :meth:`to_json` the moment they finish, and read back with
:meth:`from_json`, which ignores keys it does not know and leaves missing optional ones unset,
so stores written by other fedleak versions still load.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

M = TypeVar("M")


def _from_json(cls: type[M], data: dict[str, Any]) -> M:
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class RoundMeasurement:
    """One attacked round: its scores, the victim's ε after it, its pictures (run-relative)."""

    mean_psnr: float | None = None
    mean_ssim: float | None = None
    label_accuracy: float | None = None
    epsilon_total: float | None = None
    files: dict[str, str] = field(default_factory=dict)


@dataclass
class AttackMeasurement:
    """Leakage of one point: the attack's means over K rounds, and what the victim ran."""

    attack: str
    model: str
    dataset: str
    run: str
    images: int = 0
    mean_psnr: float | None = None
    mean_ssim: float | None = None
    label_accuracy: float | None = None
    wall_time_s: float = 0.0
    rounds: list[RoundMeasurement] = field(default_factory=list)
    epsilon: float | None = None
    delta: float | None = None
    defenses: list[str] = field(default_factory=list)
    measure_time_s: float = 0.0
    mean_feature_cosine: float | None = None
    mean_feature_relative_error: float | None = None
    node: str | None = None  # the Ray node that measured it (--ray)
    #: which server attacked: honest, malicious-parameters, malicious-architecture
    server_role: str = "honest"
    #: images recovered exactly (PSNR >= 40 dB) over the point's rounds
    exact: int | None = None
    #: success at a PSNR threshold (:mod:`fedleak.harness.shared.success_bounds`): images at
    #: success_psnr dB or above, their share, κ of the public prior (and its upper end) and the
    #: DP bound β(κ) of the attacked rounds' mechanism (σ, q, T), with its method
    success_psnr: float | None = None
    successes: int | None = None
    success_rate: float | None = None
    kappa: float | None = None
    kappa_upper: float | None = None
    reconstruction_bound: float | None = None
    reconstruction_bound_se: float | None = None
    bound_method: str | None = None
    noise_multiplier: float | None = None
    sample_rate: float | None = None
    dp_steps: int | None = None
    #: mean Fisher-information PSNR ceiling of the attacked images (the victim's, Guo et al.)
    fisher_psnr_ceiling: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AttackMeasurement:
        made = _from_json(cls, data)
        made.rounds = [_from_json(RoundMeasurement, r) for r in data.get("rounds", [])]
        return made


@dataclass
class UtilityMeasurement:
    """Utility of one point: test accuracy along federated training, and the ε it cost."""

    test_accuracy: float
    initial_accuracy: float
    curve: list[tuple[int, float]]
    rounds: int
    batch_size: int
    lr: float
    schedule: str
    protocol: str
    epsilon: float | None = None
    delta: float | None = None
    defenses: list[str] = field(default_factory=list)
    test_images: int = 0
    training_time_s: float = 0.0
    node: str | None = None  # the Ray node that measured it (--ray)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UtilityMeasurement:
        made = _from_json(cls, data)
        made.curve = [(int(r), float(a)) for r, a in made.curve]
        return made


def float_or_none(text: str | None) -> float | None:
    """A victim's metadata value (a string) as a float, or None when absent or not a number."""
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def done_line(label: str, point_id: str, attack: AttackMeasurement | None,
              utility: UtilityMeasurement | None, where: str = "") -> str:
    """The line printed when a point is done: its figures (and where it was measured)."""
    parts = ["no attack"]
    if attack is not None and attack.mean_psnr is not None and attack.mean_ssim is not None:
        parts = [f"PSNR {attack.mean_psnr:.2f} dB, SSIM {attack.mean_ssim:.3f}"]
    if utility is not None:
        parts.append(f"test accuracy {utility.test_accuracy:.1%}")
    eps = (utility.epsilon if utility else None) or (attack.epsilon if attack else None)
    if eps is not None:
        parts.append(f"ε {eps:.4g}")
    return f"done {label} [{point_id}]{where}: " + ", ".join(parts)
