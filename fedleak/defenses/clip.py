"""Update-norm clipping: Δ ← Δ · min(1, C / ‖Δ‖₂), the norm over all parameters together.

This is the clip π(Δ, S) = Δ · min(1, S / ‖Δ‖) of McMahan et al. 2018's DP-FedAvg
(Algorithm 1, ``FlatClip``) without its noise: it bounds what one update can contribute, and
is no differential privacy by itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedleak.defenses.defense_registry import register_defense
from fedleak.defenses.stages import GaussianClaim, UpdateDefense


@dataclass
class ClipConfig:
    """The clip's parameter: the largest L2 norm C of the update."""

    max_norm: float = field(default=1.0, metadata={"help": "largest L2 norm C of the update"})

    def __post_init__(self) -> None:
        """Refuse a clip norm that is not positive."""
        if not self.max_norm > 0:
            raise ValueError(f"max-norm must be positive, got {self.max_norm}")


@register_defense("clip")
class Clip(UpdateDefense):
    """Scale the whole update down to L2 norm at most ``max_norm`` (no randomness)."""

    Config = ClipConfig

    def apply(self, update: list[torch.Tensor], generator: torch.Generator) -> list[torch.Tensor]:
        """Return ``update`` scaled by min(1, C / ‖Δ‖₂), the norm over every tensor together.

        The norm is summed in float64; ``generator`` is unused (the clip is deterministic).
        """
        norm = torch.stack([(u.double() ** 2).sum() for u in update]).sum().sqrt()
        scale = min(1.0, self.config.max_norm / max(float(norm), 1e-12))
        return [u * scale for u in update]

    def gaussian_claim(self) -> GaussianClaim:
        """Clipping alone: a contribution bound, no noise."""
        return GaussianClaim(clip_norm=self.config.max_norm)
