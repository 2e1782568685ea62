"""Update-norm clipping: Δ ← Δ · min(1, C / ‖Δ‖₂), the norm over all parameters together."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedleak.defenses.defense_registry import register_defense
from fedleak.defenses.stages import GaussianClaim, UpdateDefense


@dataclass
class ClipConfig:
    max_norm: float = field(default=1.0, metadata={"help": "largest L2 norm C of the update"})

    def __post_init__(self) -> None:
        if not self.max_norm > 0:
            raise ValueError(f"max-norm must be positive, got {self.max_norm}")


@register_defense("clip")
class Clip(UpdateDefense):
    """Scale the whole update down to L2 norm at most ``max_norm`` (no randomness)."""

    Config = ClipConfig

    def apply(self, update: list[torch.Tensor], generator: torch.Generator) -> list[torch.Tensor]:
        norm = torch.stack([(u.double() ** 2).sum() for u in update]).sum().sqrt()
        scale = min(1.0, self.config.max_norm / max(float(norm), 1e-12))
        return [u * scale for u in update]

    def gaussian_claim(self) -> GaussianClaim:
        """Clipping alone: a contribution bound, no noise."""
        return GaussianClaim(clip_norm=self.config.max_norm)
