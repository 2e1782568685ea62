"""A third-party per-example DP-SGD, as a user would write it against fedleak's plug-in API: no
subclass of fedleak's ``dpsgd``, no Opacus — plain torch, registered as ``private-sgd`` under
the ``fedleak.defenses`` entry-point group by ``fedleak_update_scaling-0.1.0.dist-info``.

For one step over a batch with per-example gradients g_i, clip norm C and noise multiplier σ::

    ḡ_i = g_i · min(1, C / (‖g_i‖₂ + 10⁻⁶))      (the norm over every tensor together)
    g̃   = (Σ_i ḡ_i + N(0, σ²C² I)) / B_expected

drawing the noise tensor by tensor from the generator the victim hands it — the same draws as
Opacus's ``DPOptimizer``, so with the same seed it releases what ``dpsgd`` releases. It
declares its mechanism (:meth:`PrivateSGD.mechanism`) and nothing else: the victim's claim,
accountant, Fisher ceiling, DP release and audit read the declaration, so it is judged exactly
as ``dpsgd`` is. ``fedleak defense serve --defense private-sgd`` serves it behind the proto
(``remote:address=…,stage=per-example``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedleak.defenses import PerExampleDefense
from fedleak.defenses.mechanism import Clip, Mechanism, Noise, Sampling


@dataclass
class PrivateSGDConfig:
    noise_multiplier: float = field(default=1.0, metadata={"help": "σ: noise std / C"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "per-example clip norm C"})
    poisson: bool = field(default=False, metadata={"help": "Poisson-sample local batches"})
    delta: float = field(default=1e-5, metadata={"help": "δ of the reported (ε, δ)"})
    accountant: str = field(default="rdp", metadata={"help": "rdp or prv"})

    def __post_init__(self) -> None:
        if not self.noise_multiplier >= 0 or not self.max_grad_norm > 0:
            raise ValueError("noise-multiplier must be >= 0 and max-grad-norm > 0")


class PrivateSGD(PerExampleDefense):
    """Per-example clipping and Gaussian noise, in plain torch (module docstring)."""

    Config = PrivateSGDConfig

    def privatise(self, per_example: list[torch.Tensor], expected_batch_size: int,
                  generator: torch.Generator) -> list[torch.Tensor]:
        c = self.config
        norms = torch.stack([g.reshape(len(g), -1).norm(2, dim=-1) for g in per_example],
                            dim=1).norm(2, dim=1)
        factor = (c.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
        out = []
        for g in per_example:
            summed = torch.einsum("i,i...", factor, g)
            noise = torch.normal(mean=0, std=c.noise_multiplier * c.max_grad_norm,
                                 size=summed.shape, device=summed.device, generator=generator)
            out.append((summed + noise) / expected_batch_size)
        return out

    def mechanism(self) -> Mechanism:
        """What it does, declared: per example, a total clip to C, N(0, σ²C²) on each step's
        sum, fixed or Poisson batches, its accountant and δ."""
        c = self.config
        return Mechanism("per-example", clip=Clip(c.max_grad_norm),
                         noise=Noise(c.noise_multiplier * c.max_grad_norm),
                         sampling=Sampling("poisson" if c.poisson else "fixed"),
                         accountant=c.accountant, delta=c.delta, unit="example")
