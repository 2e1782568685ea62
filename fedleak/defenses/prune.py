"""Magnitude pruning of the update (gradient sparsification, Zhu et al. 2019's defense):
keep the largest (1 − p) fraction of entries by ``|Δ|``, set the rest to zero — per layer or over
the whole update."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedleak.defenses.defense_registry import register_defense
from fedleak.defenses.stages import UpdateDefense


@dataclass
class PruneConfig:
    p: float = field(default=0.9, metadata={"help": "fraction of entries set to zero, in [0, 1)"})
    scope: str = field(default="layer", metadata={"help": "layer: per tensor; global: overall"})

    def __post_init__(self) -> None:
        if not 0 <= self.p < 1:
            raise ValueError(f"p must lie in [0, 1), got {self.p}")
        if self.scope not in ("layer", "global"):
            raise ValueError(f"scope must be layer or global, got {self.scope!r}")


def _keep_largest(values: torch.Tensor, keep: int) -> torch.Tensor:
    """A 0/1 mask of the ``keep`` entries of largest magnitude."""
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
