"""GradInversion (Yin et al., CVPR 2021, "See through Gradients").

Batch recovery with BatchNorm-statistics and group-consistency priors.

The attack minimises (eq. 3 and 4 of the paper)

    x̂ = argmin_x  ‖∇_θ L(x, ŷ) − ∇_θ L(x*, y*)‖₂²  +  α_TV R_TV(x) + α_ℓ2 ‖x‖₂²
                  +  α_BN R_BN(x)  +  α_group R_group(x),

over G restarts ("seeds") optimised side by side, with

- R_BN = Σ_l ‖μ_l(x) − μ_l‖₂ + ‖σ²_l(x) − σ²_l‖₂ (eq. 6, the ``bn`` prior's ``form=yin``): the
  batch's BatchNorm statistics
  pulled towards those the threat model gives — inferred from the buffers a FedAvg user
  returns, or the global model's running statistics
  (:mod:`fedleak.attacks.optimisation.batch_statistics`);
- R_group = ‖x_g − E(x)‖₂ (eq. 8): each restart towards the restarts' pixel-wise mean;
- ŷ restored from the last layer's gradient before the optimisation (Sec. 3.1): fedleak's
  label recovery (:func:`fedleak.attacks.labels.recover_labels`: iDLG for one image, counting
  on the classifier's bias gradient for a batch, which handles repeated labels too, where the
  paper's row-minimum rule assumes distinct ones).

A preset of the composed attack (:mod:`fedleak.attacks.optimisation.composed`): objective
``euclidean``, priors ``tv`` + ``l2`` + ``bn`` + ``group`` + ``box``, optimiser ``adam`` with the
3/8, 5/8, 7/8 step decay (the paper anneals with a cosine schedule), Gaussian init, 4 restarts. The
defaults are the paper's weights for ImageNet ResNet-50 (α_TV 1e-4, α_ℓ2 1e-6, α_BN 0.1,
α_group 0.01, lr 0.1), a starting point, not a tuned setting for fedleak's small models.
Differences from the paper, said here: no registration of the restarts before averaging, no
"image fidelity" adversarial term, and a step decay instead of cosine annealing. It needs a
model with BatchNorm (``bn=0`` turns R_BN off for one without) and restarts >= 2 (``group=0``
for one restart); both are refused before the first iteration with what to change.
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


@dataclass
class GradInversionConfig(ComposedConfig):
    """GradInversion's weights (the paper's ResNet-50 defaults) as shorthand options."""

    iterations: int = field(default=2000, metadata={"help": "Adam steps per restart "
                                                            "(paper: 20000)"})
    restarts: int = field(default=4, metadata={
        "help": "restarts optimised side by side for the group prior (paper: 8 seeds)"})
    objective: str = field(default="euclidean", metadata={
        "help": "objective part (euclidean: the paper's l2 gradient distance; cosine, "
                "masked-cosine, gaussian, or auto: the one modelling the published defenses)"})
    lr: float = field(default=0.1, metadata={"help": "Adam step size, decayed x0.1 at 3/8, "
                                                     "5/8, 7/8"})
    tv: float = field(default=1e-4, metadata={"help": "alpha_TV"})
    l2: float = field(default=1e-6, metadata={"help": "alpha_l2 (R on the [0, 1] pixel scale)"})
    bn: float = field(default=0.1, metadata={"help": "alpha_BN; 0 for a model without "
                                                     "BatchNorm"})
    bn_source: str = field(default="auto", metadata={
        "help": "statistics R_BN pulls towards: returned, global or auto"})
    group: float = field(default=1e-2, metadata={"help": "alpha_group; 0 for one restart"})

    def __post_init__(self) -> None:
        """Refuse a non-positive step size, negative prior weights and an unknown BN source."""
        super().__post_init__()
        check_numbers(self, positive=("lr",), non_negative=("tv", "l2", "bn", "group"))
        check_source(self.bn_source)


@register_attack("gradinversion")
class GradInversion(ComposedInversion):
    """Yin et al.'s GradInversion.

    l2 matching + TV, l2, BatchNorm and group-consistency priors over restarts optimised together,
    with label restoration.
    """

    Config = GradInversionConfig
    config: GradInversionConfig

    def shorthand_optimiser(self) -> tuple[str, dict[str, Any]]:
        """Return Adam with the step decay (Yin et al. 2021)."""
        return "adam", {"lr": self.config.lr, "decay": True}

    def shorthand_priors(self) -> list[tuple[str, dict[str, Any]]]:
        """Return GradInversion's priors: TV, l2, BatchNorm statistics and group consistency."""
        cfg = self.config
        named: list[tuple[str, dict[str, Any]]] = [
                 ("tv", {"weight": cfg.tv}),
                 ("l2", {"weight": cfg.l2, "decay": 1.0}),
                 ("bn", {"weight": cfg.bn, "source": cfg.bn_source, "form": "yin"}),
                 ("group", {"weight": cfg.group})]
        return [(name, options) for name, options in named if options["weight"] > 0] + \
            [("box", {})]
