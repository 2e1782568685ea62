"""DP-SGD (Abadi et al. 2016) through Opacus, applied to every local step of the user.

For one step over a batch B (fixed, or Poisson-sampled with rate q), with per-example
gradients g_i (given by the harness) and clipping norm C::

    flat:       ḡ_i = g_i · min(1, C / ‖g_i‖₂)                    (norm over all layers)
    per-layer:  ḡ_i,l = g_i,l · min(1, C_l / ‖g_i,l‖₂),  C_l = C / √L
    g̃ = (Σ_i ḡ_i + N(0, σ² C² I)) / E[|B|]

Clipping, noise and scaling are Opacus's own :class:`DPOptimizer` /
:class:`DPPerLayerOptimizer` ``pre_step`` acting on the ``grad_sample`` of the parameters; the
privacy spent is Opacus's RDP or PRV accountant over the (σ, q, steps) this user ran, read
from the declaration (:meth:`DPSGD.mechanism`) like any plug-in's. Models must pass Opacus's
validator (no BatchNorm: the victim applies ``ModuleValidator.fix``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from fedleak.defenses.accounting import (
    SMALLEST_NOISE_MULTIPLIER,
    epsilon,
    make_accountant,
    record,
)
from fedleak.defenses.defense_registry import register_defense
from fedleak.defenses.mechanism import (
    FIXED,
    PER_EXAMPLE,
    PER_TENSOR,
    POISSON,
    TOTAL,
    Clip,
    Mechanism,
    Noise,
    Sampling,
)
from fedleak.defenses.stages import PerExampleDefense

__all__ = ["ACCOUNTANTS", "DPSGD", "DPSGDConfig", "epsilon", "make_accountant", "record"]

ACCOUNTANTS = ("rdp", "prv")


@dataclass
class DPSGDConfig:
    """DP-SGD's parameters: noise multiplier σ, clip C and its geometry, sampling, δ."""

    noise_multiplier: float = field(default=1.0, metadata={"help": "σ: noise std / C"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "per-example clipping norm C"})
    clipping: str = field(default="flat", metadata={"help": "flat or per-layer"})
    poisson: bool = field(default=False,
                          metadata={"help": "Poisson-sample local batches at q = B/n"})
    delta: float = field(default=1e-5, metadata={"help": "δ of the reported (ε, δ)"})
    accountant: str = field(default="rdp", metadata={"help": "rdp or prv"})

    def __post_init__(self) -> None:
        """Refuse a value that names no mechanism; the message names the parameter."""
        if not self.noise_multiplier >= 0:
            raise ValueError(f"noise-multiplier must be >= 0, got {self.noise_multiplier}")
        if 0 < self.noise_multiplier < SMALLEST_NOISE_MULTIPLIER:
            raise ValueError(f"noise-multiplier {self.noise_multiplier:g} is below the smallest "
                             f"whose ε the accountant can compute "
                             f"({SMALLEST_NOISE_MULTIPLIER:g}: z² underflows); use at least "
                             f"{SMALLEST_NOISE_MULTIPLIER:g}, or 0 for no noise (ε = ∞)")
        if not self.max_grad_norm > 0:
            raise ValueError(f"max-grad-norm must be positive, got {self.max_grad_norm}")
        if not self.noise_multiplier * self.max_grad_norm <= 1e36:  # float32 max is 3.4e38
            raise ValueError(f"noise std σ·C = {self.noise_multiplier:g}·{self.max_grad_norm:g} "
                             "would turn float32 gradients into infinities; keep it <= 1e36")
        if self.clipping not in ("flat", "per-layer"):
            raise ValueError(f"clipping must be flat or per-layer, got {self.clipping!r}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {self.delta}")
        if self.accountant not in ACCOUNTANTS:
            raise ValueError(f"accountant must be one of {list(ACCOUNTANTS)}")


@register_defense("dpsgd")
class DPSGD(PerExampleDefense):
    """Per-example clipping and Gaussian noise in every local step, with ε accounting."""

    Config = DPSGDConfig

    def privatise(
        self,
        per_example: list[torch.Tensor],
        expected_batch_size: int,
        generator: torch.Generator,
    ) -> list[torch.Tensor]:
        """Return ``(Σ_i clip(g_i) + N(0, σ²C² I)) / E[|B|]`` by Opacus's ``pre_step``.

        The noisy step of Abadi et al. 2016, Algorithm 1 (module docstring for the clip's
        geometry); the noise is drawn from ``generator``, ``expected_batch_size`` is ``E[|B|]``
        (B, or qn under Poisson sampling).
        """
        from opacus.optimizers import DPOptimizer, DPPerLayerOptimizer

        params = [torch.zeros(g.shape[1:], dtype=g.dtype, device=g.device, requires_grad=True)
                  for g in per_example]
        for p, g in zip(params, per_example, strict=True):
            setattr(p, "grad_sample", g.detach())  # noqa: B010 - Opacus reads it
        base = torch.optim.SGD(params, lr=0.0)
        c = self.config
        if c.clipping == "flat":
            optimiser = DPOptimizer(base, noise_multiplier=c.noise_multiplier,
                                    max_grad_norm=c.max_grad_norm,
                                    expected_batch_size=expected_batch_size, generator=generator)
        else:
            per_layer = [c.max_grad_norm / math.sqrt(len(params))] * len(params)
            optimiser = DPPerLayerOptimizer(base, noise_multiplier=c.noise_multiplier,
                                            max_grad_norm=per_layer,
                                            expected_batch_size=expected_batch_size,
                                            generator=generator)
        optimiser.pre_step()
        grads = [p.grad for p in params]
        assert all(g is not None for g in grads), "Opacus left a parameter without .grad"
        return [g.detach().clone() for g in grads if g is not None]

    def mechanism(self) -> Mechanism:
        """Declare per example a clip to C, then N(0, σ²C²) on each step's sum.

        Flat: a total clip; per-layer: C/√L per tensor. Fixed or Poisson-sampled batches, this
        accountant and δ.
        """
        c = self.config
        return Mechanism(PER_EXAMPLE,
                         clip=Clip(c.max_grad_norm, TOTAL if c.clipping == "flat" else PER_TENSOR),
                         noise=Noise(c.noise_multiplier * c.max_grad_norm),
                         sampling=Sampling(POISSON if c.poisson else FIXED),
                         accountant=c.accountant, delta=c.delta, unit="example")
