"""Magnitude pruning of the update (gradient sparsification, Zhu et al. 2019's defense).

Keep the largest (1 − p) fraction of entries by ``|Δ|`` and set the rest to zero, per layer or
over the whole update: Δ ← Δ ⊙ M, M the 0/1 mask of the round((1 − p)·d) entries of largest
magnitude among d (Zhu et al. 2019, §5: gradients below a magnitude threshold pruned to zero;
their attack stopped recovering recognisable images beyond about 20 %). Deterministic, and no
differential privacy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedleak.defenses.defense_registry import register_defense
from fedleak.defenses.stages import UpdateDefense


@dataclass
class PruneConfig:
    """The pruning's parameters: the fraction p set to zero, and over what it is counted."""

    p: float = field(default=0.9, metadata={"help": "fraction of entries set to zero, in [0, 1)"})
    scope: str = field(default="layer", metadata={"help": "layer: per tensor; global: overall"})

    def __post_init__(self) -> None:
        """Refuse a fraction outside [0, 1) and an unknown scope."""
        if not 0 <= self.p < 1:
            raise ValueError(f"p must lie in [0, 1), got {self.p}")
        if self.scope not in ("layer", "global"):
            raise ValueError(f"scope must be layer or global, got {self.scope!r}")


def _keep_largest(values: torch.Tensor, keep: int) -> torch.Tensor:
    """Return a 0/1 mask of the ``keep`` entries of largest magnitude."""
    flat = values.abs().flatten()
    mask = torch.zeros_like(flat)
    if keep > 0:
        mask[torch.topk(flat, keep, sorted=False).indices] = 1
    return mask.view_as(values)


@register_defense("prune")
class Prune(UpdateDefense):
    """Zero the ``p`` fraction of smallest-magnitude entries (deterministic)."""

    Config = PruneConfig

    def apply(self, update: list[torch.Tensor], generator: torch.Generator) -> list[torch.Tensor]:
        """Return ``update`` with all but its round((1 − p)·d) largest-magnitude entries zeroed.

        d counts a tensor's entries (``scope=layer``) or the whole update's (``global``);
        ``generator`` is unused.
        """
        keep_fraction = 1 - self.config.p
        if self.config.scope == "layer":
            return [u * _keep_largest(u, round(keep_fraction * u.numel())) for u in update]
        flat = torch.cat([u.flatten() for u in update])
        mask = _keep_largest(flat, round(keep_fraction * flat.numel()))
        out, start = [], 0
        for u in update:
            out.append(u * mask[start:start + u.numel()].view_as(u))
            start += u.numel()
        return out
