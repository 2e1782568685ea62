"""Test whether the noise is independent across coordinates (``correlated-noise``).

Correlations of the released noise
between coordinate pairs, within each tensor and across tensors (``correlated-noise``).

The Gaussian mechanism adds N(0, s²I): every coordinate its own draw. Noise with the right
marginal std but shared between coordinates — one scalar draw per tensor, a low-rank noise
buffer, noise of one tensor copied to another — passes every test of one coordinate's law, yet
two coordinates combine to cancel it: ε = ∞ from a single release. The χ² and kurtosis tests
of the noise level (:mod:`~fedleak.auditing.estimators.noise_level`) assume independent
coordinates, so such noise reads there as "another law" or a shortfall; this test names it.

For a pair (a, b) of coordinates with within-cell residuals e_a, e_b
(:mod:`~fedleak.auditing.estimators.releases`, r degrees of freedom), independence and Gaussian
noise make t = ρ̂ √(r − 1) / √(1 − ρ̂²) Student-t with r − 1 degrees of freedom exactly (ρ̂ the
residuals' correlation); over P disjoint pairs the p-values are independent, and Fisher's
X = −2 Σ log p is χ²_{2P} exactly. The pairs are drawn at random (fixed seed) within each
tensor, and across tensors (each pair from two different tensors, first at the same offset
within them). The test runs where the
declared model is exact (one linear step: nothing but the noise moves a coordinate within a
cell) — a multi-step local training couples the coordinates through its own dynamics.
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
from fedleak.auditing.result import CORRELATED_NOISE, DeclarationTest

#: at most this many coordinate pairs per test
MAX_PAIRS = 256
#: the residuals' degrees of freedom a test needs
MIN_RANK = 10
#: the estimated correlation's magnitude above this: the pair's noise is identical up to sign (their
#: sum or difference is clean)
CANCELS = 1 - 1e-9
ACROSS = "across tensors"
SEED = 48


@dataclass(frozen=True)
class CorrelationTest:
    """Fisher's combination over one set of coordinate pairs."""

    group: str
    pairs: int
    mean_abs: float      # mean |ρ̂| over the pairs
    null_abs: float      # its mean under independence, E|ρ̂| ≈ √(2 / (π r))
    cancelling: int      # pairs whose noise is identical up to sign
    p_value: float
    detectable: float    # a common |ρ| caught with the stated power (≈)


def pair_p_values(e: np.ndarray, pairs: np.ndarray, rank: int) -> tuple[np.ndarray,
                                                                        np.ndarray]:
    """(ρ̂, two-sided p) of every pair's residual correlation (module docstring)."""
    from scipy.stats import t as student_t

    a, b = e[:, pairs[:, 0]], e[:, pairs[:, 1]]
    denominator = np.sqrt((a ** 2).sum(axis=0) * (b ** 2).sum(axis=0))
    rho = np.where(denominator > 0, (a * b).sum(axis=0) / np.where(denominator > 0,
                                                                   denominator, 1.0), 0.0)
    rho = np.clip(rho, -1.0, 1.0)
    dof = rank - 1
    with np.errstate(divide="ignore"):
        t = np.abs(rho) * math.sqrt(dof) / np.sqrt(np.maximum(1 - rho ** 2, 0.0))
    return rho, 2 * student_t.sf(t, dof)


def within_pairs(columns: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Disjoint random pairs of ``columns``."""
    order = rng.permutation(columns)
    count = min(order.size // 2, MAX_PAIRS)
    return order[:2 * count].reshape(count, 2)


def across_pairs(groups: np.ndarray, offsets: np.ndarray | None,
                 rng: np.random.Generator) -> np.ndarray:
    """Return disjoint pairs of columns, each from two different tensors.

    First those at the same offset within their tensors (where noise copied between
    same-shaped tensors lands), then random ones.
    """
    pairs: list[tuple[int, int]] = []
    used = np.zeros(groups.size, dtype=bool)
    if offsets is not None:
        for offset in rng.permutation(np.unique(offsets)).tolist():
            members = [int(c) for c in np.flatnonzero(offsets == offset)]
            while len(members) >= 2 and len(pairs) < MAX_PAIRS // 2:
                a = members.pop(0)
                b = next((c for c in members if groups[c] != groups[a]), None)
                if b is None:
                    break
                members.remove(b)
                pairs.append((a, b))
                used[[a, b]] = True
    waiting: dict[int, int] = {}  # group → a column waiting for a partner of another group
    for column in rng.permutation(np.flatnonzero(~used)).tolist():
        if len(pairs) >= MAX_PAIRS:
            break
        partner = next((g for g in waiting if g != groups[column]), None)
        if partner is None:
            waiting.setdefault(int(groups[column]), column)
            continue
        pairs.append((waiting.pop(partner), column))
    return np.array(pairs, dtype=np.int64).reshape(-1, 2)


def correlation_test(e: np.ndarray, pairs: np.ndarray, rank: int, name: str, alpha: float,
                     power: float) -> CorrelationTest | None:
    """Fisher's test over ``pairs`` (None: no pair, or too few degrees of freedom)."""
    from scipy.stats import chi2, norm

    if pairs.shape[0] == 0 or rank < MIN_RANK:
        return None
    rho, p = pair_p_values(e, pairs, rank)
    statistic = -2 * float(np.log(np.maximum(p, 1e-300)).sum())
    p_value = float(chi2.sf(statistic, 2 * pairs.shape[0]))
    # ≈ a common ρ over P pairs: Σ t² has mean P(1 + rρ²) against P ± √(2P) without it
    count = pairs.shape[0]
    margin = (float(norm.isf(alpha)) + float(norm.isf(1 - power))) * math.sqrt(2 * count)
    detectable = min(1.0, math.sqrt(margin / (count * rank)))
    return CorrelationTest(name, int(pairs.shape[0]), float(np.abs(rho).mean()),
                           math.sqrt(2 / (math.pi * rank)), int((np.abs(rho) > CANCELS).sum()),
                           p_value, detectable)


def correlation_tests(releases: Releases, alpha: float,
                      power: float) -> list[CorrelationTest]:
    """Per tensor (of ≥ 2 sampled coordinates) and across tensors."""
    rank = releases.rank
    e = releases.residuals()
    if not ((e ** 2).sum() > 0):
        return []  # the noise never changed: the lag test names that
    rng = np.random.default_rng(SEED)
    out = []
    for g in sorted(set(releases.column_groups.tolist())):
        pairs = within_pairs(releases.columns(g), rng)
        test = correlation_test(e, pairs, rank, releases.group_names[g], alpha, power)
        if test is not None:
            out.append(test)
    if len(set(releases.column_groups.tolist())) > 1:
        pairs = across_pairs(releases.column_groups, releases.column_offsets, rng)
        test = correlation_test(e, pairs, rank, ACROSS, alpha, power)
        if test is not None:
            out.append(test)
    return out


def correlation_statement(test: CorrelationTest) -> str:
    """Return what one correlation test found, in words."""
    where = "between tensors" if test.group == ACROSS else f"within {test.group}"
    text = (f"{test.group}: correlated noise {where}: the noise of coordinate pairs is "
            f"correlated (mean |ρ| {test.mean_abs:.3g} over {test.pairs} pairs; independent "
            f"noise gives ≈ {test.null_abs:.2g})")
    if test.cancelling:
        text += (f"; in {test.cancelling} pairs it is identical up to sign, so their sum or "
                 "difference carries the data with no noise: ε = ∞ from one release")
    return text + " — the declared Gaussian mechanism draws every coordinate's noise on its own"


@register_estimator(CORRELATED_NOISE)
class CorrelatedNoise(Estimator):
    """Correlation tests of the noise between coordinates (module docstring)."""

    Config = NoOptions

    @staticmethod
    def applies(game: Game) -> bool:
        """Return whether the test runs: a claim, an exact model, enough releases."""
        table = game.streams
        return (game.claims and table is not None and table.exact and
                table.releases is not None and table.releases.rank >= MIN_RANK)

    def tests(self, game: Game) -> int:
        """Return the number of correlation tests :meth:`run` returns."""
        table = game.streams
        if not self.applies(game) or table is None or table.releases is None:
            return 0
        groups = table.releases.column_groups
        counts = np.bincount(groups)
        return int((counts >= 2).sum()) + int(len(set(groups.tolist())) > 1)

    def run(self, game: Game, level: float) -> Findings:
        """Return the correlation tests at ``level``."""
        table = game.streams
        found = Findings()
        if not self.applies(game) or table is None or table.releases is None:
            return found
        for test in correlation_tests(table.releases, level, game.power):
            found.tests.append(DeclarationTest(
                CORRELATED_NOISE, test.group, test.p_value, False,
                correlation_statement(test), samples_out=table.releases.trials, level=level,
                power=game.power, epsilon_lb=math.inf if test.cancelling else None,
                detectable=test.detectable))
        return found
