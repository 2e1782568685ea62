"""Image priors of the optimisation attacks, as small registered parts.

An optimisation attack minimises a gradient-matching objective J (:mod:`fedleak.attacks.
objectives`) plus weighted priors,

    x̂ = argmin_x  J(u(x, ŷ), u*)  +  Σ_k λ_k(i) R_k(x),                              (1)

where λ_k(i) may change with the iteration i (Qian & Hansen's λ ← 0.9 λ every m steps) and a
constraint prior (``box``) is the indicator of a set, applied as a projection after each step
(its proximal step). Each part gives R_k per candidate batch, in the two forms the loop needs:
``single(x)`` on one batch [n, C, H, W] (0-dim) and ``rows(X)`` on R restarts side by side
[R, n, C, H, W] ([R]); a prior whose ``rows`` couples the restarts (``group``) needs them
optimised together.

- ``tv``: anisotropic total variation of Geiping et al.'s code, mean ``|horizontal|`` + mean
  ``|vertical|`` differences (:func:`total_variation`).
- ``bn``: Yin et al. (CVPR 2021, eq. 6) R_BN = Σ_l ‖μ_l(x) − μ_l‖₂ + ‖σ²_l(x) − σ²_l‖₂ over the
  BatchNorm layers (``form=yin``), or its standardised form (the default), towards the
  statistics the threat model gives (:mod:`fedleak.attacks.optimisation.batch_statistics`).
- ``l2``: ‖x‖_F² on the [0, 1] pixel scale (Qian & Hansen 2021, Sec. 4, one image).
- ``orthogonality``: Σ_{k≠k'} (x_kᵀ x_{k'})² on the pixel scale (Qian & Hansen, a batch).
- ``qian``: Qian & Hansen's choice: ``l2`` for one image, ``orthogonality`` for a batch.
- ``group``: Yin et al.'s group consistency (eq. 8) R_group = ‖x_r − E(x)‖₂, the distance of
  restart r's batch to the pixel-wise mean of all restarts' batches (held fixed within a step;
  unlike the paper, the candidates are not registered to each other before averaging).
- ``epoch``: Dimitrov et al.'s epoch-consistency prior (TMLR 2022) over the per-epoch copies
  of a shuffled multi-epoch FedAvg replay (:mod:`fedleak.attacks.optimisation.fedavg.epochs`); added
  by the composed attacks whenever the replay takes copies.
- ``box``: x ∈ [0, 1]^n on the pixel scale, by projection.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from fedleak.attacks.observation import Observation
from fedleak.attacks.optimisation.batch_statistics import (
    FORMS,
    SOURCES,
    batch_norm_prior,
    target_statistics,
)
from fedleak.attacks.optimisation.fedavg.epochs import epoch_consistency, epoch_copies
from fedleak.attacks.optimisation.restarts import restart_total_variation
from fedleak.attacks.parts import AttackPart, NoOptions, PartError
from fedleak.registry import Registry


def total_variation(images: torch.Tensor) -> torch.Tensor:
    """Anisotropic TV of the authors' code: mean ``|horizontal|`` + mean ``|vertical|`` differences.

    ``TV(x) = mean |x[..., :, 1:] − x[..., :, :-1]| + mean |x[..., 1:, :] − x[..., :-1, :]|``.
    """
    dx = (images[:, :, :, 1:] - images[:, :, :, :-1]).abs().mean()
    dy = (images[:, :, 1:, :] - images[:, :, :-1, :]).abs().mean()
    return dx + dy


def to_pixels(images: torch.Tensor, observation: Observation) -> torch.Tensor:
    """Return normalised ``images`` [..., C, H, W] on the pixel scale: ``x · std + mean``."""
    mean = torch.as_tensor(observation.mean, dtype=images.dtype, device=images.device)
    std = torch.as_tensor(observation.std, dtype=images.dtype, device=images.device)
    return images * std.view(-1, 1, 1) + mean.view(-1, 1, 1)


def l2_regularizer(images: torch.Tensor) -> torch.Tensor:
    """``‖x‖_F²``: the squared Frobenius norm of the whole batch."""
    return images.square().sum()


def orthogonality_regularizer(images: torch.Tensor) -> torch.Tensor:
    """``Σ_{k≠k'} (x_kᵀ x_{k'})²`` over ordered pairs of distinct images (each pair twice).

    With ``X`` the [n, D] matrix of flattened images and ``G = X Xᵀ`` its Gram matrix, this is
    ``‖G‖_F² − Σ_k G_kk²``.
    """
    flat = images.flatten(1)
    gram = flat @ flat.T
    return gram.square().sum() - gram.diagonal().square().sum()


def decayed_weight(iteration: int, weight: float, decay: float, every: int) -> float:
    """``λ_i = λ₀ · decay^⌊i/m⌋`` (0-based iteration i): λ ← decay · λ every m iterations."""
    return weight * decay ** (iteration // every)


class BoundPrior:
    """A prior bound to one observation: R(x) per batch and per restart, and its weights."""

    def __init__(self, part: PriorPart, single: Callable[[torch.Tensor], torch.Tensor],
                 rows: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 source: str | None = None) -> None:
        self.part = part
        self.single = single
        self._rows = rows
        #: where the statistics of a BatchNorm prior came from (recorded in metrics.json)
        self.source = source

    def rows(self, images: torch.Tensor) -> torch.Tensor:
        """R of each restart's batch: ``images`` [R, n, C, H, W] → [R]."""
        if self._rows is not None:
            return self._rows(images)
        return torch.stack([self.single(x) for x in images])

    def weight(self, iteration: int, iterations: int) -> float:
        """λ at 0-based ``iteration`` of ``iterations``."""
        return self.part.weight(iteration, iterations)


class PriorPart(AttackPart):
    """A registered prior R(x) with its weight λ (eq. (1) of the module docstring)."""

    #: R couples the restarts (they must be optimised side by side)
    coupled: ClassVar[bool] = False
    #: a constraint applied by projection, not a term of the objective
    constraint: ClassVar[bool] = False
    #: R may be evaluated on several observations' candidates packed as rows
    packable: ClassVar[bool] = False

    def weight(self, iteration: int, iterations: int) -> float:
        """λ at 0-based ``iteration`` (constant unless the part decays it)."""
        return float(getattr(self.config, "weight", 0.0))

    def scheduled(self) -> bool:
        """Whether λ changes with the iteration."""
        return False

    def bind(self, observation: Observation, restarts: int) -> BoundPrior:
        """R for ``observation`` (checked: :meth:`check` first)."""
        raise NotImplementedError

    def project(self, images: torch.Tensor, box: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Apply the constraint in place, ``box`` the pixel box (lower, upper) normalised."""


PRIORS: Registry[PriorPart] = Registry("prior", "fedleak.priors", PartError)


def register_prior(name: str) -> Callable[[type[PriorPart]], type[PriorPart]]:
    """Class decorator: make a prior part available as ``name``."""
    return PRIORS.register(name)


def _check_weight(weight: float) -> None:
    if not weight >= 0 or weight == float("inf"):
        raise ValueError(f"weight must be a finite number >= 0, got {weight}")


@dataclass
class Weighted:
    """Options of a prior with a single weight λ."""

    weight: float = field(default=1e-2, metadata={"help": "weight λ of the prior"})

    def __post_init__(self) -> None:
        """Refuse a negative or infinite weight."""
        _check_weight(self.weight)


@register_prior("tv")
class TotalVariation(PriorPart):
    """λ TV(x): anisotropic total variation (Geiping et al. 2020, eq. 4)."""

    Config = Weighted
    packable = True

    def bind(self, observation: Observation, restarts: int) -> BoundPrior:
        """Bind the total variation R_TV (one image and restart forms)."""
        return BoundPrior(self, total_variation, restart_total_variation)


@dataclass
class BatchNormConfig:
    """Options of R_BN: its weight, the statistics' source and the distance's form."""

    weight: float = field(default=1e-2, metadata={"help": "weight of R_BN"})
    source: str = field(default="auto", metadata={
        "help": "statistics R_BN pulls towards: returned (inferred from the buffers the user "
                "sent), global (the global model's running statistics) or auto"})
    form: str = field(default="standardised", metadata={
        "help": "standardised (each layer in units of the target's standard deviation) or yin "
                "(Yin et al.'s raw distances)"})

    def __post_init__(self) -> None:
        """Refuse a bad weight, an unknown statistics source or form."""
        _check_weight(self.weight)
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {self.source!r}")
        if self.form not in FORMS:
            raise ValueError(f"form must be one of {', '.join(FORMS)}, got {self.form!r}")


@register_prior("bn")
class BatchNormStatistics(PriorPart):
    """BatchNorm statistics prior λ R_BN (Yin et al. 2021, eq. 6).

    The batch's BatchNorm statistics pulled towards the threat model's; refused on a model
    without BatchNorm or without the asked-for statistics.
    """

    Config = BatchNormConfig
    config: BatchNormConfig

    def check(self, observation: Observation) -> None:
        """Refuse a model without BatchNorm or without the asked-for statistics."""
        target_statistics(observation, self.config.source)

    def bind(self, observation: Observation, restarts: int) -> BoundPrior:
        """Bind R_BN to the target statistics, recording their source."""
        targets, source = target_statistics(observation, self.config.source)
        return BoundPrior(self, batch_norm_prior(observation, targets, self.config.form),
                          source=source)


@dataclass
class DecayingConfig:
    """Options of a decayed prior: λ₀, the decay factor and its interval m."""

    weight: float = field(default=1e-5, metadata={
        "help": "initial weight lambda_0 (R on the [0, 1] pixel scale)"})
    decay: float = field(default=0.9, metadata={"help": "lambda <- decay * lambda every m steps"})
    every: int = field(default=100, metadata={"help": "m: steps between two decays"})

    def __post_init__(self) -> None:
        """Refuse a bad weight, a decay outside (0, 1] and an interval below 1."""
        _check_weight(self.weight)
        if not 0 < self.decay <= 1:
            raise ValueError(f"decay must lie in (0, 1], got {self.decay}")
        if self.every < 1:
            raise ValueError(f"every must be >= 1, got {self.every}")


class DecayingPrior(PriorPart):
    """Decayed prior λ_i R(x) (Qian & Hansen, Algorithm 2, lines 15–16).

    λ_i = λ₀ · decay^⌊i/m⌋, R on the [0, 1] pixel scale.
    """

    Config = DecayingConfig
    config: DecayingConfig

    def weight(self, iteration: int, iterations: int) -> float:
        """Return λ_i = λ₀ · decay^⌊i/m⌋ at 0-based ``iteration``."""
        cfg = self.config
        return decayed_weight(iteration, cfg.weight, cfg.decay, cfg.every)

    def scheduled(self) -> bool:
        """Tell whether λ changes with the iteration (decay below 1)."""
        return self.config.decay != 1

    def regularizer(self, num_images: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """Return R for a batch of ``num_images`` (each decayed prior names its own)."""
        raise NotImplementedError

    def bind(self, observation: Observation, restarts: int) -> BoundPrior:
        """Bind R on the [0, 1] pixel scale of ``observation``."""
        regularizer = self.regularizer(observation.num_images)
        return BoundPrior(self, lambda x: regularizer(to_pixels(x, observation)))


@register_prior("l2")
class SquaredNorm(DecayingPrior):
    """λ_i ‖x‖_F² (Qian & Hansen, one image)."""

    def regularizer(self, num_images: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """Return the squared l2 norm regulariser."""
        return l2_regularizer


@register_prior("orthogonality")
class Orthogonality(DecayingPrior):
    """λ_i Σ_{k≠k'} (x_kᵀ x_{k'})² (Qian & Hansen, a batch: pushes the images apart)."""

    def regularizer(self, num_images: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """Return the orthogonality regulariser between the batch's images."""
        return orthogonality_regularizer


@register_prior("qian")
class QianRegularizer(DecayingPrior):
    """Qian & Hansen's choice: λ_i ‖x‖² for one image, λ_i orthogonality for a batch."""

    @staticmethod
    def chosen(num_images: int) -> str:
        """Return the regulariser used for a batch of ``num_images``."""
        return "l2" if num_images == 1 else "orthogonality"

    def regularizer(self, num_images: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """Return l2 for a single image, else orthogonality (Qian & Hansen)."""
        return l2_regularizer if num_images == 1 else orthogonality_regularizer


@register_prior("group")
class GroupConsistency(PriorPart):
    """λ ‖x_r − E(x)‖₂ (Yin et al. 2021, eq. 8).

    Each restart pulled towards the restarts' pixel-wise mean (held fixed within a step; no
    registration). Needs restarts >= 2.
    """

    Config = Weighted
    coupled = True
    packable = False

    def bind(self, observation: Observation, restarts: int) -> BoundPrior:
        """Bind the pull towards the restarts' mean; refuse fewer than two restarts."""
        if restarts < 2:
            raise PartError("prior 'group' pulls restarts towards their mean: it needs "
                            f"restarts >= 2, got {restarts}; set -o restarts=4 or drop it")

        def rows(images: torch.Tensor) -> torch.Tensor:
            mean = images.detach().mean(0, keepdim=True)
            distances: torch.Tensor = (images - mean).flatten(1).norm(dim=1)
            return distances

        def single(images: torch.Tensor) -> torch.Tensor:
            return torch.zeros((), dtype=images.dtype, device=images.device)

        return BoundPrior(self, single, rows)


@dataclass
class EpochConfig:
    """Options of R_epoch: its weight."""

    weight: float = field(default=1.0, metadata={
        "help": "weight of R_epoch (normalised space; chosen in docs/fedavg.md)"})

    def __post_init__(self) -> None:
        """Refuse a negative or infinite weight."""
        _check_weight(self.weight)


@register_prior("epoch")
class EpochConsistency(PriorPart):
    """Epoch-consistency prior λ R_epoch (Dimitrov et al. 2022).

    The per-epoch copies of a shuffled FedAvg replay keep one mean image
    (:func:`~fedleak.attacks.optimisation.fedavg.epochs.epoch_consistency`); zero for one copy.
    """

    Config = EpochConfig
    config: EpochConfig

    def bind(self, observation: Observation, restarts: int) -> BoundPrior:
        """Bind R_epoch for the observation's per-epoch copies (zero for one copy)."""
        copies = epoch_copies(observation)

        def term(images: torch.Tensor) -> torch.Tensor:  # [..., copies·n, C, H, W] → [...]
            if copies == 1:  # nothing to tie: zero, still a function of the images
                return images.flatten(-4).sum(-1) * 0
            return epoch_consistency(images, copies)

        return BoundPrior(self, term, term)


@register_prior("box")
class Box(PriorPart):
    """Box constraint x ∈ [0, 1]^n on the pixel scale, applied by projection.

    [(0 − mean)/std, (1 − mean)/std] normalised, applied by projection after every step.
    """

    Config = NoOptions
    constraint = True
    packable = True

    def bind(self, observation: Observation, restarts: int) -> BoundPrior:
        """Bind a zero term: the box acts by projection, not through F."""
        def zero(images: torch.Tensor) -> torch.Tensor:
            return torch.zeros((), dtype=images.dtype, device=images.device)

        return BoundPrior(self, zero)

    def project(self, images: torch.Tensor, box: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Clamp ``images`` to the pixel ``box`` in place."""
        images.clamp_(box[0], box[1])


def create_prior(name: str, options: Mapping[str, Any] | None = None) -> PriorPart:
    """Prior part ``name`` with ``options``; unknown names list the valid ones."""
    return PRIORS.create(name, options)


def prior_names() -> tuple[str, ...]:
    """Every registered prior part."""
    return PRIORS.names()
