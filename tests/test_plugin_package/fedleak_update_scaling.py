"""A third-party defense package, as a user would write it: one update defense registered under
the ``fedleak.defenses`` entry-point group by ``fedleak_update_scaling-0.1.0.dist-info``.

``update-scaling`` multiplies the whole update by a factor: Δ' = c · Δ (deterministic). The
integration tests put this folder on ``PYTHONPATH`` of a victim process, which is how an
installed package is found; nothing in fedleak names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedleak.defenses import UpdateDefense


@dataclass
class UpdateScalingConfig:
    factor: float = field(default=0.5, metadata={"help": "c in Δ' = c · Δ"})

    def __post_init__(self) -> None:
        if not 0 < self.factor <= 1:
            raise ValueError(f"factor must lie in (0, 1], got {self.factor}")


class UpdateScaling(UpdateDefense):
    """Δ' = c · Δ for every tensor of the update."""

    Config = UpdateScalingConfig

    def apply(self, update: list[torch.Tensor], generator: torch.Generator) -> list[torch.Tensor]:
        return [u * self.config.factor for u in update]
