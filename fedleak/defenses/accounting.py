"""Privacy accounting from declarations: ε spent, read off what a mechanism *declares*.

Every Gaussian mechanism fedleak accounts is, per step or round, the (sub)sampled Gaussian
mechanism with noise multiplier z = noise std / sensitivity, composed over the steps or rounds
that touched the unit of privacy (Opacus's RDP or PRV accountant; Mironov 2017, Gopi et al.
2021):

- **per example** (stage ``per-example``): z = std / S (S the declared clip's total bound), one
  entry per local step at the declared sampling: Poisson q for every step, or — fixed or
  shuffled batches, where an example sits in exactly one step per epoch — one step per epoch
  at q = 1 (no amplification is claimed for batches that are not Poisson-sampled);
- **per user** (stage ``update``, a clip then Gaussian noise): with shares (distributed noise,
  the server sees only the sum) adding or removing the user moves the sum by at most S, so z =
  std / S, each round at the declared user sample rate q; without shares the server sees this
  user's own update and two updates of the user differ by up to 2S: z = std / (2S), q = 1.

The accountant reads only the :class:`~fedleak.defenses.mechanism.Mechanism`; a defense's
class never enters. A round's steps at one (z, q) are merged into one history entry
(composition of one mechanism is commutative), so the history stays small.

**What the accountant can compute.** Opacus's RDP accountant squares z: below
:data:`SMALLEST_NOISE_MULTIPLIER` (measured: z = 1e-180 underflows z² to 0 and divides by it,
z = 1e-160 never returns) no ε can be computed, so a declaration of 0 < z below it is refused
when the chain is built (:func:`accounted`), naming the smallest usable noise std (z = 0 is
accounted: ε = ∞). Above :data:`LARGEST_ACCOUNTED_NOISE_MULTIPLIER` (RDP overflows from
z ≈ 1e160 and takes seconds per call at q = 0.5 from z ≈ 1e3) the accountant is charged at that
z instead: ε(z) is non-increasing in z (more noise, smaller Rényi divergence at every order,
Mironov 2017, Proposition 7), so ε(min(z, z_max)) ≥ ε(z) is still an upper bound, and the
metadata says so. Any other numeric failure of an accountant is an :class:`AccountingError`
naming the mechanism, never a bare ``ZeroDivisionError``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy

from fedleak.defenses.mechanism import PER_EXAMPLE, DeclarationError, Mechanism

#: Opacus accountants fedleak reports with
OPACUS_ACCOUNTANTS = ("rdp", "prv")
#: The smallest noise multiplier z > 0 whose ε the accountants compute (module docstring).
SMALLEST_NOISE_MULTIPLIER = 1e-100
#: Above this noise multiplier the accountant is charged at it (ε stays an upper bound).
LARGEST_ACCOUNTED_NOISE_MULTIPLIER = 1e3


class AccountingError(ArithmeticError):
    """An accountant that could not compute ε; the message names the mechanism and the fix."""


def make_accountant(kind: str) -> Any:
    """Return a fresh Opacus accountant (imported lazily: Opacus takes a second to import)."""
    from opacus.accountants import PRVAccountant, RDPAccountant

    if kind not in OPACUS_ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {list(OPACUS_ACCOUNTANTS)}, got {kind!r}")
    return {"rdp": RDPAccountant, "prv": PRVAccountant}[kind]()


def record(accountant: Any, sigma: float, sample_rate: float, steps: int) -> None:
    """Add ``steps`` steps at (σ, q) to the accountant's history.

    They are merged into the entry with the same (σ, q) where there is one: composition of one
    mechanism is commutative and the RDP and PRV accountants compose an entry's steps exactly
    so (RDP: ε_α adds over steps, Mironov 2017, Proposition 1), so ε is unchanged while the
    history stays one entry per distinct mechanism instead of growing with every round.
    """
    history = accountant.history
    for i, (s, q, n) in enumerate(history):
        if (s, q) == (sigma, sample_rate):
            history[i] = (s, q, n + steps)
            return
    history.append((sigma, sample_rate, steps))


def epsilon(accountant: Any, delta: float) -> float:
    """Return the ε the accountant's history spends at ``delta``; ∞ when there was no noise.

    Raises :class:`AccountingError` (naming the history) when the accountant fails numerically
    (an underflow, an overflow, a PRV domain it cannot hold) instead of its bare exception.
    """
    if any(sigma == 0 for sigma, _, _ in accountant.history):
        return math.inf
    try:
        with numpy.errstate(divide="ignore", invalid="ignore"):  # PRV at q = 1 takes log(0)
            value = float(accountant.get_epsilon(delta=delta))
    except (ArithmeticError, ValueError, MemoryError, RecursionError) as err:
        steps = ", ".join(f"z = {s:g}, q = {q:g}, {n} steps" for s, q, n in accountant.history)
        raise AccountingError(
            f"the {type(accountant).__name__} could not compute ε at δ = {delta:g} for "
            f"{steps} ({type(err).__name__}: {err}); declare a noise multiplier within "
            f"[{SMALLEST_NOISE_MULTIPLIER:g}, {LARGEST_ACCOUNTED_NOISE_MULTIPLIER:g}] or use "
            "the rdp accountant") from None
    if math.isnan(value):
        raise AccountingError(f"the {type(accountant).__name__} returned ε = nan at "
                              f"δ = {delta:g}; use the rdp accountant")
    return value


@dataclass(frozen=True)
class Accounted:
    """What one step (per example) or round (per user) is, for the accountant."""

    noise_multiplier: float
    unit: str

    @property
    def charged(self) -> float:
        """Return the z the accountant is charged at.

        z capped at :data:`LARGEST_ACCOUNTED_NOISE_MULTIPLIER` (ε(z) is non-increasing in z).
        """
        return min(self.noise_multiplier, LARGEST_ACCOUNTED_NOISE_MULTIPLIER)


def accounted(mechanism: Mechanism | None) -> Accounted | None:
    """Return z and the unit of privacy of a declared mechanism (module docstring).

    None when it declares no clipped Gaussian noise (no noise, no clip, a Laplace noise or a
    box clip). Raises :class:`~fedleak.defenses.mechanism.DeclarationError` when
    0 < z < :data:`SMALLEST_NOISE_MULTIPLIER` (no accountant computes its ε), naming the
    smallest noise std that works.
    """
    got = _accounted(mechanism)
    if got is None or not 0 < got.noise_multiplier < SMALLEST_NOISE_MULTIPLIER:
        return got
    assert mechanism is not None and mechanism.noise is not None and mechanism.clip is not None
    per_std = got.noise_multiplier / mechanism.noise.std
    least = SMALLEST_NOISE_MULTIPLIER / per_std
    raise DeclarationError(
        f"noise std {mechanism.noise.std:g} on a clip of {mechanism.clip.norm:g} is a noise "
        f"multiplier z = {got.noise_multiplier:g}, below the smallest whose ε the accountant "
        f"can compute ({SMALLEST_NOISE_MULTIPLIER:g}: z² underflows); use a noise std of at "
        f"least {least:.3g} (z >= {SMALLEST_NOISE_MULTIPLIER:g}), or 0 for no noise (ε = ∞)")


def _accounted(mechanism: Mechanism | None) -> Accounted | None:
    if mechanism is None or mechanism.clip is None or mechanism.noise is None \
            or mechanism.noise.distribution != "gaussian":
        return None  # a declared std of 0 is accounted: z = 0, ε = ∞
    sensitivity = mechanism.clip.norm
    if not math.isfinite(sensitivity) or mechanism.clip.geometry == "per-coordinate":
        return None
    if mechanism.stage == PER_EXAMPLE:
        return Accounted(mechanism.noise.std / sensitivity, "example")
    if mechanism.shares is not None:
        return Accounted(mechanism.noise.std / sensitivity, "user")
    return Accounted(mechanism.noise.std / (2 * sensitivity), "user")


class DeclaredAccountant:
    """ε spent by one declared mechanism over every step or round charged to it."""

    def __init__(self, mechanism: Mechanism) -> None:
        got = accounted(mechanism)
        if got is None:
            raise ValueError(f"the declared mechanism ({mechanism.words()}) claims no Gaussian "
                             "DP to account")
        self.mechanism = mechanism
        self.noise_multiplier = got.charged
        self.declared_noise_multiplier = got.noise_multiplier
        self.kind = mechanism.accountant if mechanism.accountant in OPACUS_ACCOUNTANTS else "rdp"
        self._total = make_accountant(self.kind)
        self.rounds = 0

    def charge(self, steps: int, sample_rate: float, report: bool = True) -> dict[str, str]:
        """Charge ``steps`` more steps (or rounds) at q.

        With ``report``, return the ε of these steps alone and of everything charged so far
        (metadata entries); else {} (no ε computed).
        """
        record(self._total, self.noise_multiplier, sample_rate, steps)
        self.rounds += 1 if report else 0
        if not report:
            return {}
        this_round = make_accountant(self.kind)
        record(this_round, self.noise_multiplier, sample_rate, steps)
        delta = self.mechanism.delta
        out = {"epsilon_round": f"{epsilon(this_round, delta):.6g}",
               "epsilon_total": f"{epsilon(self._total, delta):.6g}",
               "delta": f"{delta:g}", "accountant": self.kind,
               "noise_multiplier": f"{self.noise_multiplier:.6g}"}
        if self.declared_noise_multiplier > self.noise_multiplier:
            out["noise_multiplier_declared"] = f"{self.declared_noise_multiplier:.6g}"
            out["epsilon_note"] = (f"accounted at z = {self.noise_multiplier:g}, below the "
                                   f"declared {self.declared_noise_multiplier:g}: ε is an "
                                   "upper bound")
        if self.mechanism.stage == PER_EXAMPLE:
            out.update(dp_steps=str(steps), sample_rate=f"{sample_rate:.6g}")
        else:
            total_rounds = sum(n for _, _, n in self._total.history)
            out.update(dp_rounds=str(total_rounds), user_sample_rate=f"{sample_rate:.6g}",
                       privacy_unit="user")
        return out

    def round_rate(self) -> float:
        """Return q of one round of a per-user mechanism.

        The declared user sample rate with shares (the server sees only the sum), 1 otherwise
        (it sees this user's own update).
        """
        return self.mechanism.user_sample_rate if self.mechanism.shares is not None else 1.0


def per_example_schedule(mechanism: Mechanism, num_images: int, batch_size: int,
                         epochs: int, steps_run: int) -> tuple[int, float]:
    """Return (steps, q) to charge for one round of local training.

    Under a declared per-example mechanism: Poisson — every step run at the declared q; fixed
    or shuffled batches — one step per epoch at q = 1 (each example sits in one batch of an
    epoch).
    """
    q = mechanism.sampling.poisson_rate(num_images, batch_size)
    if q is None:
        return epochs, 1.0
    return steps_run, q
