"""What a defense claims to do, as data: the typed mechanism contract.

Every defense declares its mechanism (:meth:`fedleak.defenses.stages.Defense.mechanism`), and
everything that reasons about privacy — the victim's audit claim, the accountant, the Fisher
ceiling, a DP release, the refusals — reads the declaration, never the defense's class. So a
user's own plug-in, in process or behind the proto, is judged exactly like a built-in: it gets
the claim its declaration earns, and an audit tests whether the implementation lives up to it.

A declaration says (docs/defenses.md, "Mechanisms, not classes"):

- **stage**: ``per-example`` (inside local training, on each example's gradient of every
  step), ``update`` (on the finished update), ``transport`` (between users);
- **clip** (:class:`Clip`): the bound S on one contribution (an example's gradient, a user's
  update) and its geometry — ``total`` (‖x‖₂ ≤ S over every tensor together), ``per-tensor``
  (‖x_l‖₂ ≤ S_l for each parameter tensor l; S_l = S/√L unless given, so Σ S_l² = S²),
  ``per-layer`` (the tensors of one module together, S/√M each) or ``per-coordinate``
  (every coordinate within ±S, secure aggregation's box);
- **noise** (:class:`Noise`): its distribution and the std per coordinate it adds to what the
  stage releases (per example: to each step's sum of clipped gradients, before the division by
  the expected batch size; update: to the update);
- **sampling** (:class:`Sampling`): ``fixed`` batches in order, ``shuffled`` batches (every
  example once per epoch; accounted without amplification), or ``poisson`` at rate q;
- **steps**: per-example mechanisms act on every local step; update mechanisms once per round;
- **shares** (:class:`Shares`): distributed noise split among n users (each adds a 1/n share
  of the variance, so the secure-aggregation sum carries all of it), and what a dropped share
  does (``uncompensated``: the sum loses it);
- the **accountant** and δ of the reported (ε, δ), and the unit of privacy.

The maths of one declared contribution is :meth:`Clip.apply` (the declared clipping as a
reference map); :mod:`fedleak.defenses.composition` composes a chain's declarations.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

PER_EXAMPLE, UPDATE, TRANSPORT, PARAMETERS = "per-example", "update", "transport", "parameters"
DECLARED_STAGES = (PARAMETERS, PER_EXAMPLE, UPDATE, TRANSPORT)
TOTAL, PER_TENSOR, PER_LAYER, PER_COORDINATE = "total", "per-tensor", "per-layer", \
    "per-coordinate"
GEOMETRIES = (TOTAL, PER_TENSOR, PER_LAYER, PER_COORDINATE)
GAUSSIAN, LAPLACE = "gaussian", "laplace"
DISTRIBUTIONS = (GAUSSIAN, LAPLACE)
FIXED, SHUFFLED, POISSON = "fixed", "shuffled", "poisson"
SAMPLINGS = (FIXED, SHUFFLED, POISSON)
UNCOMPENSATED, COMPENSATED = "uncompensated", "compensated"
DROPOUTS = (UNCOMPENSATED, COMPENSATED)
ACCOUNTANTS = ("rdp", "prv", "gaussian-dp")
EXAMPLE, USER, UPDATE_UNIT = "example", "user", "update"
UNITS = (EXAMPLE, USER, UPDATE_UNIT)
#: prefix of the declaration's entries in ``DefenseSpec.params`` (``Describe``)
DECLARED_PREFIX = "declared."


class DeclarationError(ValueError):
    """A declaration that cannot describe a mechanism; the message says what to change."""


@dataclass(frozen=True)
class Clip:
    """The declared bound on one contribution: ``norm`` S and its geometry (module doc)."""

    norm: float
    geometry: str = TOTAL
    #: per-tensor / per-layer: each group's bound, in order (empty: S/√groups each)
    group_norms: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        """Refuse a bound that is not a positive number and an unknown geometry."""
        if not (self.norm > 0 and math.isfinite(self.norm)):
            raise DeclarationError(f"a declared clip norm must be a positive number, got "
                                   f"{self.norm}")
        if self.geometry not in GEOMETRIES:
            raise DeclarationError(f"clip geometry {self.geometry!r} is unknown; use one of "
                                   f"{', '.join(GEOMETRIES)}")
        if any(not (b > 0 and math.isfinite(b)) for b in self.group_norms):
            raise DeclarationError("every declared group clip norm must be positive")

    def groups(self, names: Sequence[str]) -> list[list[int]]:
        """Return which tensors (by position) are clipped together: all, one each, per module."""
        if self.geometry == TOTAL:
            return [list(range(len(names)))]
        if self.geometry == PER_LAYER:
            modules: dict[str, list[int]] = {}
            for i, name in enumerate(names):
                modules.setdefault(name.rpartition(".")[0], []).append(i)
            return list(modules.values())
        return [[i] for i in range(len(names))]

    def group_bounds(self, count: int) -> list[float]:
        """Return each group's bound: the declared ones, else S/√count (so Σ S_g² = S²)."""
        if self.group_norms:
            if len(self.group_norms) != count:
                raise DeclarationError(f"the declaration gives {len(self.group_norms)} group "
                                       f"clip norms for {count} groups")
            return list(self.group_norms)
        return [self.norm / math.sqrt(count)] * count

    def sensitivity(self, names: Sequence[str]) -> float:
        """Return the largest L2 norm of a clipped contribution (its L2 sensitivity bound).

        S for a total clip, √(Σ_g S_g²) for clips per group (= S with the default S/√G each),
        and ∞ for a per-coordinate box: its L2 norm reaches S·√d, which no declared bound
        caps.
        """
        if self.geometry == TOTAL:
            return self.norm
        if self.geometry == PER_COORDINATE:
            return math.inf
        groups = self.groups(names)
        return math.sqrt(sum(b * b for b in self.group_bounds(len(groups))))

    def apply(self, vectors: Sequence[torch.Tensor], names: Sequence[str] | None = None) \
            -> list[torch.Tensor]:
        r"""Return the declared clipping of one contribution ``[x_l]``, in float64.

        Per group g of tensors, x_g ← x_g · min(1, S_g / ‖x_g‖₂) (the clip of Abadi et al.
        2016, Algorithm 1, ḡ = g / max(1, ‖g‖₂ / C), group by group); per coordinate,
        x ← clamp(x, −S, S). A reference map the victim uses to say what a declared mechanism
        does, never the defense's own code.
        """
        xs = [v.detach().double() for v in vectors]
        if self.geometry == PER_COORDINATE:
            return [x.clamp(-self.norm, self.norm) for x in xs]
        groups = self.groups(list(names) if names is not None else
                             [str(i) for i in range(len(xs))])
        bounds = self.group_bounds(len(groups)) if self.geometry != TOTAL else [self.norm]
        out = list(xs)
        for members, bound in zip(groups, bounds, strict=True):
            norm = math.sqrt(sum(float((xs[i] ** 2).sum()) for i in members))
            scale = min(1.0, bound / norm) if norm > 0 else 1.0
            for i in members:
                out[i] = xs[i] * scale
        return out


@dataclass(frozen=True)
class Noise:
    """The declared noise: its distribution and std per coordinate on what the stage releases."""

    std: float
    distribution: str = GAUSSIAN

    def __post_init__(self) -> None:
        """Refuse a std that is negative or not finite and an unknown distribution."""
        if not (self.std >= 0 and math.isfinite(self.std)):
            raise DeclarationError(f"a declared noise std must be a number >= 0, got {self.std}")
        if self.distribution not in DISTRIBUTIONS:
            raise DeclarationError(f"noise distribution {self.distribution!r} is unknown; use "
                                   f"one of {', '.join(DISTRIBUTIONS)}")

    @property
    def gaussian(self) -> bool:
        """Whether the noise is Gaussian with a positive std (a Gaussian mechanism's)."""
        return self.distribution == GAUSSIAN and self.std > 0


@dataclass(frozen=True)
class Sampling:
    """How the examples of a local step are drawn (per-example mechanisms)."""

    kind: str = FIXED
    #: poisson: q (0: the protocol's batch size over the user's images)
    rate: float = 0.0

    def __post_init__(self) -> None:
        """Refuse an unknown kind of sampling and a rate outside [0, 1]."""
        if self.kind not in SAMPLINGS:
            raise DeclarationError(f"sampling {self.kind!r} is unknown; use one of "
                                   f"{', '.join(SAMPLINGS)}")
        if not 0 <= self.rate <= 1:
            raise DeclarationError(f"a declared sample rate must lie in [0, 1], got {self.rate}")

    def poisson_rate(self, num_images: int, batch_size: int) -> float | None:
        """Return q for Poisson sampling over ``num_images`` (None: not Poisson).

        The declared rate, else B/n with B the protocol's batch size (n when it is 0 or ≥ n).
        """
        if self.kind != POISSON:
            return None
        if self.rate > 0:
            return self.rate
        size = num_images if batch_size in (0, None) or batch_size >= num_images else batch_size
        return size / num_images


@dataclass(frozen=True)
class Shares:
    """Distributed noise: ``users`` shares summing to the declared noise.

    Each of n users adds N(0, s²/n), so the sum carries N(0, s²); ``dropout`` says what a
    dropped share does (``uncompensated``: the survivors' sum carries only n'/n of it).
    """

    users: int
    dropout: str = UNCOMPENSATED

    def __post_init__(self) -> None:
        """Refuse fewer than one user and an unknown dropout."""
        if self.users < 1:
            raise DeclarationError(f"declared shares need >= 1 user, got {self.users}")
        if self.dropout not in DROPOUTS:
            raise DeclarationError(f"dropout {self.dropout!r} is unknown; use one of "
                                   f"{', '.join(DROPOUTS)}")


@dataclass(frozen=True)
class Mechanism:
    """A defense's declared mechanism (module docstring).

    ``noise.std`` of a shared mechanism is the *total* std the sum of all ``shares.users``
    users carries; each user adds std/√users.
    """

    stage: str
    clip: Clip | None = None
    noise: Noise | None = None
    sampling: Sampling = field(default_factory=Sampling)
    shares: Shares | None = None
    accountant: str = ""
    delta: float = 1e-5
    unit: str = ""
    #: update stage: the federation's chance of picking the user in a round (accountant)
    user_sample_rate: float = 1.0

    def __post_init__(self) -> None:
        """Refuse a declaration that describes no mechanism.

        An unknown stage, accountant or unit, a δ or rate out of range, or per-example
        Gaussian noise without the clip it is calibrated to.
        """
        if self.stage not in DECLARED_STAGES:
            raise DeclarationError(f"stage {self.stage!r} is unknown; use one of "
                                   f"{', '.join(DECLARED_STAGES)}")
        if self.accountant and self.accountant not in ACCOUNTANTS:
            raise DeclarationError(f"accountant {self.accountant!r} is unknown; use one of "
                                   f"{', '.join(ACCOUNTANTS)}")
        if not 0 < self.delta < 1:
            raise DeclarationError(f"a declared δ must lie in (0, 1), got {self.delta}")
        if self.unit and self.unit not in UNITS:
            raise DeclarationError(f"unit {self.unit!r} is unknown; use one of "
                                   f"{', '.join(UNITS)}")
        if not 0 < self.user_sample_rate <= 1:
            raise DeclarationError("a declared user sample rate must lie in (0, 1]")
        if self.stage == PER_EXAMPLE and self.noise is not None and self.noise.gaussian \
                and self.clip is None:
            raise DeclarationError("a per-example Gaussian mechanism must declare its clip "
                                   "(the noise is calibrated to it)")

    @property
    def gaussian(self) -> bool:
        """Whether it claims Gaussian noise (the DP claims fedleak accounts and audits)."""
        return self.noise is not None and self.noise.gaussian

    @property
    def noise_multiplier(self) -> float:
        """σ = noise std / clip sensitivity (0 without noise; ∞ without a clip)."""
        if not self.gaussian or self.noise is None:
            return 0.0
        if self.clip is None:
            return math.inf
        return self.noise.std / self.clip.norm

    @property
    def share_std(self) -> float:
        """The std one user adds: the declared std, or its 1/√n share."""
        if self.noise is None:
            return 0.0
        return self.noise.std / math.sqrt(self.shares.users) if self.shares else self.noise.std

    def words(self) -> str:
        """Return the declaration in one line a person reads."""
        parts = [self.stage]
        if self.clip is not None:
            parts.append(f"clip {self.clip.geometry} L2 ≤ {self.clip.norm:g}"
                         if self.clip.geometry != PER_COORDINATE
                         else f"clip each coordinate to ±{self.clip.norm:g}")
        if self.noise is not None and self.noise.std > 0:
            parts.append(f"{self.noise.distribution} noise std {self.noise.std:g}")
        if self.stage == PER_EXAMPLE:
            rate = f" q = {self.sampling.rate:g}" if self.sampling.rate else ""
            parts.append(f"{self.sampling.kind} sampling{rate}")
        if self.shares is not None:
            parts.append(f"shared by {self.shares.users} users ({self.shares.dropout} dropout)")
        return ", ".join(parts)

    def to_params(self) -> dict[str, str]:
        """Return the declaration as ``declared.*`` string entries (``DefenseSpec.params``)."""
        out = {"stage": self.stage, "delta": f"{self.delta:g}"}
        if self.stage == PER_EXAMPLE:
            out["sampling"] = self.sampling.kind
        if self.sampling.rate:
            out["sample-rate"] = f"{self.sampling.rate:g}"
        if self.clip is not None:
            out["clip-norm"] = f"{self.clip.norm:g}"
            out["clip-geometry"] = self.clip.geometry
            if self.clip.group_norms:
                out["group-clip-norms"] = " ".join(f"{b:g}" for b in self.clip.group_norms)
        if self.noise is not None:
            out["noise-std"] = f"{self.noise.std:g}"
            out["noise"] = self.noise.distribution
        if self.shares is not None:
            out["shares"] = str(self.shares.users)
            out["dropout"] = self.shares.dropout
        if self.accountant:
            out["accountant"] = self.accountant
        if self.unit:
            out["unit"] = self.unit
        if self.user_sample_rate != 1.0:
            out["user-sample-rate"] = f"{self.user_sample_rate:g}"
        return {DECLARED_PREFIX + k: v for k, v in out.items()}


def mechanism_from_params(params: Mapping[str, str]) -> Mechanism | None:
    """Read the declaration published as ``declared.*`` entries (None when there are none)."""
    got = {k[len(DECLARED_PREFIX):]: v for k, v in params.items()
           if k.startswith(DECLARED_PREFIX)}
    if not got:
        return None
    try:
        clip = None
        if "clip-norm" in got:
            groups = tuple(float(b) for b in got.get("group-clip-norms", "").split())
            clip = Clip(float(got["clip-norm"]), got.get("clip-geometry", TOTAL), groups)
        noise = Noise(float(got["noise-std"]), got.get("noise", GAUSSIAN)) \
            if "noise-std" in got else None
        shares = Shares(int(got["shares"]), got.get("dropout", UNCOMPENSATED)) \
            if "shares" in got else None
        return Mechanism(stage=got.get("stage", UPDATE), clip=clip, noise=noise,
                         sampling=Sampling(got.get("sampling", FIXED),
                                           float(got.get("sample-rate", 0))),
                         shares=shares, accountant=got.get("accountant", ""),
                         delta=float(got.get("delta", 1e-5)), unit=got.get("unit", ""),
                         user_sample_rate=float(got.get("user-sample-rate", 1.0)))
    except (TypeError, ValueError) as err:
        raise DeclarationError(f"published declaration {got} cannot be read: {err}") from None
