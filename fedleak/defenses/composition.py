"""A chain's declarations composed: what the whole chain claims to do to one contribution.

The update stage composes in order up to its first Gaussian noise (everything after it is
post-processing): each declared clip bounds how far two inputs can be apart afterwards —
projection onto a ball is 1-Lipschitz, so inputs at L2 distance r leave a total clip to S at
most min(r, 2S) apart, and a per-tensor clip at most min(r, 2·√Σ S_l²) — and the noise of std
s then makes the update a Gaussian mechanism with μ = distance / s (Dong, Roth & Su 2019). A
defense that declares nothing (prune, quantise, a remote service without a claim) before the
noise leaves the distance unbounded; a Laplace noise or a box clip claims no Gaussian DP.

:class:`UpdateComposition` is that walk; :class:`ChainAccountant` charges a chain's rounds to
the accountants its declarations earn (:mod:`fedleak.defenses.accounting`). Nothing here looks
at a defense's class.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from fedleak.defenses.accounting import DeclaredAccountant, accounted, per_example_schedule
from fedleak.defenses.mechanism import (
    PER_COORDINATE,
    TOTAL,
    UPDATE,
    Clip,
    Mechanism,
    Noise,
    Shares,
)


@dataclass(frozen=True)
class UpdateComposition:
    """The update defenses' declarations walked in order up to the first Gaussian noise."""

    #: (defense name, declared clip) before the noise, in order
    clips: tuple[tuple[str, Clip], ...] = ()
    #: the first Gaussian noise's total std on what the server sees of one user (0: none)
    noise_std: float = 0.0
    noise_by: str = ""
    shares: Shares | None = None
    #: why the composition claims nothing ("" when it claims a Gaussian mechanism)
    unbounded: str = ""
    delta: float | None = None
    accountant: str = ""
    user_sample_rate: float = 1.0
    words: tuple[str, ...] = field(default=())

    @property
    def gaussian(self) -> bool:
        """Whether the walk reached Gaussian noise with every clip before it declared."""
        return self.noise_std > 0 and not self.unbounded

    def distance(self, r: float, names: Sequence[str], from_zero: bool = False) -> float:
        """Return how far apart two inputs at most ``r`` apart are when the noise is added.

        Each L2 clip of bound S maps r to min(r, 2S) (projection onto a ball is 1-Lipschitz
        and its image has diameter 2S). With ``from_zero`` one of them is the zero update (a
        canary client absent), which every clip leaves at zero, so the other ends within S,
        not 2S.
        """
        for _, clip in self.clips:
            if clip.geometry == PER_COORDINATE:
                continue  # a box bounds no L2 distance by itself
            r = min(r, (1 if from_zero else 2) * clip.sensitivity(names))
        return r

    def declared_map(self, update: Sequence[torch.Tensor], names: Sequence[str]) \
            -> list[torch.Tensor]:
        """Return the declared clips applied in order to ``update``, in float64.

        What the chain says it does to one update before the noise, computed from the
        declarations alone.
        """
        out = [u.detach().double() for u in update]
        for _, clip in self.clips:
            out = clip.apply(out, names)
        return out

    def mechanism(self) -> Mechanism | None:
        """Return the composed declaration for the accountant: the tightest total clip, noise."""
        totals = [c for _, c in self.clips if c.geometry == TOTAL]
        if not self.gaussian or not totals:
            return None
        clip = min(totals, key=lambda c: c.norm)
        return Mechanism(UPDATE, clip=clip, noise=Noise(self.noise_std), shares=self.shares,
                         accountant=self.accountant, delta=self.delta or 1e-5, unit="user",
                         user_sample_rate=self.user_sample_rate)


def compose_update(declarations: Sequence[tuple[str, Mechanism | None]]) -> UpdateComposition:
    """Walk the update stage's declarations (module docstring)."""
    clips: list[tuple[str, Clip]] = []
    words: list[str] = []
    for name, mechanism in declarations:
        if mechanism is None:
            return UpdateComposition(tuple(clips), unbounded=f"{name} declares no mechanism",
                                     words=(*words, f"{name} declares nothing"))
        if mechanism.clip is not None:
            clips.append((name, mechanism.clip))
            words.append(f"{name} clips ({mechanism.clip.geometry}) to "
                         f"{mechanism.clip.norm:g}")
        noise = mechanism.noise
        if noise is not None and noise.std > 0:
            if not noise.gaussian:
                return UpdateComposition(tuple(clips), unbounded=f"{name} adds "
                                         f"{noise.distribution} noise, not Gaussian",
                                         words=tuple(words))
            words.append(f"{name} adds N(0, s²), s = {noise.std:.4g}"
                         + (f" in {mechanism.shares.users} shares" if mechanism.shares else ""))
            return UpdateComposition(tuple(clips), noise.std, name, mechanism.shares,
                                     delta=mechanism.delta, accountant=mechanism.accountant,
                                     user_sample_rate=mechanism.user_sample_rate,
                                     words=tuple(words))
    return UpdateComposition(tuple(clips), unbounded="no Gaussian noise", words=tuple(words))


class ChainAccountant:
    """The accountants a chain's declarations earn.

    Its per-example mechanism's, charged per local step, and its update stage's
    composition's, charged per round.
    """

    def __init__(self, per_example: Mechanism | None, update: UpdateComposition) -> None:
        self.per_example = DeclaredAccountant(per_example) \
            if accounted(per_example) is not None and per_example is not None else None
        composed = update.mechanism()
        self.update = DeclaredAccountant(composed) if composed is not None else None

    def local_training(self, num_images: int, batch_size: int, epochs: int, steps_run: int,
                       report: bool = True, trials: int = 1) -> dict[str, str]:
        """Charge ``trials`` rounds of per-example local training (one metadata when ``report``)."""
        if self.per_example is None:
            return {}
        steps, q = per_example_schedule(self.per_example.mechanism, num_images, batch_size,
                                        epochs, steps_run)
        return self.per_example.charge(steps * trials, q, report)

    def rounds(self, count: int = 1, report: bool = True) -> dict[str, str]:
        """Charge ``count`` rounds of the update stage's Gaussian mechanism."""
        if self.update is None:
            return {}
        return self.update.charge(count, self.update.round_rate(), report)


def trial_noise_std(composition: UpdateComposition, users: int) -> float:
    """Return the noise std the server sees on a sum over ``users`` users' updates.

    Independent shares add in variance: k users each adding s/√n (n shares) give s·√(k/n);
    without shares each adds s, so the sum carries s·√k.
    """
    if composition.shares is None:
        return composition.noise_std * math.sqrt(max(users, 1))
    return composition.noise_std * math.sqrt(max(users, 1) / composition.shares.users)
