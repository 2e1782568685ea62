"""The imprint block of "Robbing the Fed": a server-designed layer pair in front of any model.

Fowl et al., ICLR 2022.

For an input ``x`` (flattened to ``d`` values) the block computes

    a = ReLU(W₀ x + b₀)          (W₀: [k, d], one row per *bin*)
    x' = x + reshape(W₁ a + b₁)   (W₁: [d, k], back to the input's shape)

and hands ``x'`` to the inner model. With honest values (W₀ = 0, W₁ = 0: the identity) the
model is the inner model; a malicious server that distributed this architecture then sets its
*values* per
round (:mod:`fedleak.attacks.malicious.imprint`): every row of W₀ the same measurement ``m`` (e.g.
the image's brightness), the biases at increasing cut-offs, every column of W₁ the same vector, and
the gradients of W₀ and b₀ then hold single inputs exactly.

The parameter names are part of the contract between the victim's model zoo (which builds
``imprint:bins=K,inner=NAME``) and the attack: ``imprint.linear0.weight`` / ``.bias`` and
``imprint.linear1.weight`` / ``.bias``, followed by the inner model's under ``inner.``.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

#: module name of the block inside :class:`ImprintedModel`
BLOCK = "imprint"
WEIGHT0, BIAS0 = f"{BLOCK}.linear0.weight", f"{BLOCK}.linear0.bias"
WEIGHT1, BIAS1 = f"{BLOCK}.linear1.weight", f"{BLOCK}.linear1.bias"


class ImprintBlock(nn.Module):
    """``x ↦ x + W₁ ReLU(W₀ x + b₀) + b₁`` over the flattened input, ``bins`` hidden units."""

    def __init__(self, shape: tuple[int, int, int], bins: int) -> None:
        super().__init__()
        if bins < 2:
            raise ValueError(f"an imprint block needs at least 2 bins, got {bins}")
        self.shape = tuple(int(s) for s in shape)
        pixels = math.prod(self.shape)
        self.linear0 = nn.Linear(pixels, bins)
        self.linear1 = nn.Linear(bins, pixels)
        # honest values: W₀ = 0, W₁ = 0, b₁ = 0 make the block the identity, so the honest model
        # is the inner model (and trains as stably) until a server sets the block's values
        nn.init.zeros_(self.linear0.weight)
        nn.init.zeros_(self.linear1.weight)
        nn.init.zeros_(self.linear1.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``x + reshape(W₁ ReLU(W₀ x + b₀) + b₁)``, the input's shape kept."""
        activations = F.relu(self.linear0(x.flatten(1)))
        imprinted: torch.Tensor = x + self.linear1(activations).view(x.shape)
        return imprinted


class ImprintedModel(nn.Module):
    """An imprint block in front of ``inner``: the architecture a malicious server distributes."""

    def __init__(self, shape: tuple[int, int, int], bins: int, inner: nn.Module) -> None:
        super().__init__()
        self.imprint = ImprintBlock(shape, bins)
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the inner model's output on the imprinted input."""
        out: torch.Tensor = self.inner(self.imprint(x))
        return out
