"""How an optimisation attack replays the user's update, as small registered parts.

A replay part turns the observation's replay in restart form, ``base(images [R, n, C, H, W],
labels [n]) -> [R, *θ_l.shape]`` per parameter (:mod:`fedleak.attacks.optimisation.restarts`; R = 1
for a single restart), into the function the objective compares with the observed update.

- ``plain``: the user's local update as the harness replays it, unchanged.
- ``dp-clipped``: DP-SGD's per-example clipping inside the replay (Abadi et al. 2016, as
  Opacus computes it). A DP-SGD user sends, for FedSGD over its n images,

      ũ = (1/B) Σ_i g_i · min(1, C / (‖g_i‖ + 10⁻⁶)) + N(0, σ²C²/B² I),   B = n,

  with g_i = ∇_θ CE(f_θ(x_i), y_i) the gradient of image i alone (``flat`` clipping over all
  parameters; ``per-layer`` clips each layer l to C/√L). The plain replay sends (1/n) Σ_i g_i,
  a different function of the images as soon as one per-example norm exceeds C and n > 1; this
  part replays each image alone and clips it to the published C (the noise is the objective's
  business: :mod:`fedleak.attacks.optimisation.objectives`, ``gaussian``). For one image clipping is
  a positive scale, which every objective here ignores: the part changes nothing then. FedAvg
  clips inside each local step, which a replay outside the harness cannot reach, and Poisson
  sampling draws batches the server does not see: both are refused.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fedleak.attacks.observation import Observation
from fedleak.attacks.parts import AttackPart, NoOptions, PartError
from fedleak.attacks.published import find, published_names
from fedleak.attacks.replay_contract import RestartsUpdateFn
from fedleak.registry import Registry

#: Opacus's clip factor: min(1, C / (‖g‖ + 1e-6)).
CLIP_EPS = 1e-6


class ReplayPart(AttackPart):
    """A registered replay: wraps the base replay (restart form) for an observation."""

    @abstractmethod
    def wrap(self, base: RestartsUpdateFn, observation: Observation) -> RestartsUpdateFn:
        """Return the replay this part makes of ``base``."""

    @property
    def packable(self) -> bool:
        """Whether packed attacks (several observations as one replay) may use this part."""
        return False


REPLAYS: Registry[ReplayPart] = Registry("replay", "fedleak.replays", PartError)


def register_replay(name: str) -> Callable[[type[ReplayPart]], type[ReplayPart]]:
    """Class decorator: make a replay part available as ``name``."""
    return REPLAYS.register(name)


@register_replay("plain")
class PlainReplay(ReplayPart):
    """The user's local update as the harness replays it."""

    Config = NoOptions

    def wrap(self, base: RestartsUpdateFn, observation: Observation) -> RestartsUpdateFn:
        """Return ``base`` unchanged: the user's plain training step."""
        return base

    @property
    def packable(self) -> bool:
        """Tell that packed attacks may use the plain replay (always)."""
        return True


@dataclass
class ClippedConfig:
    """Options of the clipped replay: the clipping norm C and flat or per-layer clipping."""

    max_norm: float = field(default=0.0, metadata={
        "help": "per-example clipping norm C; 0: the C the victim's dpsgd publishes"})
    clipping: str = field(default="auto", metadata={
        "help": "flat, per-layer, or auto (what the victim's dpsgd publishes)"})

    def __post_init__(self) -> None:
        """Refuse a negative or infinite C and an unknown clipping."""
        if not (self.max_norm >= 0 and math.isfinite(self.max_norm)):
            raise ValueError(f"max-norm must be >= 0, got {self.max_norm}")
        if self.clipping not in ("auto", "flat", "per-layer"):
            raise ValueError(f"clipping must be auto, flat or per-layer, got {self.clipping!r}")


@register_replay("dp-clipped")
class ClippedReplay(ReplayPart):
    """Per-example clipping to C inside the replay (module docstring)."""

    Config = ClippedConfig
    config: ClippedConfig

    def _settings(self, observation: Observation) -> tuple[float, str]:
        dp = find(observation.defenses, "dpsgd")
        norm = self.config.max_norm or (dp.number("max-grad-norm", 0.0) if dp else 0.0)
        clipping = self.config.clipping
        if clipping == "auto":
            clipping = dp.params.get("clipping", "flat") if dp else "flat"
        return norm, clipping

    def check(self, observation: Observation) -> None:
        """Refuse no C to clip to, a FedAvg update, or Poisson-sampled batches."""
        dp = find(observation.defenses, "dpsgd")
        norm, _ = self._settings(observation)
        if not norm > 0:
            raise PartError(
                "replay 'dp-clipped' clips each image's gradient to the C a dpsgd defense "
                f"publishes, but the victim publishes none (published: "
                f"{published_names(observation.defenses)}); use -o replay=plain, or give "
                "-o max-norm=C")
        if observation.update_kind == "delta":
            raise PartError("replay 'dp-clipped' replays FedSGD (one clipped step); a FedAvg "
                            "user clips inside every local step, which it cannot replay; use "
                            "-o replay=plain")
        if dp is not None and dp.params.get("poisson", "False").lower() == "true":
            raise PartError("replay 'dp-clipped' needs the user's batch, but the victim's "
                            "dpsgd samples batches at random (poisson=True); use -o replay=plain")

    def wrap(self, base: RestartsUpdateFn, observation: Observation) -> RestartsUpdateFn:
        """Wrap ``base`` so each image's gradient is clipped to C before they are summed."""
        norm, clipping = self._settings(observation)

        def replay(images: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
            count = images.shape[1]
            total: list[torch.Tensor] = []
            for i in range(count):
                one = base(images[:, i:i + 1], labels[i:i + 1])
                clipped = clip_rows(one, norm, clipping)
                total = clipped if not total else [t + c for t, c in
                                                   zip(total, clipped, strict=True)]
            return [t / count for t in total]

        return replay


def clip_rows(update: list[torch.Tensor], norm: float, clipping: str) -> list[torch.Tensor]:
    """Each row r (restart) of ``update`` clipped.

    ``flat`` scales row r by min(1, C/(‖u_r‖ + 1e-6)) over all layers; ``per-layer`` clips layer l
    to C/√L alone.
    """
    rows = update[0].shape[0]

    def factor(squares: torch.Tensor, bound: float) -> torch.Tensor:
        return (bound / (squares.sqrt() + CLIP_EPS)).clamp(max=1.0)

    if clipping == "per-layer":
        bound = norm / math.sqrt(len(update))
        return [u * factor(u.reshape(rows, -1).square().sum(1), bound)
                .view(-1, *[1] * (u.dim() - 1)) for u in update]
    squares = torch.stack([u.reshape(rows, -1).square().sum(1) for u in update]).sum(0)
    scale = factor(squares, norm)
    return [u * scale.view(-1, *[1] * (u.dim() - 1)) for u in update]


def create_replay(name: str, options: Mapping[str, Any] | None = None) -> ReplayPart:
    """Replay part ``name`` with ``options``; unknown names list the valid ones."""
    return REPLAYS.create(name, options)


def replay_names() -> tuple[str, ...]:
    """Every registered replay part."""
    return REPLAYS.names()
