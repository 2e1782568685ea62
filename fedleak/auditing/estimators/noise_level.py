"""Whether the declared noise is there: a χ² test of the released updates' spread.

Every coordinate of what the server receives carries the declared noise: isotropic N(0, s²)
on the update (per example: on each step's sum, divided by the batch size and weighted by the
local steps), independent across coordinates and trials. Where nothing else moves the
coordinate from trial to trial — away from the canaries, within one stratum of the victim's
batches (and, for the update stage, of the canary's coin, since a clip rescales everything) —
its spread across trials *is* the noise, and the data can only add to it. So for a group of
coordinates with cells c (coordinate × stratum), n_c trials each,

    Q = Σ_c Σ_t (x_ct − x̄_c)² / s²  ~  χ²_ν,   ν = Σ_c (n_c − 1),

when the noise is as declared (and stochastically larger when data moves the coordinates too).
Noise f·s instead scales Q by f², so the one-sided test rejects "the noise is at least the
declared" when Q < χ²_ν⁻¹(α), with power χ²_ν(χ²_ν⁻¹(α)/f²) against a shortfall f, and
f ≤ √(Q / χ²_ν⁻¹(α)) holds with confidence 1 − α (:func:`noise_test`). One trial already
gives a sample per coordinate, so a few trials catch a few per cent of missing noise, in every
tensor.

Where the declared model is exact, the *shape* is tested too: Gaussian residuals have kurtosis
b₂ = N Σe⁴ / (Σe²)² = 3 (±√(24/ν)); noise of the declared variance but another law — uniform
(bounded: a shift past its edge is certain to show), Laplace — moves b₂ far from 3.

This tests the declared noise, not DP by itself: an implementation that clips harder than it
declares and adds proportionally less noise is as private and is still not what it declares.
The noise-ratio test (:mod:`fedleak.auditing.estimators.noise_ratio`) is the one that speaks of
privacy; the two together cover the noise and the clip.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NoiseLevels:
    """Per group of coordinates: ν and Q (module docstring)."""

    groups: tuple[str, ...]
    dof: np.ndarray
    squares: np.ndarray
    #: the coordinates away from the canaries alone: ν, Q, Σ(x − x̄)⁴/s⁴ and the samples
    coordinate_dof: float = 0.0
    coordinate_squares: float = 0.0
    coordinate_fourth: float = 0.0
    coordinate_count: float = 0.0

    def kurtosis(self) -> tuple[float, float] | None:
        """(b₂, its standard error √(24/ν)) of the coordinates' residuals.

        3 for Gaussian noise (the residuals of a cell of n keep E Σe⁴ / (E Σe²)² · N = 3), None
        without enough samples for the normal law of b₂ (ν < 10,000).
        """
        if self.coordinate_dof < 10_000 or not self.coordinate_squares > 0:
            return None
        b2 = self.coordinate_count * self.coordinate_fourth / self.coordinate_squares ** 2
        return b2, math.sqrt(24 / self.coordinate_dof)

    def pooled(self, names: list[str]) -> tuple[float, float]:
        """(ν, Q) of the groups ``names`` together."""
        mask = np.isin(np.array(self.groups), names)
        return float(self.dof[mask].sum()), float(self.squares[mask].sum())


@dataclass(frozen=True)
class NoiseTest:
    """One group's test: the estimated noise factor f̂ = √(Q/ν), its upper bound, p-value."""

    group: str
    dof: float
    factor: float
    factor_upper: float
    p_value: float
    detectable_noise: float


def detectable_factor(dof: float, alpha: float, power: float) -> float:
    """Return the largest noise factor f < 1 the test catches with probability ``power``."""
    from scipy.stats import chi2

    if dof < 1:
        return 0.0
    return math.sqrt(float(chi2.ppf(alpha, dof)) / float(chi2.ppf(power, dof)))


def noise_test(group: str, dof: float, squares: float, alpha: float,
               power: float) -> NoiseTest | None:
    """Return the χ² test of one group at level ``alpha`` (None without degrees of freedom)."""
    from scipy.stats import chi2

    if dof < 1:
        return None
    factor = math.sqrt(squares / dof)
    upper = math.sqrt(squares / float(chi2.ppf(alpha, dof)))
    p_value = float(chi2.cdf(squares, dof))
    return NoiseTest(group, dof, factor, upper, p_value, detectable_factor(dof, alpha, power))


def dof_for_power(noise: float, alpha: float, power: float, most: float) -> float:
    """Return the degrees of freedom at which noise ``noise``·s is caught with ``power``."""
    if detectable_factor(most, alpha, power) < noise:
        return most
    low, high = 1.0, most
    while high - low > max(1.0, low / 100):
        middle = (low + high) / 2
        if detectable_factor(middle, alpha, power) >= noise:
            high = middle
        else:
            low = middle
    return high
