"""Inverting Gradients (Geiping et al., NeurIPS 2020): cosine gradient matching with signed Adam.

The attack solves eq. (4) of the paper (eq. (2) of its supplement for FedAvg updates),

    x̂ = argmin_{x ∈ [0,1]^n}  1 − ⟨u(x, ŷ), u*⟩ / (‖u(x, ŷ)‖ ‖u*‖)  +  α TV(x),

where ``u*`` is the observed update (FedSGD: ∇_θ L(x*, y); FedAvg: the parameter delta) and
``u(x, ŷ)`` the user's update replayed on candidate images (``observation.simulate``), both
taken over the *whole* parameter vector (all layers concatenated). TV is the anisotropic total
variation of the authors' code: the mean absolute difference of horizontally plus vertically
adjacent pixels. The box [0, 1] is, in the normalised space the attack works in,
[(0 − mean)/std, (1 − mean)/std] per channel.

A preset of the composed optimisation attack (:mod:`fedleak.attacks.optimisation.composed`):
objective ``auto`` (the cosine, or the defense-aware part the published defenses call for), priors
``tv`` and ``box`` (and ``bn`` with ``bn=`` > 0), optimiser ``signed-adam``, Gaussian init; the
shorthand options ``lr``, ``tv``, ``signed``, ``boxed``, ``lr_decay``, ``bn`` and ``bn_source``
set those parts.

Optimisation, as in the paper (Sec. 4), its supplement (Sec. C) and the authors' code:
Gaussian N(0, 1) init in normalised space (not projected: the projection follows each step);
Adam (β = (0.9, 0.999), ε = 1e-8) fed the *sign* of the objective's gradient; step size ``lr``
(0.1) multiplied by 0.1 from iterations ⌊3T/8⌋, ⌊5T/8⌋ and ⌊7T/8⌋ on (``MultiStepLR`` stepped
once per iteration); after every step the images are projected onto the box. Each restart ends
with eq. (4) evaluated once more at its last iterate; the restart with the lowest value wins.
Labels come from :func:`fedleak.attacks.labels.recover_labels`. With ``vectorised`` (default)
and a replay that offers it (models without BatchNorm), the R restarts run as one batched
computation with the same result per restart (:mod:`fedleak.attacks.optimisation.restarts`).

How one iteration is computed (the speed of the attack is the speed of this loop): the outer
gradient is formed analytically rather than by autograd through a concatenated vector. With
``a = ⟨u, u*⟩``, ``b = ‖u‖²`` and ``c = ‖u*‖`` (precomputed once), the cosine term is
``1 − a / (√b c)`` and

    ∂/∂u [1 − a/(√b c)] = −u*/(√b c) + a·u/(b^{3/2} c) = s · (u* − (a/b) u),  s = −1/(√b c),

so one vector–Jacobian product ``s · autograd.grad(u + [TV], x, [u* − (a/b) u, α/s])`` gives
the whole gradient with respect to the images: the same maths as autograd on eq. (4), without
the multi-megabyte temporaries of a concatenated copy (the cotangent is written into the
replayed update's own memory in one pass). Adam's moments are two image-sized tensors updated
in place; the objective is read back to the host only when progress is reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedleak.attacks.attack_registry import register_attack
from fedleak.attacks.optimisation.composed import ComposedInversion
from fedleak.attacks.optimisation.engine.composed_config import (
    ComposedConfig,
    check_numbers,
    check_source,
)
from fedleak.attacks.optimisation.engine.initial import gaussian_init
from fedleak.attacks.optimisation.engine.packed import packed_objective
from fedleak.attacks.optimisation.gradient_matching import CosineObjective
from fedleak.attacks.optimisation.optimisers import (
    DECAY_FACTOR,
    DECAY_FRACTIONS,
    SignedAdam,
    decay_milestones,
    step_size,
)
from fedleak.attacks.optimisation.priors import total_variation
from fedleak.attacks.optimisation.restarts import alone

__all__ = ["DECAY_FACTOR", "DECAY_FRACTIONS", "CosineObjective", "InvertingGradients",
           "InvertingGradientsConfig", "SignedAdam", "alone", "decay_milestones",
           "gaussian_init", "packed_objective", "step_size", "total_variation"]


@dataclass
class InvertingGradientsConfig(ComposedConfig):
    """Hyperparameters of Inverting Gradients; defaults are the paper's LeNet/ResNet setting.

    The shorthand options set the parts when ``optimizer`` / ``priors`` are left empty.
    """

    iterations: int = field(
        default=4800, metadata={"help": "signed-Adam steps per restart (paper: 4800 or 24000)"}
    )
    lr: float = field(
        default=0.1, metadata={"help": "Adam step size, decayed x0.1 at 3/8, 5/8, 7/8"}
    )
    tv: float = field(default=1e-2, metadata={"help": "total-variation weight alpha of eq. (4)"})
    signed: bool = field(
        default=True, metadata={"help": "feed Adam the sign of the gradient (paper: true)"}
    )
    boxed: bool = field(
        default=True, metadata={"help": "project images onto [0, 1] after every step"}
    )
    lr_decay: bool = field(
        default=True, metadata={"help": "multiply lr by 0.1 at 3/8, 5/8, 7/8 of the iterations"}
    )
    bn: float = field(
        default=0.0,
        metadata={"help": "weight of the BatchNorm-statistics prior (Yin et al. 2021); needs a "
                          "model with BatchNorm; 0: off"},
    )
    bn_source: str = field(
        default="auto",
        metadata={"help": "statistics the prior pulls towards: returned (inferred from the "
                          "buffers the user sent), global (the global model's running "
                          "statistics) or auto (returned when sent, else global)"},
    )

    bn_form: str = field(
        default="standardised",
        metadata={"help": "form of the BatchNorm prior: standardised (each layer in units of "
                          "the target's standard deviation) or yin (Yin et al.'s raw form)"},
    )

    def __post_init__(self) -> None:
        """Refuse a non-positive step size, negative prior weights and an unknown BN source."""
        super().__post_init__()
        check_numbers(self, positive=("lr",), non_negative=("tv", "bn"))
        check_source(self.bn_source)


@register_attack("inverting-gradients")
class InvertingGradients(ComposedInversion):
    """Geiping et al.'s attack: cosine similarity + TV, signed Adam, box constraint (eq. 4)."""

    Config = InvertingGradientsConfig
    config: InvertingGradientsConfig

    def shorthand_optimiser(self) -> tuple[str, dict[str, Any]]:
        """Return signed Adam (or Adam) with the preset's step size and decay."""
        cfg = self.config
        return ("signed-adam" if cfg.signed else "adam"), {"lr": cfg.lr, "decay": cfg.lr_decay}

    def shorthand_priors(self) -> list[tuple[str, dict[str, Any]]]:
        """Return the TV prior of Geiping et al. 2020, plus BatchNorm statistics when weighted."""
        cfg = self.config
        priors: list[tuple[str, dict[str, Any]]] = [("tv", {"weight": cfg.tv})]
        if cfg.bn > 0:
            priors.append(("bn", {"weight": cfg.bn, "source": cfg.bn_source,
                                  "form": cfg.bn_form}))
        if cfg.boxed:
            priors.append(("box", {}))
        return priors
