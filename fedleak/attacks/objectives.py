"""Gradient-matching objectives of the optimisation attacks, as small registered parts.

Every part here is a cosine distance between a *weighted* copy of the replayed update u(x) and
of the observed update u*,

    J(u) = 1 − ⟨D ⊙ u, D ⊙ u*⟩ / (‖D ⊙ u‖ ‖D ⊙ u*‖),                              (1)

for a fixed non-negative diagonal D (one tensor per parameter, or one number per layer) that
the part derives from the observed update and from the defense chain the victim publishes
(:class:`~fedleak.attacks.published.PublishedDefense`: Kerckhoffs, the mechanism is public).
By the chain rule ∂J/∂u = D ⊙ ∂J/∂(D ⊙ u), so the analytic gradient of Inverting Gradients'
cosine (``s · (u* − (a/b) u)``, :class:`~fedleak.attacks.inverting_gradients.CosineObjective`)
is reused on the weighted vectors and multiplied by D once more (:class:`WeightedObjective`).

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
  sum of what the published defenses add per coordinate: ``noise`` σ²; DP-SGD's noise
  (σ C / B per step, B the expected batch size, τ per step and √steps over FedAvg's steps);
  ``quantize``'s stochastic rounding, (m_l/s)²/6 on average with m_l = max|u*_l| (the scale
  survives quantisation exactly) and s = 2^{bits−1} − 1 levels. With isotropic noise alone
  D is constant and this *is* the cosine: the noise level then cannot help the data term
  (the prior's weight is the place it would act). Clipping the update scales it: λ absorbs it,
  which is the clipping-aware scale handling (every objective here is scale-invariant).
  With ``masked`` on (the default when a ``prune`` is published) D is multiplied by the mask.

Each part :meth:`~ObjectivePart.check` s the observation before the first iteration and refuses
one it does not fit (a mask without a pruning defense) saying what to change.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch

from fedleak.attacks.observation import Observation
from fedleak.attacks.published import PublishedDefense, find
from fedleak.registry import ConfigError, Registry


class PartError(ConfigError):
    """An attack part that does not fit the observation, or an unknown part or option."""


class GradientObjective(Protocol):
    """What the optimisation loop needs from an objective over replayed updates: J alone
    (choosing the restart), and J with its cotangent g and scale s, ∂J/∂u = s·g (a step)."""

    def value(self, candidate: Sequence[torch.Tensor]) -> torch.Tensor: ...

    def value_and_output_grads(
        self, candidate: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]: ...


class AttackPart(ABC):  # noqa: B024 - the kinds of part add their abstract method
    """A registered part of an optimisation attack, with a typed ``Config`` dataclass."""

    name: ClassVar[str] = ""
    Config: ClassVar[type[Any]]

    def __init__(self, config: Any | None = None) -> None:
        self.config = config if config is not None else self.Config()

    def check(self, observation: Observation) -> None:
        """Raise :class:`PartError` saying what to change when this part does not fit."""
        return None


class ObjectivePart(AttackPart):
    """A registered objective: builds eq. (1) with its own D for an observation."""

    #: a weighted cosine of eq. (1) (scale-invariant); False for the euclidean distance
    cosine_family: ClassVar[bool] = True

    @abstractmethod
    def diagonal(self, observed: Sequence[torch.Tensor], observation: Observation,
                 per_row: bool) -> list[torch.Tensor] | None:
        """D per parameter (broadcastable to ``observed``; per row when ``per_row``), or None
        for D = 1."""

    def packs(self, observation: Observation) -> bool:
        """Whether the objective for ``observation`` is eq. (1) with a diagonal alone, which
        packed attacks build per row from :meth:`diagonal` (a hinge or a data-term weight is
        more: such observations are packed as row blocks, each through its own objective)."""
        return not getattr(self.config, "hinge", 0.0)

    def build(self, inner: Callable[..., Any], observed: Sequence[torch.Tensor],
              observation: Observation, *, rows: bool = False, per_row: bool = False) -> Any:
        """Eq. (1) over ``observed``: the cosine ``inner`` (one update, or restarts when
        ``rows``) weighted when D is not 1; ``per_row``: ``observed`` is given per row."""
        options = {"per_row": True} if per_row else {}
        diag = self.diagonal(observed, observation, per_row)
        if diag is None:
            return inner(list(observed), **options)
        return WeightedObjective(inner, observed, diag, **options)


OBJECTIVES: Registry[ObjectivePart] = Registry("objective", "fedleak.objectives", PartError)


def register_objective(name: str) -> Callable[[type[ObjectivePart]], type[ObjectivePart]]:
    """Class decorator: make an objective part available as ``name``."""
    return OBJECTIVES.register(name)


class CosineObjective:
    """``1 − cos(u, u*)`` over the whole update (eq. 4 of Geiping et al.) with its gradient with
    respect to ``u``.

    ``u*`` is fixed for the whole attack: its squared norm is computed once.
    """

    def __init__(self, observed: Sequence[torch.Tensor]) -> None:
        self.observed = [t.detach() for t in observed]
        squares = torch.stack([t.double().square().sum() for t in self.observed]).sum()
        self.observed_norm = squares.sqrt().to(self.observed[0].dtype)

    def dots(self, candidate: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``a = ⟨u, u*⟩`` and ``b = ‖u‖²`` (0-dim tensors, no synchronisation).

        Both per tensor, one right after the other, so the second read of ``u_l`` hits the cache.
        """
        cross, square = [], []
        for u, o in zip(candidate, self.observed, strict=True):
            flat = u.reshape(-1)
            cross.append(torch.vdot(flat, o.reshape(-1)))
            square.append(torch.vdot(flat, flat))
        return torch.stack(cross).sum(), torch.stack(square).sum()

    def value(self, candidate: Sequence[torch.Tensor]) -> torch.Tensor:
        """``1 − a / (√b ‖u*‖)``."""
        a, b = self.dots([u.detach() for u in candidate])
        return 1 - a / (b.sqrt() * self.observed_norm)

    def value_and_output_grads(
        self, candidate: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """The objective and its gradient with respect to ``u`` as ``scale · g`` (c = ‖u*‖):

            ∂/∂u = −u*/(√b c) + a u/(b^{3/2} c) = scale · g,  scale = −1/(√b c),  g = u* − (a/b) u.

        ``g`` is written into the memory of ``candidate`` in one pass (the replayed update is
        consumed: it is used once), so no update-sized tensor is allocated per iteration.
        """
        detached = [u.detach() for u in candidate]
        a, b = self.dots(detached)
        root_b = b.sqrt()
        value = 1 - a / (root_b * self.observed_norm)
        scale = -1 / (root_b * self.observed_norm)
        ratio = -a / b
        for u, o in zip(detached, self.observed, strict=True):
            torch.addcmul(o, u, ratio, out=u)
        return value, detached, scale


class EuclideanObjective:
    """DLG's squared distance ``J(u) = Σ_l ‖u_l − u*_l‖²`` (eq. (3) of Geiping et al.), with
    its gradient ``∂J/∂u = 2 (u − u*)`` in the form the optimisation loop takes (scale 1).

    With ``rows`` the candidates carry a leading restart dimension and J is one value per
    row ([R]); ``u*`` is shared by the rows, or given per row when it has that dimension too.
    """

    def __init__(self, observed: Sequence[torch.Tensor], rows: bool = False) -> None:
        self.observed = [t.detach() for t in observed]
        self.rows = rows

    def _reduce(self, differences: Sequence[torch.Tensor]) -> torch.Tensor:
        if self.rows:
            return torch.stack([d.square().reshape(d.shape[0], -1).sum(1)
                                for d in differences]).sum(0)
        return torch.stack([d.square().sum() for d in differences]).sum()

    def value(self, candidate: Sequence[torch.Tensor]) -> torch.Tensor:
        """J at ``candidate``."""
        return self._reduce([u.detach() - o for u, o in
                             zip(candidate, self.observed, strict=True)])

    def value_and_output_grads(
        self, candidate: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """J, the cotangents 2 (u − u*) (written into the candidate's memory) and scale 1."""
        detached = [u.detach() for u in candidate]
        for u, o in zip(detached, self.observed, strict=True):
            u.sub_(o)
        value = self._reduce(detached)
        for d in detached:
            d.mul_(2)
        return value, detached, torch.ones_like(value)


@dataclass
class NoOptions:
    """A part without options."""


@register_objective("cosine")
class Cosine(ObjectivePart):
    """``1 − cos(u, u*)`` over the whole update (D = 1): Inverting Gradients' eq. (4)."""

    Config = NoOptions

    def diagonal(self, observed: Sequence[torch.Tensor], observation: Observation,
                 per_row: bool) -> list[torch.Tensor] | None:
        return None


@register_objective("euclidean")
class Euclidean(ObjectivePart):
    """``Σ_l ‖u_l − u*_l‖²``: DLG's distance (Zhu et al. 2019; eq. (3) of Geiping et al.)."""

    Config = NoOptions
    cosine_family = False

    def diagonal(self, observed: Sequence[torch.Tensor], observation: Observation,
                 per_row: bool) -> list[torch.Tensor] | None:
        return None

    def build(self, inner: Callable[..., Any], observed: Sequence[torch.Tensor],
              observation: Observation, *, rows: bool = False, per_row: bool = False) -> Any:
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


SCALING = ("clip", "dpsgd", "noise")


def require_known_scale(observation: Observation, part: str) -> None:
    """Refuse a hinge when a published defense changes the update's scale or adds noise the
    bounds do not model (the hinge's bounds are in the units of the user's own update)."""
    scaling = sorted({d.name for d in observation.defenses} & set(SCALING))
    if scaling:
        raise PartError(f"objective {part!r} with hinge > 0 bounds the update in the user's "
                        f"own units, but the victim publishes {', '.join(scaling)}, which "
                        "rescale or noise it; use hinge=0")


@dataclass
class MaskedConfig:
    outside: float = field(default=0.1, metadata={
        "help": "weight w of the coordinates pruning zeroed (0: ignore them, breaching's "
                "masked cosine; 1: the plain cosine; 0.1 chosen on held-out photos)"})
    hinge: float = field(default=0.0, metadata={
        "help": "weight β of the pruning-threshold hinge: a zeroed coordinate whose rescaled "
                "candidate exceeds the smallest kept |u*| is penalised (0: off)"})

    def __post_init__(self) -> None:
        if not 0 <= self.outside <= 1:
            raise ValueError(f"outside must lie in [0, 1], got {self.outside}")
        if not (self.hinge >= 0 and math.isfinite(self.hinge)):
            raise ValueError(f"hinge must be >= 0, got {self.hinge}")


@register_objective("masked-cosine")
class MaskedCosine(ObjectivePart):
    """``1 − cos(D ⊙ u, D ⊙ u*)`` with D = M + w(1 − M), M = 1[u* ≠ 0]: the cosine over the
    coordinates pruning kept (w = ``outside`` = 0), or with the zeroed ones down-weighted."""

    Config = MaskedConfig
    config: MaskedConfig

    def check(self, observation: Observation) -> None:
        require_prune(observation, self.name)
        if self.config.hinge:
            require_known_scale(observation, f"{self.name} (hinge)")

    def diagonal(self, observed: Sequence[torch.Tensor], observation: Observation,
                 per_row: bool) -> list[torch.Tensor] | None:
        w = self.config.outside
        return [m * (1 - w) + w for m in kept_mask(observed)] if w else kept_mask(observed)

    def build(self, inner: Callable[..., Any], observed: Sequence[torch.Tensor],
              observation: Observation, *, rows: bool = False, per_row: bool = False) -> Any:
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
        if self.masked not in ("auto", "on", "off"):
            raise ValueError(f"masked must be auto, on or off, got {self.masked!r}")
        if not (self.hinge >= 0 and math.isfinite(self.hinge)):
            raise ValueError(f"hinge must be >= 0, got {self.hinge}")
        if not (self.noise_prior >= 0 and math.isfinite(self.noise_prior)):
            raise ValueError(f"noise-prior must be >= 0, got {self.noise_prior}")


def noise_variances(observed: Sequence[torch.Tensor], observation: Observation,
                    per_row: bool) -> list[torch.Tensor]:
    """σ_l² per layer (a [rows, 1, …] tensor when ``per_row``, else 0-dim) of the noise the
    published defenses add to each coordinate of the update (module docstring)."""
    isotropic = additive_variance(observation)
    quantize = find(observation.defenses, "quantize")
    levels = 2 ** (int(quantize.number("bits", 4)) - 1) - 1 if quantize is not None else 0
    out = []
    for o in observed:
        if per_row:
            scale = o.detach().reshape(o.shape[0], -1).abs().amax(1).double()
            scale = scale.view(-1, *[1] * (o.dim() - 1))
        else:
            scale = o.detach().abs().max().double()
        rounding = (scale / levels) ** 2 / 6 if levels else torch.zeros_like(scale)
        out.append(rounding + isotropic)
    return out


def additive_variance(observation: Observation) -> float:
    """σ² per coordinate of the isotropic noise the published ``noise`` and ``dpsgd`` add."""
    defenses = observation.defenses
    isotropic = 0.0
    noise = find(defenses, "noise")
    if noise is not None:
        sigma = noise.number("sigma", 0.0)
        laplace = noise.params.get("distribution", "gaussian") == "laplace"
        isotropic += (2 if laplace else 1) * sigma**2
    dp = find(defenses, "dpsgd")
    if dp is not None:
        per_step = dp.number("noise-multiplier", 0.0) * dp.number("max-grad-norm", 1.0) / \
            max(observation.num_images if observation.update_kind != "delta" else
                _batch_size(observation), 1)
        if observation.update_kind == "delta":
            per_step *= float(observation.learning_rate or 1.0)
            isotropic += max(observation.local_steps, 1) * per_step**2
        else:
            isotropic += per_step**2
    return isotropic


def noise_ratio(observed: Sequence[torch.Tensor], observation: Observation,
                per_row: bool) -> torch.Tensor:
    """r = d σ² / ‖u*‖²: the published additive noise's expected energy over the observed
    update's (0-dim, or [rows] when ``per_row``); near 1 when the noise drowns the update."""
    variance = additive_variance(observation)
    count = sum(o[0].numel() if per_row else o.numel() for o in observed)
    if per_row:
        energy = torch.stack([o.detach().double().reshape(o.shape[0], -1).square().sum(1)
                              for o in observed]).sum(0)
    else:
        energy = torch.stack([o.detach().double().square().sum() for o in observed]).sum()
    return (count * variance / energy.clamp(min=1e-300)).to(observed[0].dtype)


class ScaledObjective:
    """A gradient-matching objective times a positive weight c (one, or one per row): c J,
    whose gradient is c s g, so the loop's priors (α TV, bn R_BN) weigh 1/c times more."""

    def __init__(self, base: Any, weight: torch.Tensor) -> None:
        self.base = base
        self.weight = weight

    def value(self, candidate: Sequence[torch.Tensor]) -> torch.Tensor:
        """c J at ``candidate``."""
        value: torch.Tensor = self.base.value(candidate) * self.weight
        return value

    def value_and_output_grads(
        self, candidate: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """c J, the base's cotangents g and the scale c s (∂(cJ)/∂u = c s g)."""
        value, grads, scale = self.base.value_and_output_grads(candidate)
        return value * self.weight, grads, scale * self.weight


def _batch_size(observation: Observation) -> int:
    """The user's local batch size for FedAvg: n / (steps per epoch), at least 1."""
    return max(1, math.ceil(observation.num_images / max(observation.local_steps, 1)))


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
        hinged = self.config.hinge and find(observation.defenses, "quantize") is not None
        weighted = self.config.noise_prior and additive_variance(observation) > 0
        return not hinged and not weighted

    def build(self, inner: Callable[..., Any], observed: Sequence[torch.Tensor],
              observation: Observation, *, rows: bool = False, per_row: bool = False) -> Any:
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


class WeightedObjective:
    """Eq. (1): an unweighted cosine objective applied to D ⊙ u and D ⊙ u*, its gradient
    multiplied by D (the chain rule). ``inner`` builds the cosine (one update, or restarts)."""

    def __init__(self, inner: Callable[..., Any], observed: Sequence[torch.Tensor],
                 diag: Sequence[torch.Tensor], **options: Any) -> None:
        self.diag = list(diag)
        self.inner = inner([o * d for o, d in zip(observed, self.diag, strict=True)], **options)

    def _weighted(self, candidate: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [u.detach() * d for u, d in zip(candidate, self.diag, strict=True)]

    def value(self, candidate: Sequence[torch.Tensor]) -> torch.Tensor:
        """J at ``candidate``."""
        value: torch.Tensor = self.inner.value(self._weighted(candidate))
        return value

    def value_and_output_grads(
        self, candidate: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """J, the cotangents D ⊙ g (g the cosine's, at D ⊙ u) and the cosine's scale."""
        value, grads, scale = self.inner.value_and_output_grads(self._weighted(candidate))
        return value, [g.mul_(d) for g, d in zip(grads, self.diag, strict=True)], scale


def prune_thresholds(observed: Sequence[torch.Tensor], scope: str, per_row: bool
                     ) -> list[torch.Tensor]:
    """t per tensor (per row when ``per_row``): the smallest kept magnitude ``min{|u*_i| : u*_i ≠
    0}`` of the layer (``scope`` layer) or of the whole update (``global``); 0 where nothing was
    kept (no bound is known there)."""
    def smallest(o: torch.Tensor) -> torch.Tensor:
        flat = o.detach().reshape(o.shape[0], -1) if per_row else o.detach().reshape(1, -1)
        kept = torch.where(flat != 0, flat.abs(), torch.full_like(flat, math.inf)).amin(1)
        return kept

    per_tensor = [smallest(o) for o in observed]
    if scope == "global":
        overall = torch.stack(per_tensor).amin(0)
        per_tensor = [overall for _ in observed]
    out = []
    for o, t in zip(observed, per_tensor, strict=True):
        t = torch.where(torch.isfinite(t), t, torch.zeros_like(t))
        out.append(t.view(-1, *[1] * (o.dim() - 1)) if per_row else t.reshape(()))
    return out


def quantisation_bounds(observed: Sequence[torch.Tensor], bits: int, per_row: bool
                        ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The support of stochastic rounding: QSGD rounds ``|u|`` to a neighbouring level of step
    Δ_l = m_l/s (m_l = max|u*_l|, which rounding keeps exactly; s = 2^{bits−1} − 1), so
    u_i ∈ [q_i − Δ_l, q_i + Δ_l] for every coordinate (and q_i ≠ 0 fixes the sign)."""
    levels = 2 ** (bits - 1) - 1
    lower, upper = [], []
    for o in observed:
        o = o.detach()
        if per_row:
            scale = o.reshape(o.shape[0], -1).abs().amax(1).view(-1, *[1] * (o.dim() - 1))
        else:
            scale = o.abs().max()
        step = scale / levels
        lower.append(o - step)
        upper.append(o + step)
    return lower, upper


def pruning_bounds(observed: Sequence[torch.Tensor], scope: str, per_row: bool
                   ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Magnitude pruning zeroes exactly the coordinates with ``|u_i| ≤ t`` (t the smallest kept
    ``|u*|``, :func:`prune_thresholds`): [−t, t] there; no bound (±inf) on the kept ones and in a
    tensor where nothing was kept."""
    lower, upper = [], []
    for o, t in zip(observed, prune_thresholds(observed, scope, per_row), strict=True):
        bounded = (o == 0) & (t > 0)
        inf = torch.full_like(o, math.inf)
        upper.append(torch.where(bounded, t.expand_as(o), inf))
        lower.append(-upper[-1])
    return lower, upper


class IntervalHinge:
    """A gradient-matching objective plus β H, a hinge on what a defense says the true update
    satisfies coordinate by coordinate, lower_i ≤ u_i(x*) ≤ upper_i (:func:`pruning_bounds`,
    :func:`quantisation_bounds`):

        H(u) = Σ_i [max(0, u_i − upper_i)² + max(0, lower_i − u_i)²] / ‖u*‖²,

    0 at the truth, nothing asked of a coordinate inside its interval, in the units of the
    cosine's residual (1 − cos ≈ ½‖u − u*‖²/‖u*‖² near the truth), and
    ∂H/∂u_i = 2 (max(0, u_i − upper_i) − max(0, lower_i − u_i))/‖u*‖². The bounds are in the
    units of the user's own update, so a hinge needs a chain that keeps its scale (pruning and
    quantisation do; clipping and DP-SGD do not, see :func:`require_known_scale`). (Fitting
    the scale as the least-squares κ of the candidate onto u*, held fixed in the gradient, was
    tried: the attack diverged, lenet-zhu photo 5 at 6.7 dB.)"""

    def __init__(self, base: Any, observed: Sequence[torch.Tensor],
                 bounds: tuple[list[torch.Tensor], list[torch.Tensor]], weight: float, *,
                 per_row: bool = False) -> None:
        self.base = base
        self.weight = weight
        self.per_row = per_row
        self.observed = [o.detach() for o in observed]
        self.lower, self.upper = bounds
        if per_row:
            squares = torch.stack([o.double().reshape(o.shape[0], -1).square().sum(1)
                                   for o in self.observed]).sum(0)
        else:
            squares = torch.stack([o.double().square().sum() for o in self.observed]).sum()
        self.energy = squares.to(self.observed[0].dtype)

    def hinge(self, candidate: Sequence[torch.Tensor]
              ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """H (0-dim, or [R] for stacked candidates) and ∂H/∂u per tensor."""
        us = [u.detach() for u in candidate]
        rows = self.per_row or us[0].dim() > self.observed[0].dim()
        value: torch.Tensor | None = None
        grads = []
        for u, lo, hi in zip(us, self.lower, self.upper, strict=True):
            e = self.energy.view(-1, *[1] * (u.dim() - 1)) if self.per_row else self.energy
            above = (u - hi).clamp(min=0)
            below = (lo - u).clamp(min=0)
            excess = (above.square() + below.square()) / e
            term = excess.reshape(excess.shape[0], -1).sum(1) if rows else excess.sum()
            value = term if value is None else value + term
            grads.append(2 * (above - below) / e)
        assert value is not None
        return value, grads

    def value(self, candidate: Sequence[torch.Tensor]) -> torch.Tensor:
        """The base objective plus β H at ``candidate``."""
        extra, _ = self.hinge(candidate)
        total: torch.Tensor = self.base.value(candidate) + self.weight * extra
        return total

    def value_and_output_grads(
        self, candidate: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """The base's value, cotangents and scale s with β ∂H/∂u added as (β/s) ∂H/∂u (the loop
        multiplies every cotangent by s)."""
        extra, hinge_grads = self.hinge(candidate)  # before the base consumes ``candidate``
        value, grads, scale = self.base.value_and_output_grads(candidate)
        out = []
        for g, h in zip(grads, hinge_grads, strict=True):
            s = scale.view(-1, *[1] * (g.dim() - 1)) if scale.dim() else scale
            out.append(g + h * (self.weight / s))
        return value + self.weight * extra, out, scale


def build_objective(part: ObjectivePart, inner: Callable[..., Any],
                    observed: Sequence[torch.Tensor], observation: Observation,
                    **options: Any) -> Any:
    """``part``'s objective over ``observed`` (built by ``inner``: a cosine class), weighted
    when the part's D is not 1. ``options`` go to ``inner`` (``per_row``)."""
    return part.build(inner, observed, observation, **options)


def create_objective(name: str, options: Mapping[str, Any] | None = None) -> ObjectivePart:
    """Objective part ``name`` with ``options``; unknown names list the valid ones."""
    return OBJECTIVES.create(name, options)


def objective_names() -> tuple[str, ...]:
    """Every registered objective part."""
    return OBJECTIVES.names()


def published_names(defenses: Sequence[PublishedDefense]) -> str:
    """``prune, quantize`` — the published chain in one phrase (``none`` when empty)."""
    return ", ".join(d.name for d in defenses) or "none"
