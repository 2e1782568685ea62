"""A deliberately broken defense plug-in: it claims a Gaussian mechanism with noise σ and adds
σ / 2. Audits exist to catch exactly this (docs/audit.md).

The bug is a realistic one: the noise is computed as a distributed-DP *share* for ``shares``
users (std σ·S/√shares, so that the shares of that many users sum to N(0, σ²S²)), but the
service runs for one user, whose update nobody sums — while its claim, published in
``DefenseInfo.claim`` and accounted by the victim, is the full σ. With the defaults (σ = 1,
shares = 4) it claims ε 4.38 at δ = 1e-5 for a contribution of norm 1 and delivers σ = 0.5,
ε ≈ 10. Serve it behind the proto and audit it::

    PYTHONPATH=examples/dishonest_defense fedleak defense serve --port 50063 \\
        --defense dishonest-gaussian:sigma=1
    fedleak audit --defense remote:address=127.0.0.1:50063 --trials 2000 --threshold half-shift

The folder is laid out as pip installs a package (the module and a ``*.dist-info`` with the
``fedleak.defenses`` entry point), so putting it on ``PYTHONPATH`` is installing it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from fedleak.defenses import GaussianClaim, UpdateDefense


@dataclass
class DishonestGaussianConfig:
    sigma: float = field(default=1.0, metadata={"help": "the noise std it claims"})
    clip_norm: float = field(default=0.0, metadata={
        "help": "clip the update to this L2 norm first (0: no clipping)"})
    shares: int = field(default=4, metadata={
        "help": "the bug: noise is computed as one of this many distributed-DP shares"})

    def __post_init__(self) -> None:
        if not self.sigma > 0 or self.clip_norm < 0 or self.shares < 1:
            raise ValueError("sigma must be > 0, clip-norm >= 0 and shares >= 1")


class DishonestGaussian(UpdateDefense):
    """Claims Δ ↦ clip(Δ) + N(0, σ²); adds N(0, σ²/shares) (module docstring)."""

    Config = DishonestGaussianConfig

    def apply(self, update: list[torch.Tensor], generator: torch.Generator) -> list[torch.Tensor]:
        c = self.config
        if c.clip_norm > 0:
            norm = float(torch.sqrt(sum((u.double() ** 2).sum() for u in update)))
            update = [u * min(1.0, c.clip_norm / max(norm, 1e-12)) for u in update]
        std = c.sigma / math.sqrt(c.shares)  # BUG: a share of noise nobody adds up
        return [u + std * torch.randn(u.shape, generator=generator, dtype=u.dtype,
                                      device=u.device) for u in update]

    def gaussian_claim(self) -> GaussianClaim:
        """What it says it does: the full σ."""
        return GaussianClaim(clip_norm=self.config.clip_norm or None, noise_std=self.config.sigma)
