"""Test whether the noise is fresh in every release (``fresh-noise``).

Lag correlations of the released noise across
consecutive releases (``fresh-noise``).

An accountant composes T rounds as T independent releases: the noise of each drawn afresh.
Noise reused across releases — a PRNG key not split, a cached noise buffer redrawn every
second call, a generator re-seeded by a counter that wraps — leaves every single release
exactly the declared Gaussian, so no test of one release sees it; but two releases that
share their noise subtract to the data's difference with no noise at all (ε = ∞ over two
rounds). What it leaves is a correlation between releases k apart.

For one coordinate j with residuals e_j = P x_j (:mod:`~fedleak.auditing.estimators.releases`)
the lag-k autocorrelation is ρ̂_jk = Σ_t e_tj e_{t+k,j} / Σ_t e_tj² = e_jᵀ S_k e_j / e_jᵀ e_j
(S_k the lag-k shift). Under fresh Gaussian noise its mean is exactly tr(P S_k) / r =
−Σ_{t: c(t) = c(t+k)} (1/n_c(t)) / r (Pitman–Koopman), whatever s. Over the m sampled
coordinates the test sums, per release pair,

    w_t = (1/m) Σ_j e_tj e_{t+k,j} / ‖e_j‖² − μ_k / (T − k),      Z_k = Σ_t w_t / √(Σ_t w_t²),

a self-normalised sum of terms uncorrelated across t when releases are independent (so
Z_k ≈ N(0, 1) under the declaration, *whatever* the dependence across coordinates: the
denominator measures it), two-sided, over the lags k = 1..K (Bonferroni over K). Noise
redrawn every second call gives ρ ≈ 1/2 at lag 1 and Z ≈ √(T/2); a cycle of period p ≤ K
gives ρ ≈ 1 at lag p. Pairs of releases of one cell whose values are identical are counted:
each is two rounds with the canary exactly exposed (ε = ∞).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedleak.auditing.estimator_registry import (
    Estimator,
    Findings,
    Game,
    NoOptions,
    register_estimator,
)
from fedleak.auditing.estimators.releases import Releases
from fedleak.auditing.result import FRESH_NOISE, DeclarationTest

#: the most lags tested (a reuse period beyond it is not seen: docs/audit.md)
MAX_LAG = 16
#: fewer releases than this: no test (Z's normal law needs many release pairs)
MIN_RELEASES = 24
#: two releases whose difference has at most this share of a typical residual's energy
#: carry the same noise (a reused noise vector on the same data gives a difference of exactly
#: 0); judged only over at least IDENTICAL_COLUMNS coordinates, where fresh noise cannot come
#: that close by chance (χ²_8 ≤ 8·10⁻¹² has probability ~10⁻⁴⁸)
IDENTICAL = 1e-12
IDENTICAL_COLUMNS = 8
#: the pooled test's group name
ALL_TENSORS = "all tensors pooled"


@dataclass(frozen=True)
class LagTest:
    """The lag test of one group: the most deviant lag, its Z, correlation and p-value."""

    group: str
    lag: int
    z: float
    correlation: float
    p_value: float
    lags: int
    identical: int       # release pairs at that lag with identical values
    pairs: int           # release pairs of one cell at that lag
    detectable: float    # the lag correlation caught with the stated power (≈)


def lags_for(trials: int) -> int:
    """K: lags 1..K are tested (at most MAX_LAG, at least 8 release pairs per lag)."""
    return max(1, min(MAX_LAG, trials // 8))


def expected_correlation(cells: np.ndarray, sizes: np.ndarray, lag: int, rank: int) -> float:
    """μ_k = tr(P S_k) / r: the mean lag-k autocorrelation of within-cell residuals."""
    same = cells[:-lag] == cells[lag:]
    return -float((1.0 / sizes[:-lag][same]).sum()) / rank


def lag_test(releases: Releases, group: int | None, name: str, alpha: float,
             power: float) -> LagTest | None:
    """Return the lag test of one group's columns (None: too few releases or coordinates)."""
    from scipy.stats import norm

    t, rank = releases.trials, releases.rank
    columns = releases.columns(group)
    if t < MIN_RELEASES or rank < MIN_RELEASES // 2 or columns.size == 0:
        return None
    raw = releases.values[:, columns].astype(np.float64)
    e = releases.residuals()[:, columns]
    energy = (e ** 2).sum(axis=0)
    typical = float(energy.sum()) / rank  # a residual row's energy
    k_max = lags_for(t)
    z_crit = float(norm.isf(alpha / (2 * k_max)))
    detectable = (z_crit + float(norm.isf(1 - power))) / math.sqrt(t * columns.size)
    if not typical > 0 and columns.size >= IDENTICAL_COLUMNS:  # the noise never changed
        pairs = int((releases.cells[:-1] == releases.cells[1:]).sum())
        return LagTest(name, 1, math.inf, 1.0, 0.0, k_max, pairs, pairs, detectable)
    keep = energy > 0
    if not keep.any():
        return None
    u = e[:, keep] / np.sqrt(energy[keep])
    sizes = releases.cell_sizes()
    best: LagTest | None = None
    for k in range(1, k_max + 1):
        mu = expected_correlation(releases.cells, sizes, k, rank)
        w = (u[:-k] * u[k:]).mean(axis=1) - mu / (t - k)
        spread = math.sqrt(float((w ** 2).sum()))
        z = float(w.sum()) / spread if spread > 0 else 0.0
        same = releases.cells[:-k] == releases.cells[k:]
        gaps = ((raw[k:] - raw[:-k]) ** 2).sum(axis=1)
        identical = int((same & (gaps <= IDENTICAL * typical)).sum()) \
            if columns.size >= IDENTICAL_COLUMNS else 0
        p = min(1.0, k_max * float(2 * norm.sf(abs(z))))
        if identical:
            p = 0.0
        found = LagTest(name, k, z, float((u[:-k] * u[k:]).sum(axis=0).mean()), p, k_max,
                        identical, int(same.sum()), detectable)
        if best is None or (found.p_value, -abs(found.z)) < (best.p_value, -abs(best.z)):
            best = found
    return best


def lag_statement(test: LagTest) -> str:
    """Return what one lag test found, in words."""
    if test.identical:
        return (f"{test.group}: the noise is not fresh across releases: in {test.identical} "
                f"of {test.pairs} pairs of releases {test.lag} apart it was identical (lag "
                f"correlation {test.correlation:.2f}) — two such releases subtract to the "
                f"canary exactly, ε = ∞ over two rounds, while the accountant composes the "
                f"rounds as if the noise were fresh (noise reused, a fixed seed or a cache)")
    return (f"{test.group}: the noise is not fresh across releases: releases {test.lag} apart "
            f"are correlated (lag correlation {test.correlation:.3g}, Z = {test.z:.3g} over "
            f"lags 1–{test.lags}) — noise reused or carried from release to release, which "
            f"the accountant's composition of rounds assumes away")


@register_estimator(FRESH_NOISE)
class FreshNoise(Estimator):
    """Lag tests of the noise across consecutive releases, per tensor and pooled."""

    Config = NoOptions

    @staticmethod
    def groups(game: Game) -> list[tuple[int | None, str]]:
        """Return (column group, name) of every test: all tensors pooled, then each."""
        table = game.streams
        releases = table.releases if table is not None else None
        if releases is None or releases.trials < MIN_RELEASES or not game.claims:
            return []
        present = sorted(set(releases.column_groups.tolist()))
        out: list[tuple[int | None, str]] = [(None, ALL_TENSORS)]
        if len(present) > 1:
            out += [(g, releases.group_names[g]) for g in present]
        return out

    def tests(self, game: Game) -> int:
        """Return the number of lag tests :meth:`run` returns."""
        return len(self.groups(game))

    def run(self, game: Game, level: float) -> Findings:
        """Return the lag tests at ``level``."""
        table = game.streams
        found = Findings()
        if table is None or table.releases is None:
            return found
        for group, name in self.groups(game):
            test = lag_test(table.releases, group, name, level, game.power)
            if test is None:
                continue
            found.tests.append(DeclarationTest(
                FRESH_NOISE, name, test.p_value, False, lag_statement(test),
                samples_out=table.releases.trials, level=level, power=game.power,
                epsilon_lb=math.inf if test.identical else None,
                detectable=test.detectable))
        return found
