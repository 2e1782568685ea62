"""Testing a declared Gaussian mechanism from many canaries.

The noise ratio r, its bound and its power.

Each *stream* is the released update projected on one canary's public unit direction u_k. The
declaration says what the stream does: out of the canary's trials it is an offset a (what the
data does; per stratum h of the victim's batches) plus noise of std σ_k; in its trials the
canary adds a shift whose mean d_k and variance v_k the declaration fixes (v_k > 0 for Poisson
sampling, where the canary joins a Binomial number of steps). In units of σ_k

    out:  y = a_h + ξ,  ξ ~ N(0, 1/r²)           in:  y = a_h + ρ_k + ζ,   ρ_k = d_k / σ_k,

with r = 1 for the declared mechanism. r is the factor by which the mechanism tells the canary
apart better than declared — noise 10 % short of the claim is r = 1/0.9 — and it is what the
privacy depends on: a Gaussian mechanism's μ scales with it (a clip that is smaller than
declared shrinks shift and noise alike and leaves r at 1).

For a group of streams the estimate pools every (stream, stratum) cell c with precision weights
w_c = n₁n₀/(n₁ + n₀):

    r̂ = Σ_c w_c (ȳ₁c − ȳ₀c) / (ŝ · Σ_c w_c ρ_c),     ŝ² the pooled out-of-canary variance,

and by the delta method Var r̂ ≈ A + r² B, A = Σ_c w_c² (v̂₁c/n₁c + v̂₀/n₀c) / (ŝ² P²),
B = (κ̂ − 1)/(4 n₀) (P = Σ w_c ρ_c, κ̂ the out residuals' kurtosis, at least 3). The tests are
Fieller's: at a ratio r the statistic T(r) = D − r ŝ P (D = Σ_c w_c (ȳ₁c − ȳ₀c)) is linear in
the mean differences and the spread, so it is normal in both tails with Var T(r) =
(ŝP)² (A + r² B); in units of ŝP, T(r) = r̂ − r. The one-sided test of "r ≤ 1" (the
declaration holds) rejects at level α when (r̂ − 1)/√(A + B) > z_{1−α}, and the lower
confidence bound is the smallest r with (r̂ − r)/√(A + r² B) ≤ z_{1−α} — a root of
(1 − z²B) r² − 2 r̂ r + r̂² − z²A = 0. (A test of ln r̂ instead makes the lower tail far too
thin where the shift is small against the noise: r̂ = 0.38 with se 0.18 is 3.4 standard
errors from 1 but 5.3 in log space, which read as p = 5e-8 for an event of p = 3e-4.) Its
power against noise f·σ (r = 1/f) follows in closed form from the same normal law with the
declared variances (:func:`power`), so a verdict can say what it could have caught, and
:func:`trials_for_power` how many trials reach a stated power. The normal approximation holds
for the thousands of samples a default audit draws; the tests of
``tests/auditing/test_audit_coverage.py`` check its level by simulation.

The test is parametric: it is exact for Gaussian noise and linear scores (the victim projects
what it released itself), and its bound on r converts to ε only within the declared family
(:meth:`fedleak.harness.victim.audit.claim.TrialClaim.epsilon_at`). Anchors: Nasr et al. 2023
(Gaussian-DP auditing with gradient canaries), Andrew et al. 2024 (Gaussian fits of canary
statistics), Steinke, Nasr & Jagielski 2023 (many canaries in one run).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from fedleak.auditing.estimators.noise_level import NoiseLevels
from fedleak.auditing.estimators.releases import Releases


@dataclass(frozen=True)
class StreamTable:
    """What the victim measured, per trial and stream.

    What the victim measured: per trial and stream the released update's projection (oriented so the
    canary pushes it up), the stream's coin, and per stream its group and the declared shift, noise
    std and shift variance.
    """

    values: np.ndarray          # [T, K]
    coins: np.ndarray           # [T, K] bool
    groups: tuple[str, ...]     # [K]
    declared_shift: np.ndarray  # [K] d_k
    declared_std: np.ndarray    # [K] σ_k
    shift_variance: np.ndarray  # [K] v_k (absolute units; 0 without sampling)
    strata: np.ndarray | None = None  # [T] the victim's batch of each trial
    #: the released coordinates' spread away from the canaries
    #: (fedleak.auditing.estimators.noise_level)
    noise: NoiseLevels | None = None
    #: whether the declaration makes every canary's contribution independent of the others'
    #: (one canary per stream, each clipped on its own, summed in one step)
    independent: bool = False
    #: whether the declared model gives the streams' law exactly (nothing but the declared
    #: noise moves a stream within a stratum): then r < 1 is a departure too, tested two-sided
    exact: bool = False
    #: the sampled coordinates of every release in release order (the canary-free phase
    #: included), for the tests across releases and across coordinates
    releases: Releases | None = None
    #: the noise level of the canary-free releases alone, and how many there were
    bare_noise: NoiseLevels | None = None
    bare_releases: int = 0

    def __post_init__(self) -> None:
        """Refuse streams whose values, coins and groups disagree, or a non-positive noise std."""
        t, k = self.values.shape
        if self.coins.shape != (t, k) or len(self.groups) != k:
            raise ValueError("stream values, coins and groups disagree in shape")
        if not (self.declared_std > 0).all():
            raise ValueError("every stream needs a positive declared noise std")


@dataclass(frozen=True)
class Cells:
    """Sufficient statistics of one group's (stream, stratum) cells, in units of σ_k."""

    n1: np.ndarray
    n0: np.ndarray
    mean_difference: np.ndarray
    var_in: np.ndarray
    rho: np.ndarray
    rho_variance: np.ndarray   # v_k / σ_k²
    out_variance: float        # pooled ŝ²
    out_kurtosis: float
    in_excess: float           # pooled in-variance minus out-variance
    in_excess_se: float
    #: False when batches that rarely repeat were pooled (the data's spread joins the noise's)
    stratified: bool = True

    @property
    def weights(self) -> np.ndarray:
        """Return each cell's weight n₁n₀/(n₁ + n₀)."""
        return np.asarray(self.n1 * self.n0 / np.maximum(self.n1 + self.n0, 1), dtype=float)

    @property
    def samples(self) -> tuple[int, int]:
        """Return the (canary-in, canary-out) sample counts."""
        return int(self.n1.sum()), int(self.n0.sum())


def cells(table: StreamTable, members: np.ndarray) -> Cells | None:
    """Return the group's cells; None when no cell has both an in and an out sample.

    Strata that leave fewer than half the samples in usable cells (batches that rarely repeat) are
    pooled instead: the data's spread then only adds to the noise (conservative).
    """
    if table.strata is not None:
        by_stratum = _cells(table, members, table.strata)
        usable = 0 if by_stratum is None else sum(by_stratum.samples)
        if usable * 2 >= table.values.shape[0] * len(members):
            return by_stratum
        if len(np.unique(table.strata)) > 1:
            pooled = _cells(table, members, np.zeros(len(table.values), int))
            return None if pooled is None else dataclasses.replace(pooled, stratified=False)
    return _cells(table, members, np.zeros(len(table.values), int))


#: float32's unit roundoff times the sums a released coordinate goes through: a spread below
#: this share of the values' magnitude is rounding, not noise
ROUNDING = 64 * 2.0 ** -24


def rounding_floor(values: np.ndarray) -> float:
    """Return the largest spread float rounding alone gives ``values``.

    The largest spread float rounding alone gives ``values`` (released in float32, so each carries a
    relative error of 2⁻²⁴ per operation): :data:`ROUNDING` · ``max |value|``.

    A spread at or below it means the noise did not change across the trials (a fixed seed,
    noise reused, no noise); it is read as zero, so the test says so (r̂ = ∞) on every CPU
    instead of dividing by a rounding residue whose size depends on the kernels.
    """
    finite = np.abs(values[np.isfinite(values)])
    return float(ROUNDING * finite.max()) if finite.size else 0.0


def _cells(table: StreamTable, members: np.ndarray, strata: np.ndarray) -> Cells | None:
    n1s, n0s, diffs, vins, rhos, rvs = [], [], [], [], [], []
    out_res, in_res = [], []
    for k in members:
        y = table.values[:, k] / table.declared_std[k]
        coins = table.coins[:, k]
        for h in np.unique(strata):
            rows = strata == h
            yin, yout = y[rows & coins], y[rows & ~coins]
            if yin.size < 2 or yout.size < 2:
                continue
            n1s.append(yin.size)
            n0s.append(yout.size)
            diffs.append(yin.mean() - yout.mean())
            vins.append(yin.var(ddof=1))
            rhos.append(table.declared_shift[k] / table.declared_std[k])
            rvs.append(table.shift_variance[k] / table.declared_std[k] ** 2)
            out_res.append(yout - yout.mean())
            in_res.append(yin - yin.mean())
    if not n1s:
        return None
    out = np.concatenate(out_res)
    inside = np.concatenate(in_res)
    dof_out = max(out.size - len(out_res), 1)
    dof_in = max(inside.size - len(in_res), 1)
    s2 = float((out ** 2).sum() / dof_out)
    if s2 <= rounding_floor(table.values[:, members] / table.declared_std[members]) ** 2:
        s2 = 0.0  # a spread only float rounding makes: the noise did not change at all
    v_in = float((inside ** 2).sum() / dof_in)
    m4 = float((out ** 4).mean())
    kurt = min(max(m4 / s2 ** 2, 3.0), 50.0) if s2 > 0 else 3.0
    m4_in = float((inside ** 4).mean())
    se_excess = math.sqrt(max(m4_in - v_in ** 2, 0) / inside.size
                          + max(m4 - s2 ** 2, 0) / out.size)
    return Cells(np.array(n1s, float), np.array(n0s, float), np.array(diffs), np.array(vins),
                 np.array(rhos), np.array(rvs), s2, kurt, v_in - s2, se_excess)


@dataclass(frozen=True)
class RatioTest:
    """The noise-ratio test of one group of streams (module docstring)."""

    group: str
    streams: int
    samples_in: int
    samples_out: int
    ratio: float          # r̂
    ratio_lower: float    # one-sided lower bound at the test's level
    p_value: float        # of "r ≤ 1"
    level: float          # the level the bound holds at (family-wise share)
    detectable_noise: float  # f: noise below f·σ is caught with the stated power (0: nothing)
    power: float

    @property
    def detectable_ratio(self) -> float:
        """Return the ratio 1/f the test detects (∞ when no noise shortfall is detectable)."""
        return math.inf if self.detectable_noise <= 0 else 1 / self.detectable_noise


def _variance_of_ratio(c: Cells, r: float, declared: bool) -> float:
    """Return Var r̂ at ratio r.

    Var r̂ at ratio r: with the observed variances, or (``declared``) with the declared model's (out
    1/r², in 1/r² + v).
    """
    w = c.weights
    p = float((w * c.rho).sum())
    if declared:
        s2 = 1 / r ** 2
        var_in = s2 + c.rho_variance
        n_out = float(c.n0.sum())
        kurt = 3.0
    else:
        s2, var_in, n_out, kurt = c.out_variance, c.var_in, float(c.n0.sum()), c.out_kurtosis
    if not (s2 > 0 and p > 0):
        return math.inf if s2 <= 0 and not declared else 0.0
    numerator = float((w ** 2 * (var_in / c.n1 + s2 / c.n0)).sum())
    return numerator / (s2 * p * p) + r * r * (kurt - 1) / (4 * n_out)


def _variance_parts(c: Cells) -> tuple[float, float]:
    """Return (A, B) of Var r̂ ≈ A + r² B with the observed variances (module docstring)."""
    p = float((c.weights * c.rho).sum())
    numerator = float((c.weights ** 2 * (c.var_in / c.n1 + c.out_variance / c.n0)).sum())
    return numerator / (c.out_variance * p * p), (c.out_kurtosis - 1) / (4 * float(c.n0.sum()))


def fieller_lower(r: float, a: float, b: float, z: float) -> float:
    """Return the Fieller lower confidence bound on the ratio.

    The smallest ρ ≤ r̂ with (r̂ − ρ)/√(A + ρ² B) ≤ z: the root of
    (1 − z²B) ρ² − 2 r̂ ρ + r̂² − z²A = 0 below r̂, and 0 when even ρ = 0 is not rejected
    (r̂ ≤ z√A) or the spread is too uncertain for a bound (z²B ≥ 1).
    """
    if r <= z * math.sqrt(a):
        return 0.0
    lead = 1 - z * z * b
    if lead <= 0:
        return 0.0
    disc = z * z * (a + b * r * r - z * z * a * b)
    return max(0.0, (r - math.sqrt(max(disc, 0.0))) / lead)


def ratio_estimate(c: Cells) -> float:
    """r̂ (∞ when the out-of-canary samples do not vary at all)."""
    p = float((c.weights * c.rho).sum())
    difference = float((c.weights * c.mean_difference).sum())
    if p <= 0:
        return math.nan
    if c.out_variance <= 0:
        return math.inf if difference > 0 else 0.0
    return difference / (math.sqrt(c.out_variance) * p)


def power(c: Cells, ratio: float, alpha: float, scale: float = 1.0) -> float:
    """Return the power of the noise-ratio test at ratio ``ratio``.

    P(the test rejects at level ``alpha``) when the mechanism's ratio is ``ratio``, at the cells'
    sample sizes times ``scale``, under the declared model (r̂ normal, Fieller's statistic:
    the test rejects when r̂ > 1 + z_{1−α} se₁).
    """
    from scipy.stats import norm  # here, not at import: the victim imports this module

    scaled = dataclasses.replace(c, n1=c.n1 * scale, n0=c.n0 * scale)
    se_null = math.sqrt(_variance_of_ratio(scaled, 1.0, declared=True))
    se_alt = math.sqrt(_variance_of_ratio(scaled, ratio, declared=True))
    critical = 1.0 + norm.isf(alpha) * se_null
    if not se_alt > 0:
        return float(ratio > critical)
    return float(norm.sf((critical - ratio) / se_alt))


def detectable_ratio(c: Cells, alpha: float, target: float, scale: float = 1.0) -> float:
    """Return the smallest r the test detects with probability ``target``.

    ∞ if even r = 1000 is not detected.
    """
    from scipy.optimize import brentq

    if power(c, 1000.0, alpha, scale) < target:
        return math.inf
    if power(c, 1.0 + 1e-9, alpha, scale) >= target:
        return 1.0
    return float(brentq(lambda r: power(c, r, alpha, scale) - target, 1.0 + 1e-9, 1000.0,
                        xtol=1e-6))


def ratio_test(table: StreamTable, group: str, members: np.ndarray, alpha: float,
               target_power: float) -> RatioTest | None:
    """Run the noise-ratio test of ``members`` at level ``alpha``.

    The noise-ratio test of ``members`` at level ``alpha`` (module docstring); two-sided where the
    declared model is exact (:attr:`StreamTable.exact`): a mechanism that tells the canaries apart
    much *worse* than declared (a batch clipped as a whole, a sum divided by the batch's actual
    size) is not the declared one either.
    """
    from scipy.stats import norm

    c = cells(table, members)
    if c is None or not float((c.weights * c.rho).sum()) > 0:
        return None
    r = ratio_estimate(c)
    z = norm.isf(alpha)
    if math.isinf(r):
        lower, p_value = math.inf, 0.0
    elif not r > 0:
        lower, p_value = 0.0, 1.0
    else:  # Fieller's statistic, normal in both tails (module docstring)
        a, b = _variance_parts(c)
        se_one = math.sqrt(a + b)
        lower = fieller_lower(r, a, b, z)
        p_value = float(norm.sf((r - 1) / se_one)) if se_one > 0 else float(r <= 1)
        if table.exact and c.stratified:
            p_value = min(1.0, 2 * min(p_value, 1 - p_value))
    detectable = detectable_ratio(c, alpha / 2 if table.exact else alpha, target_power)
    n1, n0 = c.samples
    return RatioTest(group, len(members), n1, n0, r, lower, p_value, alpha,
                     0.0 if math.isinf(detectable) else 1 / detectable, target_power)


def trials_for_power(c: Cells, trials: int, alpha: float, noise: float, target: float,
                     most: int) -> int:
    """Return the trials at which the test detects noise ``noise``·σ with power ``target``.

    Trials at which the test (measured on ``trials`` trials) would detect noise ``noise``·σ with
    probability ``target``: its cells scale with the trials (at most ``most``).
    """
    ratio = 1 / noise
    if power(c, ratio, alpha, most / trials) < target:
        return most
    low, high = 1, most
    while high - low > max(1, low // 100):
        middle = (low + high) // 2
        if power(c, ratio, alpha, middle / trials) >= target:
            high = middle
        else:
            low = middle
    return high


def declared_cells(rho: np.ndarray, rho_variance: np.ndarray, trials: int,
                   coin_rate: float = 0.5) -> Cells:
    """Return the cells the declared model expects after ``trials`` trials.

    The cells the declared model expects after ``trials`` trials (each stream's canary in with
    probability ``coin_rate``): for choosing the trials before any has run.
    """
    n1 = np.full(len(rho), trials * coin_rate)
    n0 = np.full(len(rho), trials * (1 - coin_rate))
    ones = np.ones(len(rho))
    return Cells(n1, n0, np.asarray(rho, float), ones + rho_variance, np.asarray(rho, float),
                 np.asarray(rho_variance, float), 1.0, 3.0, float(np.mean(rho_variance)), 0.0)
