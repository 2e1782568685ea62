"""Stochastic uniform quantisation of the update (QSGD-style, Alistarh et al. 2017).

Per tensor with scale m = max|Δ| and s = 2^{bits−1} − 1 levels per sign, each entry becomes
m/s · (⌊s|Δ|/m⌋ + Bernoulli(frac(s|Δ|/m))) · sign(Δ): unbiased (E[q(Δ)] = Δ), with at most
m/s error per entry, and only ``bits`` bits per entry on the wire. This is QSGD's
Q_s(v_i) = ‖v‖₂ · sgn(v_i) · ξ_i(v, s) (Alistarh et al. 2017, §3.1, ξ_i the stochastic
rounding of s|v_i|/‖v‖₂ to a neighbouring level) with the max norm m in place of ‖v‖₂, so that
all s levels are used. No differential privacy: the rounding noise is bounded and data-scaled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedleak.defenses.defense_registry import register_defense
from fedleak.defenses.stages import UpdateDefense


@dataclass
class QuantizeConfig:
    """The quantisation's parameter: bits per entry, sign included."""

    bits: int = field(default=4, metadata={"help": "bits per entry, sign included (2..16)"})

    def __post_init__(self) -> None:
        """Refuse a bit width outside 2..16."""
        if not 2 <= self.bits <= 16:
            raise ValueError(f"bits must lie in 2..16, got {self.bits}")


@register_defense("quantize")
class Quantize(UpdateDefense):
    """Unbiased stochastic rounding of every tensor onto 2^bits − 1 uniform levels."""

    Config = QuantizeConfig

    def apply(self, update: list[torch.Tensor], generator: torch.Generator) -> list[torch.Tensor]:
        """Return every tensor stochastically rounded onto its s = 2^{bits−1} − 1 levels.

        Rounding up happens with probability frac(s|Δ|/m), drawn from ``generator``; a tensor
        of zeros (m = 0) or without entries is returned as a copy.
        """
        levels = 2 ** (self.config.bits - 1) - 1
        out = []
        for u in update:
            if u.numel() == 0:
                out.append(u.clone())
                continue
            # in at least float32, so values near a half-precision dtype's largest stay finite
            work = u.to(torch.promote_types(u.dtype, torch.float32))
            scale = work.abs().max()
            if scale == 0:
                out.append(u.clone())
                continue
            scaled = work.abs() / scale * levels
            lower = scaled.floor()
            up = torch.rand(u.shape, generator=generator, dtype=u.dtype, device=u.device)
            rounded = lower + (up.to(work.dtype) < scaled - lower).to(work.dtype)
            magnitude = torch.minimum(rounded * (scale / levels), scale)  # never beyond m
            out.append((torch.sign(work) * magnitude).to(u.dtype))
        return out
