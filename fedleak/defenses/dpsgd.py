"""DP-SGD (Abadi et al. 2016) through Opacus, applied to every local step of the user.

For one step over a batch B (fixed, or Poisson-sampled with rate q), with per-example
gradients g_i (given by the harness) and clipping norm C::

    flat:       ḡ_i = g_i · min(1, C / ‖g_i‖₂)                    (norm over all layers)
    per-layer:  ḡ_i,l = g_i,l · min(1, C_l / ‖g_i,l‖₂),  C_l = C / √L
    g̃ = (Σ_i ḡ_i + N(0, σ² C² I)) / E[|B|]

Clipping, noise and scaling are Opacus's own :class:`DPOptimizer` /
:class:`DPPerLayerOptimizer` ``pre_step`` acting on the ``grad_sample`` of the parameters; the
privacy spent is Opacus's RDP or PRV accountant over the (σ, q, steps) this user ran. Models
must pass Opacus's validator (no BatchNorm: the victim applies ``ModuleValidator.fix``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy
import torch

from fedleak.defenses.defense_registry import register_defense
from fedleak.defenses.stages import PerExampleDefense

ACCOUNTANTS = ("rdp", "prv")


def make_accountant(kind: str) -> Any:
    """A fresh Opacus accountant (imported lazily: Opacus takes a second to import)."""
    from opacus.accountants import PRVAccountant, RDPAccountant

    return {"rdp": RDPAccountant, "prv": PRVAccountant}[kind]()


@dataclass
class DPSGDConfig:
    noise_multiplier: float = field(default=1.0, metadata={"help": "σ: noise std / C"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "per-example clipping norm C"})
    clipping: str = field(default="flat", metadata={"help": "flat or per-layer"})
    poisson: bool = field(default=False,
                          metadata={"help": "Poisson-sample local batches at q = B/n"})
    delta: float = field(default=1e-5, metadata={"help": "δ of the reported (ε, δ)"})
    accountant: str = field(default="rdp", metadata={"help": "rdp or prv"})

    def __post_init__(self) -> None:
        if not self.noise_multiplier >= 0:
            raise ValueError(f"noise-multiplier must be >= 0, got {self.noise_multiplier}")
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

    def __init__(self, config: DPSGDConfig | None = None) -> None:
        super().__init__(config)
        self._total = make_accountant(self.config.accountant)

    def privatise(
        self,
        per_example: list[torch.Tensor],
        expected_batch_size: int,
        generator: torch.Generator,
    ) -> list[torch.Tensor]:
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

    def sample_rate(self, num_images: int, batch_size: int) -> float | None:
        if not self.config.poisson:
            return None
        size = num_images if batch_size in (0, None) or batch_size >= num_images else batch_size
        return size / num_images

    def account(self, steps: int, sample_rate: float, report: bool = True) -> dict[str, str]:
        """ε of this round alone and cumulated over every round this defense has served
        (steps at one sampling rate are merged into one history entry)."""
        sigma = self.config.noise_multiplier
        record(self._total, sigma, sample_rate, steps)
        if not report:
            return {}
        this_round = make_accountant(self.config.accountant)
        record(this_round, sigma, sample_rate, steps)
        delta = self.config.delta
        return {
            "epsilon_round": f"{epsilon(this_round, delta):.6g}",
            "epsilon_total": f"{epsilon(self._total, delta):.6g}",
            "delta": f"{delta:g}",
            "accountant": self.config.accountant,
            "dp_steps": str(steps),
            "sample_rate": f"{sample_rate:.6g}",
        }


def record(accountant: Any, sigma: float, sample_rate: float, steps: int) -> None:
    """Add ``steps`` steps at (σ, q) to the accountant's history, merged into the entry with the
    same (σ, q) where there is one: composition of one mechanism is commutative and the RDP and
    PRV accountants compose an entry's steps exactly so, so ε is unchanged while the history
    stays one entry per distinct mechanism instead of growing with every round."""
    history = accountant.history
    for i, (s, q, n) in enumerate(history):
        if (s, q) == (sigma, sample_rate):
            history[i] = (s, q, n + steps)
            return
    history.append((sigma, sample_rate, steps))


def epsilon(accountant: Any, delta: float) -> float:
    """ε at ``delta``; infinite when there was no noise."""
    if any(sigma == 0 for sigma, _, _ in accountant.history):
        return math.inf
    with numpy.errstate(divide="ignore", invalid="ignore"):  # PRV at q = 1 takes log(0)
        return float(accountant.get_epsilon(delta=delta))
