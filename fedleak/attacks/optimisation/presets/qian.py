"""Qian & Hansen (2021), "What can we learn from gradients?", Algorithm 2.

DLG with a uniform initialisation and a decaying regulariser.

The attack minimises the euclidean gradient distance of DLG plus a regulariser R,

    x̂ = argmin_x  Σ_l ‖u_l(x, ŷ) − u*_l‖²  +  λ_i R(x),

* one image: the L2 regulariser ``R(x) = ‖x‖_F²`` (Sec. 4: it keeps x̂ small early on, away
  from sigmoid saturation and near the valid range);
* a batch of n: the orthogonality regulariser ``R(x) = Σ_{k≠k'} (x_kᵀ x_{k'})²`` (x_k the k-th
  image flattened), which pushes the reconstructions apart so they do not all converge to the
  same mixture (Sec. 4, Fig. 5);

with ``λ_i = λ₀ · 0.9^⌊i/m⌋`` (Algorithm 2, lines 15–16: λ ← 0.9 λ every m iterations), so the
bias of the regulariser fades out. The paper's model takes images on [0, 1] directly; here the
model sees normalised images, so the attack optimises those but evaluates R on the same images
mapped back to [0, 1] (``x·std + mean``), the space the paper's regularisers were designed for
(there a dark background is 0, and two digits are orthogonal when their strokes do not
overlap; in the normalised space the shared background alone makes every pair correlated).
The initial images are drawn from U(0, 1) in that pixel space (Algorithm 2, line 4). The
paper's Algorithm 2 also optimises the labels; here they come from the analytic label recovery
of :func:`recover_labels` (iDLG for one image, counting for a batch), which is exact for one
image. The update step is Adam (the paper reports first-order Adam as the stable choice for
high-dimensional inputs, Sec. 4.2) or plain gradient descent (Algorithm 2, line 13).

A preset of the composed optimisation attack (:mod:`fedleak.attacks.optimisation.composed`):
objective ``euclidean``, prior ``qian`` (``l2`` for one image, ``orthogonality`` for a batch,
decaying), optimiser ``adam`` (or ``sgd``) at a constant step, uniform init, restarts picked by the
distance alone (``select=objective``); the shorthand options ``lr``, ``optimizer``,
``regularizer``, ``weight``, ``decay`` and ``decay_every`` set those parts.

On CUDA (``capture``) one step — replay, distance, regulariser, gradient, Adam or SGD — is
recorded as a CUDA graph and replayed (the eager loop's maths with its state on the
device).

Measured (digits, first 4 train images, ``mlp:width=64`` untrained, 2000 Adam steps at lr 0.05,
attack seeds 0/1): orthogonality with λ₀ = 1e-5 gives 55.3 / 45.5 dB, none 45.6 / 48.0 dB,
λ₀ = 1e-4 35.8 / 35.8 dB — the regulariser must stay small, hence the default 1e-5.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fedleak.attacks.attack_registry import register_attack
from fedleak.attacks.observation import Observation, Reconstruction
from fedleak.attacks.optimisation.composed import ComposedInversion
from fedleak.attacks.optimisation.engine.composed_config import ComposedConfig, check_numbers
from fedleak.attacks.optimisation.engine.initial import uniform_init
from fedleak.attacks.optimisation.priors import (
    BoundPrior,
    QianRegularizer,
    l2_regularizer,
    orthogonality_regularizer,
    to_pixels,
)
from fedleak.attacks.optimisation.priors import decayed_weight as regularizer_weight

__all__ = ["Qian", "QianConfig", "l2_regularizer", "orthogonality_regularizer",
           "regularizer_weight", "to_pixels", "uniform_init"]

REGULARISERS = ("auto", "l2", "orthogonality", "none")
OPTIMISERS = ("adam", "sgd")


@dataclass
class QianConfig(ComposedConfig):
    """Hyperparameters of Qian & Hansen's Algorithm 2."""

    iterations: int = field(default=2000, metadata={"help": "optimisation steps per restart"})
    restarts: int = field(default=1, metadata={"help": "U(0,1) inits; lowest distance wins"})
    objective: str = field(default="euclidean", metadata={
        "help": "objective part (euclidean: the paper's distance; cosine, masked-cosine, "
                "gaussian, or auto: the one modelling the published defenses)"})
    optimizer: str = field(default="adam", metadata={
        "help": "'adam' or 'sgd' (plain gradient descent, Alg. 2), or any optimiser part "
                "NAME[:k=v;k=v] (signed-adam, adam, sgd)"})
    init: str = field(default="uniform", metadata={
        "help": "uniform: U(0,1) in pixel space (Alg. 2); gaussian: N(0,1) normalised"})
    select: str = field(default="objective", metadata={
        "help": "pick the restart by objective alone (the distance) or total (with R)"})
    lr: float = field(default=0.05, metadata={"help": "step size eta"})
    regularizer: str = field(
        default="auto",
        metadata={"help": "'auto' (l2 for one image, orthogonality for a batch), 'l2', "
                          "'orthogonality' or 'none'"},
    )
    weight: float = field(
        default=1e-5, metadata={"help": "initial regulariser weight lambda_0 (R on [0, 1] pixels)"}
    )
    decay: float = field(default=0.9, metadata={"help": "lambda <- decay * lambda every m steps"})
    decay_every: int = field(default=100, metadata={"help": "m of Algorithm 2"})

    def __post_init__(self) -> None:
        """Refuse a bad step size, weight, decay outside (0, 1] or a decay interval below 1."""
        super().__post_init__()
        check_numbers(self, positive=("lr",), non_negative=("weight",),
                      at_least_one=("decay_every",))
        if not 0 < self.decay <= 1:
            raise ValueError(f"decay must lie in (0, 1], got {self.decay}")
        if self.regularizer not in REGULARISERS:
            raise ValueError(f"regularizer must be one of {REGULARISERS}, got "
                             f"{self.regularizer!r}")
        if self.optimizer.partition(":")[0] not in (*OPTIMISERS, "signed-adam"):
            raise ValueError(f"optimizer must be one of {OPTIMISERS} (or signed-adam), got "
                             f"{self.optimizer!r}: Algorithm 2's decaying regulariser needs a "
                             "first-order optimiser")


@register_attack("qian")
class Qian(ComposedInversion):
    """Qian & Hansen's Algorithm 2: euclidean matching, U(0,1) init, decaying L2/orthogonality."""

    Config = QianConfig
    config: QianConfig

    def shorthand_optimiser(self) -> tuple[str, dict[str, Any]]:
        """Return Adam with the preset's step size."""
        return "adam", {"lr": self.config.lr}

    def shorthand_priors(self) -> list[tuple[str, dict[str, Any]]]:
        """Return the decayed regulariser of Qian & Hansen (none when ``regularizer=none``)."""
        cfg = self.config
        if cfg.regularizer == "none":
            return []
        name = "qian" if cfg.regularizer == "auto" else cfg.regularizer
        return [(name, {"weight": cfg.weight, "decay": cfg.decay, "every": cfg.decay_every})]

    def regularizer_name(self, num_images: int) -> str:
        """Return the regulariser used for a batch of ``num_images`` ('auto' resolved)."""
        if self.config.regularizer != "auto":
            return self.config.regularizer
        return QianRegularizer.chosen(num_images)

    def describe(self, result: Reconstruction, observation: Observation,
                 priors: Sequence[BoundPrior]) -> None:
        """Record the parts and the regulariser used in the result's extras."""
        super().describe(result, observation, priors)
        result.extras["regularizer"] = self.regularizer_name(observation.num_images)
