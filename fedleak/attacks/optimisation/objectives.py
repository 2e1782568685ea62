"""Gradient-matching objectives of the optimisation attacks, as small registered parts.

Every part here is a cosine distance between a *weighted* copy of the replayed update u(x) and
of the observed update u*,

    J(u) = 1 − ⟨D ⊙ u, D ⊙ u*⟩ / (‖D ⊙ u‖ ‖D ⊙ u*‖),                              (1)

for a fixed non-negative diagonal D (one tensor per parameter, or one number per layer) that
the part derives from the observed update and from the defense chain the victim publishes
(:class:`~fedleak.attacks.published.PublishedDefense`: Kerckhoffs, the mechanism is public).
By the chain rule ∂J/∂u = D ⊙ ∂J/∂(D ⊙ u), so the analytic gradient of Inverting Gradients'
cosine (``s · (u* − (a/b) u)``,
:class:`~fedleak.attacks.optimisation.gradient_matching.CosineObjective`) is reused on the weighted
vectors and multiplied by D once more
(:class:`~fedleak.attacks.optimisation.gradient_matching.WeightedObjective`).

- ``cosine``: D = 1, eq. (4) of Geiping et al. (2020): the plain attack.
- ``masked-cosine``: D = M + w(1 − M) with M = 1[u* ≠ 0], the coordinates a pruning defense
  kept (w = 0 is breaching's masked cosine). Pruning zeroes the p smallest entries; the plain
  cosine (w = 1) asks the candidate's update to be exactly zero there, which no real image
  does, yet those entries *are* small, which is information: w = 0.1 (the default, chosen on
  lenet-zhu photos 5 and 10 at p = 0.9 and 0.99) keeps a little of it.
- ``gaussian``: the profile likelihood of a noised update. If u* = λ u(x*) + ξ with ξ_l ~
  N(0, σ_l² I) per layer and an unknown scale λ ≥ 0 (clipping, the step size), maximising the
  likelihood over λ in closed form leaves maximising ⟨W u, u*⟩² / ⟨W u, u⟩ with W = diag(1/σ_l²),
  i.e. eq. (1) with D_l = 1/σ_l (the sign kept, so the candidate points along u*). σ_l² is the
  sum of what the published defenses add per coordinate
  (:mod:`fedleak.attacks.optimisation.published_noise`: ``noise`` σ²; DP-SGD's noise, σ C / B per
  step, τ per step and √steps over FedAvg's steps; ``quantize``'s stochastic rounding, (m_l/s)²/6 on
  average). With isotropic noise alone D is constant and this *is* the cosine: the noise level then
  cannot help the data term (the prior's weight is the place it would act). Clipping the update
  scales it: λ absorbs it, which is the clipping-aware scale handling (every objective here is
  scale-invariant). With ``masked`` on (the default when a ``prune`` is published) D is multiplied
  by the mask. Its ``noise-prior`` κ weighs the data term 1/(1 + κ r), r the published noise's
  energy over the update's, so the priors weigh more as the noise grows.

``masked-cosine`` and ``gaussian`` may add a hinge on the interval each coordinate of the true
update lies in (pruning's threshold, quantisation's step:
:mod:`fedleak.attacks.optimisation.interval_hinges`).

Each part :meth:`~ObjectivePart.check` s the observation before the first iteration and refuses
one it does not fit (a mask without a pruning defense) saying what to change.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from fedleak.attacks.observation import Observation
from fedleak.attacks.optimisation.gradient_matching import (
    EuclideanObjective,
    ScaledObjective,
    WeightedObjective,
)
from fedleak.attacks.optimisation.interval_hinges import (
    IntervalHinge,
    pruning_bounds,
    quantisation_bounds,
    require_known_scale,
)
from fedleak.attacks.optimisation.published_noise import (
    additive_variance,
    noise_ratio,
    noise_variances,
)
from fedleak.attacks.parts import AttackPart, NoOptions, PartError
from fedleak.attacks.published import find
from fedleak.registry import Registry


class ObjectivePart(AttackPart):
    """A registered objective: builds eq. (1) with its own D for an observation."""

    #: a weighted cosine of eq. (1) (scale-invariant); False for the euclidean distance
    cosine_family: ClassVar[bool] = True

    @abstractmethod
    def diagonal(self, observed: Sequence[torch.Tensor], observation: Observation,
                 per_row: bool) -> list[torch.Tensor] | None:
        """Return the diagonal D per parameter, or None for D = 1.

        D per parameter (broadcastable to ``observed``; per row when ``per_row``), or None for D =
        1.
        """

    def packs(self, observation: Observation) -> bool:
        """Tell whether the objective is eq. (1) with a diagonal alone.

        Whether the objective for ``observation`` is eq. (1) with a diagonal alone, which packed
        attacks build per row from :meth:`diagonal` (a hinge or a data-term weight is more: such
        observations are packed as row blocks, each through its own objective).
        """
        return not getattr(self.config, "hinge", 0.0)

    def build(self, inner: Callable[..., Any], observed: Sequence[torch.Tensor],
              observation: Observation, *, rows: bool = False, per_row: bool = False) -> Any:
        """Eq. (1) over ``observed``.

        The cosine ``inner`` (one update, or restarts when ``rows``) weighted when D is not 1;
        ``per_row``: ``observed`` is given per row.
        """
        options = {"per_row": True} if per_row else {}
        diag = self.diagonal(observed, observation, per_row)
        if diag is None:
            return inner(list(observed), **options)
        return WeightedObjective(inner, observed, diag, **options)


OBJECTIVES: Registry[ObjectivePart] = Registry("objective", "fedleak.objectives", PartError)


def register_objective(name: str) -> Callable[[type[ObjectivePart]], type[ObjectivePart]]:
    """Class decorator: make an objective part available as ``name``."""
    return OBJECTIVES.register(name)


@register_objective("cosine")
class Cosine(ObjectivePart):
    """``1 − cos(u, u*)`` over the whole update (D = 1): Inverting Gradients' eq. (4)."""

    Config = NoOptions

    def diagonal(self, observed: Sequence[torch.Tensor], observation: Observation,
                 per_row: bool) -> list[torch.Tensor] | None:
        """Return None: the plain cosine has D = 1."""
        return None


@register_objective("euclidean")
class Euclidean(ObjectivePart):
    """``Σ_l ‖u_l − u*_l‖²``: DLG's distance (Zhu et al. 2019; eq. (3) of Geiping et al.)."""

    Config = NoOptions
    cosine_family = False

    def diagonal(self, observed: Sequence[torch.Tensor], observation: Observation,
                 per_row: bool) -> list[torch.Tensor] | None:
        """Return None: DLG's distance is not weighted."""
        return None

    def build(self, inner: Callable[..., Any], observed: Sequence[torch.Tensor],
              observation: Observation, *, rows: bool = False, per_row: bool = False) -> Any:
        """Build DLG's squared distance ``Σ_l ‖u_l − u*_l‖²`` over ``observed``."""
        return EuclideanObjective(observed, rows=rows)


def kept_mask(observed: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``1[u* ≠ 0]`` per tensor, in the update's dtype: the coordinates a pruning defense kept."""
    return [(o != 0).to(o.dtype) for o in observed]


def require_prune(observation: Observation, part: str) -> None:
    """Refuse a masked objective when the victim publishes no pruning defense."""
    if find(observation.defenses, "prune") is None:
        published = ", ".join(d.name for d in observation.defenses) or "none"
        raise PartError(f"objective {part!r} matches only the coordinates a pruning defense "
                        f"kept, but the victim publishes no prune defense (published: "
                        f"{published}); use -o objective=cosine, or defend the victim with "
                        "--defense prune:p=...")


@dataclass
class MaskedConfig:
    """Options of the masked cosine: the weight w outside the kept mask, and the hinge weight β."""

    outside: float = field(default=0.1, metadata={
        "help": "weight w of the coordinates pruning zeroed (0: ignore them, breaching's "
                "masked cosine; 1: the plain cosine; 0.1 chosen on held-out photos)"})
    hinge: float = field(default=0.0, metadata={
        "help": "weight β of the pruning-threshold hinge: a zeroed coordinate whose rescaled "
                "candidate exceeds the smallest kept |u*| is penalised (0: off)"})

    def __post_init__(self) -> None:
        """Refuse w outside [0, 1] and a negative or infinite hinge weight."""
        if not 0 <= self.outside <= 1:
            raise ValueError(f"outside must lie in [0, 1], got {self.outside}")
        if not (self.hinge >= 0 and math.isfinite(self.hinge)):
            raise ValueError(f"hinge must be >= 0, got {self.hinge}")


@register_objective("masked-cosine")
class MaskedCosine(ObjectivePart):
    """``1 − cos(D ⊙ u, D ⊙ u*)`` with D = M + w(1 − M), M = 1[u* ≠ 0].

    The cosine over the coordinates pruning kept (w = ``outside`` = 0), or with the zeroed ones
    down-weighted.
    """

    Config = MaskedConfig
    config: MaskedConfig

    def check(self, observation: Observation) -> None:
        """Refuse an observation without a published prune (a hinge: without a known scale)."""
        require_prune(observation, self.name)
        if self.config.hinge:
            require_known_scale(observation, f"{self.name} (hinge)")

    def diagonal(self, observed: Sequence[torch.Tensor], observation: Observation,
                 per_row: bool) -> list[torch.Tensor] | None:
        """Return D = M + w(1 − M) with M = 1[u* ≠ 0] (M alone when w = 0)."""
        w = self.config.outside
        return [m * (1 - w) + w for m in kept_mask(observed)] if w else kept_mask(observed)

    def build(self, inner: Callable[..., Any], observed: Sequence[torch.Tensor],
              observation: Observation, *, rows: bool = False, per_row: bool = False) -> Any:
        """Build the masked cosine over ``observed``, plus the pruning hinge when β > 0."""
        base = super().build(inner, observed, observation, rows=rows, per_row=per_row)
        if not self.config.hinge:
            return base
        prune = find(observation.defenses, "prune")
        scope = prune.params.get("scope", "layer") if prune is not None else "layer"
        return IntervalHinge(base, observed, pruning_bounds(observed, scope, per_row),
                             self.config.hinge, per_row=per_row)


#: κ of ``gaussian:noise-prior``, chosen on lenet-zhu photos 5 and 10 under DP-SGD σ = 0.01,
#: C = 1 (docs/attacks.md).
NOISE_PRIOR = 15.0


@dataclass
class GaussianConfig:
    """Options of the Gaussian likelihood: masking, the quantisation hinge, the noise prior."""

    masked: str = field(default="auto", metadata={
        "help": "also mask to u* != 0: on, off, or auto (on when a prune defense is published)"})
    hinge: float = field(default=0.0, metadata={
        "help": "weight β of the quantisation-support hinge: a coordinate of the candidate "
                "farther than one rounding step from u* is penalised (needs a published "
                "quantize; 0: off)"})
    noise_prior: float = field(default=NOISE_PRIOR, metadata={
        "help": "κ: the data term is weighted 1/(1 + κ r), r = published additive noise "
                "energy / ‖u*‖², so the priors (tv, bn) weigh more as the noise grows "
                f"(0: off; {NOISE_PRIOR:g} chosen on held-out photos)"})

    def __post_init__(self) -> None:
        """Refuse an unknown ``masked`` value and a negative or infinite hinge weight."""
        if self.masked not in ("auto", "on", "off"):
            raise ValueError(f"masked must be auto, on or off, got {self.masked!r}")
        if not (self.hinge >= 0 and math.isfinite(self.hinge)):
            raise ValueError(f"hinge must be >= 0, got {self.hinge}")
        if not (self.noise_prior >= 0 and math.isfinite(self.noise_prior)):
            raise ValueError(f"noise-prior must be >= 0, got {self.noise_prior}")


@register_objective("gaussian")
class GaussianLikelihood(ObjectivePart):
    """Profile likelihood of u* = λ u(x) + ξ, ξ_l ~ N(0, σ_l²): eq. (1) with D_l = 1/σ_l."""

    Config = GaussianConfig
    config: GaussianConfig

    def _masked(self, observation: Observation) -> bool:
        if self.config.masked == "auto":
            return find(observation.defenses, "prune") is not None
        return self.config.masked == "on"

    def check(self, observation: Observation) -> None:
        """Refuse ``masked=on`` without prune, and a hinge without quantize (or with prune)."""
        if self.config.masked == "on":
            require_prune(observation, f"{self.name} (masked=on)")
        if self.config.hinge:
            names = [d.name for d in observation.defenses]
            if "quantize" not in names or "prune" in names:
                raise PartError(f"objective '{self.name}' with hinge > 0 bounds each "
                                "coordinate by the quantisation step, which needs a published "
                                "quantize defense and no prune (published: "
                                f"{', '.join(names) or 'none'}); use hinge=0")
            require_known_scale(observation, f"{self.name} (hinge)")

    def packs(self, observation: Observation) -> bool:
        """Tell whether it packs: no quantisation hinge and no noise-prior weight in use."""
        hinged = self.config.hinge and find(observation.defenses, "quantize") is not None
        weighted = self.config.noise_prior and additive_variance(observation) > 0
        return not hinged and not weighted

    def build(self, inner: Callable[..., Any], observed: Sequence[torch.Tensor],
              observation: Observation, *, rows: bool = False, per_row: bool = False) -> Any:
        """Build the weighted cosine with D_l = 1/σ_l, plus the quantisation hinge when asked."""
        base = super().build(inner, observed, observation, rows=rows, per_row=per_row)
        quantize = find(observation.defenses, "quantize")
        if self.config.hinge and quantize is not None:
            bounds = quantisation_bounds(observed, int(quantize.number("bits", 4)), per_row)
            base = IntervalHinge(base, observed, bounds, self.config.hinge, per_row=per_row)
        if self.config.noise_prior and additive_variance(observation) > 0:
            ratio = noise_ratio(observed, observation, per_row)
            base = ScaledObjective(base, 1 / (1 + self.config.noise_prior * ratio))
        return base

    def diagonal(self, observed: Sequence[torch.Tensor], observation: Observation,
                 per_row: bool) -> list[torch.Tensor] | None:
        """Return D_l = 1/σ_l from the published noise (masked when asked); None for D = 1."""
        variances = noise_variances(observed, observation, per_row)
        positive = [v[v > 0] for v in variances]
        floor = min((float(p.min()) for p in positive if p.numel()), default=0.0)
        masks = kept_mask(observed) if self._masked(observation) else None
        if floor == 0.0 and masks is None:
            return None  # no published noise: D constant, the cosine itself
        out = []
        for index, (o, v) in enumerate(zip(observed, variances, strict=True)):
            weight = (v.clamp(min=floor).rsqrt() * math.sqrt(floor)).to(o.dtype) if floor \
                else torch.ones((), dtype=o.dtype, device=o.device)
            weight = weight.to(o.device)
            out.append(weight * masks[index] if masks is not None else weight)
        return out


def build_objective(part: ObjectivePart, inner: Callable[..., Any],
                    observed: Sequence[torch.Tensor], observation: Observation,
                    **options: Any) -> Any:
    """Build ``part``'s objective over ``observed``.

    ``part``'s objective over ``observed`` (built by ``inner``: a cosine class), weighted when the
    part's D is not 1. ``options`` go to ``inner`` (``per_row``).
    """
    return part.build(inner, observed, observation, **options)


def create_objective(name: str, options: Mapping[str, Any] | None = None) -> ObjectivePart:
    """Objective part ``name`` with ``options``; unknown names list the valid ones."""
    return OBJECTIVES.create(name, options)


def objective_names() -> tuple[str, ...]:
    """Every registered objective part."""
    return OBJECTIVES.names()
