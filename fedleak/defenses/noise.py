"""Additive noise on the update: Δ ← Δ + ξ, ξ ~ N(0, σ²) or Laplace(0, σ) per coordinate.

The noise of the Gaussian mechanism (Dwork & Roth 2014, Theorem A.1: f(x) + N(0, σ²I)) and of
the Laplace mechanism (their Definition 3.3: f(x) + (Y_1, …, Y_d), Y_i ~ Lap(b)), with no clip
in front: an update's sensitivity is unbounded, so this defense alone claims no ε (chain a
``clip`` before it, or use ``client-dp``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedleak.defenses.defense_registry import register_defense
from fedleak.defenses.mechanism import LAPLACE, UPDATE, Mechanism
from fedleak.defenses.mechanism import Noise as DeclaredNoise
from fedleak.defenses.stages import GaussianClaim, UpdateDefense

DISTRIBUTIONS = ("gaussian", "laplace")
#: Largest σ accepted: float32 holds up to 3.4e38 and a draw ξ reaches ``|ξ| ≈ 16`` (Laplace, by the
#: inverse CDF's clamp at 1e-7), so σ·ξ stays finite with a margin of 20.
MAX_SIGMA = 1e36


@dataclass
class NoiseConfig:
    """The noise's parameters: its scale σ and its distribution."""

    sigma: float = field(default=0.01, metadata={"help": "scale σ (Gaussian std, Laplace b)"})
    distribution: str = field(default="gaussian", metadata={"help": "gaussian or laplace"})

    def __post_init__(self) -> None:
        """Refuse a negative or overflowing scale and an unknown distribution."""
        if not self.sigma >= 0:
            raise ValueError(f"sigma must be >= 0, got {self.sigma}")
        if self.sigma > MAX_SIGMA:
            raise ValueError(f"sigma {self.sigma:g} would turn float32 updates (largest value "
                             f"3.4e38) into infinities; use sigma <= {MAX_SIGMA:g}")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, "
                             f"got {self.distribution!r}")


@register_defense("noise")
class Noise(UpdateDefense):
    """Add i.i.d. Gaussian (std σ) or Laplacian (scale b = σ, std √2·σ) noise to every entry."""

    Config = NoiseConfig

    def apply(self, update: list[torch.Tensor], generator: torch.Generator) -> list[torch.Tensor]:
        r"""Return Δ + σ·ξ, ξ i.i.d. per coordinate from ``generator``.

        Gaussian: ξ ~ N(0, 1). Laplace: ``ξ = −sgn(V)·ln(1 − 2|V|)``, V ~ Uniform(−½, ½), the
        inverse CDF of Lap(1) (``|V|`` clamped below ½ so ξ stays finite, ``|ξ| < 16``).
        """
        out = []
        for u in update:
            if self.config.distribution == "gaussian":
                xi = torch.randn(u.shape, generator=generator, dtype=u.dtype, device=u.device)
            else:  # Laplace by inverse CDF of a uniform on (-1/2, 1/2)
                v = torch.rand(u.shape, generator=generator, dtype=u.dtype, device=u.device) - 0.5
                xi = -torch.sign(v) * torch.log1p(-2 * v.abs().clamp(max=0.5 - 1e-7))
            out.append(u + self.config.sigma * xi)
        return out

    def gaussian_claim(self) -> GaussianClaim | None:
        """Gaussian noise of std σ and no clipping; Laplace noise claims nothing here."""
        if self.config.distribution != "gaussian":
            return None
        return GaussianClaim(noise_std=self.config.sigma)

    def mechanism(self) -> Mechanism:
        """N(0, σ²) (or Laplace of scale σ, std √2·σ) on every coordinate; no clip."""
        if self.config.distribution == "gaussian":
            return Mechanism(UPDATE, noise=DeclaredNoise(self.config.sigma))
        return Mechanism(UPDATE, noise=DeclaredNoise(self.config.sigma * 2 ** 0.5, LAPLACE))
