"""The estimators of the primary canary's scores (the server's submitted test statistic).

Clopper–Pearson, the Gaussian-DP route, the one-run bound, the subsampled-Gaussian route for Poisson
sampling, and the one-shot estimate (an estimate, reported apart from the bounds).

Each bound chooses its threshold on the calibration share (or uses the threshold the auditor
declared before the first trial) and is computed on the other trials
(:mod:`fedleak.auditing.thresholds`). When the chain claims an ε, each bound is also one test
of the declaration: recomputed at the verdict's per-test level, it rejects the claim when it
exceeds it (its p-value is then that level, else 1 — a valid p-value).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedleak.auditing.estimator_registry import (
    Estimator,
    Findings,
    Game,
    NoOptions,
    register_estimator,
)
from fedleak.auditing.estimators.clopper_pearson import clopper_pearson_epsilon, upper_bound
from fedleak.auditing.estimators.gaussian_dp import (
    epsilon_from_mu,
    gdp_epsilon_lower_bound,
    mu_lower_bound,
)
from fedleak.auditing.estimators.noise_ratio import rounding_floor
from fedleak.auditing.estimators.one_run import one_run_epsilon
from fedleak.auditing.estimators.subsampled_gaussian import mu_lower_bound_subsampled
from fedleak.auditing.result import (
    CLOPPER_PEARSON,
    GAUSSIAN_DP,
    ONE_RUN,
    ONE_SHOT,
    SUBSAMPLED_GAUSSIAN,
    AuditBound,
    DeclarationTest,
    format_confidence,
    format_epsilon,
)
from fedleak.auditing.thresholds import (
    best_threshold,
    best_threshold_gaussian,
    best_threshold_pair,
    error_counts,
    guess_counts,
)


@dataclass(frozen=True)
class Split:
    """The primary scores split into calibration and evaluation shares."""

    rule: str
    cal_s: np.ndarray
    cal_c: np.ndarray
    ev_s: np.ndarray
    ev_c: np.ndarray
    common: dict[str, Any]


def split(game: Game) -> Split:
    """Return the shares and the fields every bound of ``game`` carries."""
    scores = np.asarray(game.scores, float)
    coins = np.asarray(game.coins, bool)
    calibration = np.asarray(game.calibration, bool)
    if game.declared_threshold is not None:
        calibration = np.zeros_like(coins)
        rule = ("declared threshold: fixed by the auditor before the first trial, every "
                f"trial evaluated ({scores.size})")
    else:
        rule = (f"held-out split: thresholds chosen on {int(calibration.sum())} calibration "
                f"trials, the bound computed on the other {int((~calibration).sum())}")
    ev_c = coins[~calibration]
    s = game.settings
    common = dict(confidence=s.confidence, trials_in=int(ev_c.sum()),
                  trials_out=int((~ev_c).sum()), delta=s.delta, canary=s.canary,
                  threat_model=s.threat_model, threshold_rule=rule)
    return Split(rule, scores[calibration], coins[calibration], scores[~calibration], ev_c,
                 common)


def claim_test(game: Game, name: str, epsilon_at_level: float, level: float) -> list[
        DeclarationTest]:
    """Return the bound as a test of the claim: rejected when, at ``level``, it exceeds it."""
    if not game.claims or game.claim is None:
        return []
    exceeds = epsilon_at_level > game.claim.epsilon * (1 + 1e-9)
    return [DeclarationTest(
        name, "", level if exceeds else 1.0, False,
        f"{name} ε_LB {format_epsilon(epsilon_at_level)} at {format_confidence(1 - level)} "
        f"{'exceeds' if exceeds else 'does not exceed'} the claimed ε "
        f"{format_epsilon(game.claim.epsilon)}", epsilon_lb=epsilon_at_level, level=level)]


class PrimaryBound(Estimator):
    """A bound on the primary scores that is also one test of the claim."""

    Config = NoOptions

    def tests(self, game: Game) -> int:
        """Return one test of the claim when there is a claim and the bound applies."""
        return 1 if game.claims and self.applies(game) else 0

    def applies(self, game: Game) -> bool:
        """Tell whether the bound applies to ``game`` (always, by default)."""
        return True


@register_estimator(CLOPPER_PEARSON)
class ClopperPearson(PrimaryBound):
    """ε_LB from exact binomial bounds on the test's error rates (Jagielski et al. 2020)."""

    def run(self, game: Game, level: float) -> Findings:
        """Bound ε by Clopper–Pearson bounds on the test's error rates (Jagielski et al. 2020)."""
        sp, a, d = split(game), game.settings.alpha, game.settings.delta
        t = game.declared_threshold if game.declared_threshold is not None else best_threshold(
            sp.cal_s, sp.cal_c,
            lambda fp, n0, fn, n1: clopper_pearson_epsilon(fp, n0, fn, n1, a, d))
        fp, n0, fn, n1 = error_counts(sp.ev_s, sp.ev_c, t)
        bound = AuditBound(CLOPPER_PEARSON, clopper_pearson_epsilon(fp, n0, fn, n1, a, d), False,
                           threshold=t, fpr_upper=upper_bound(fp, n0, a / 2),
                           fnr_upper=upper_bound(fn, n1, a / 2), **sp.common)
        strict = clopper_pearson_epsilon(fp, n0, fn, n1, level, d)
        return Findings([bound], claim_test(game, CLOPPER_PEARSON, strict, level))


@register_estimator(GAUSSIAN_DP)
class GaussianDP(PrimaryBound):
    """μ_LB from the error rates, then ε of μ-GDP at δ (Nasr et al. 2023)."""

    def run(self, game: Game, level: float) -> Findings:
        """Bound μ from the error rates, then ε of μ-GDP at δ (Nasr et al. 2023)."""
        sp, a, d = split(game), game.settings.alpha, game.settings.delta
        t = game.declared_threshold if game.declared_threshold is not None else \
            best_threshold_gaussian(sp.cal_s, sp.cal_c, int((~sp.ev_c).sum()),
                                    int(sp.ev_c.sum()),
                                    lambda fp, n0, fn, n1: mu_lower_bound(fp, n0, fn, n1, a))
        fp, n0, fn, n1 = error_counts(sp.ev_s, sp.ev_c, t)
        epsilon, mu = gdp_epsilon_lower_bound(fp, n0, fn, n1, a, d)
        bound = AuditBound(GAUSSIAN_DP, epsilon, False, threshold=t, mu=mu,
                           fpr_upper=upper_bound(fp, n0, a / 2),
                           fnr_upper=upper_bound(fn, n1, a / 2), **sp.common)
        strict, _ = gdp_epsilon_lower_bound(fp, n0, fn, n1, level, d)
        return Findings([bound], claim_test(game, GAUSSIAN_DP, strict, level))


@register_estimator(ONE_RUN)
class OneRun(PrimaryBound):
    """Correct guesses against Binomial(r, e^ε/(1+e^ε)) (Steinke, Nasr & Jagielski 2023)."""

    def run(self, game: Game, level: float) -> Findings:
        """Bound ε from the correct guesses of the three-way test (Steinke et al. 2023)."""
        sp, a, d = split(game), game.settings.alpha, game.settings.delta
        fixed = game.declared_threshold
        lower, upper = (np.nextafter(fixed, -np.inf), fixed) if fixed is not None else \
            best_threshold_pair(sp.cal_s, sp.cal_c,
                                lambda m, r, v: one_run_epsilon(m, r, v, a, d))
        guesses, correct = guess_counts(sp.ev_s, sp.ev_c, lower, upper)
        bound = AuditBound(ONE_RUN, one_run_epsilon(sp.ev_s.size, guesses, correct, a, d),
                           False, threshold=upper,
                           lower_threshold=None if math.isinf(lower) else lower,
                           guesses=guesses, correct=correct, **sp.common)
        strict = one_run_epsilon(sp.ev_s.size, guesses, correct, level, d)
        return Findings([bound], claim_test(game, ONE_RUN, strict, level))


@register_estimator(SUBSAMPLED_GAUSSIAN)
class SubsampledGaussian(PrimaryBound):
    """Gaussian-DP route through the Poisson-subsampled Gaussian's trade-off curve.

    The Gaussian-DP route through the Poisson-subsampled Gaussian's trade-off curve, for a claim of
    one Poisson-sampled step (:mod:`fedleak.auditing.estimators.subsampled_gaussian`).
    """

    def applies(self, game: Game) -> bool:
        """Tell whether the claim is one Poisson-sampled Gaussian step (q < 1, σ known)."""
        c = game.claim
        return c is not None and c.sample_rate is not None and c.sigma is not None \
            and c.steps == 1 and c.sample_rate < 1

    def run(self, game: Game, level: float) -> Findings:
        """Bound μ under the subsampled Gaussian's trade-off curve, then ε at δ."""
        if not self.applies(game) or game.claim is None:
            return Findings()
        claim = game.claim
        q, z = float(claim.sample_rate or 1), float(claim.sigma or 0)
        sp, a = split(game), game.settings.alpha
        t = game.declared_threshold if game.declared_threshold is not None else best_threshold(
            sp.cal_s, sp.cal_c,
            lambda fp, n0, fn, n1: mu_lower_bound_subsampled(fp, n0, fn, n1, a, q))
        fp, n0, fn, n1 = error_counts(sp.ev_s, sp.ev_c, t)
        mu = mu_lower_bound_subsampled(fp, n0, fn, n1, a, q)
        bound = AuditBound(SUBSAMPLED_GAUSSIAN, claim.epsilon_at(mu * z) if mu > 0 else 0.0,
                           False, threshold=t, mu=mu, fpr_upper=upper_bound(fp, n0, a / 2),
                           fnr_upper=upper_bound(fn, n1, a / 2),
                           note=f"one Poisson-sampled Gaussian step at q = {q:g}", **sp.common)
        strict_mu = mu_lower_bound_subsampled(fp, n0, fn, n1, level, q)
        strict = claim.epsilon_at(strict_mu * z) if strict_mu > 0 else 0.0
        return Findings([bound], claim_test(game, SUBSAMPLED_GAUSSIAN, strict, level))


@register_estimator(ONE_SHOT)
class OneShot(Estimator):
    """Andrew et al.'s one-shot estimate, kept honest.

    Gaussians with a common spread (the Gaussian mechanism's) fitted to the canary-in and canary-out
    scores, μ̂ corrected for the upward bias of the noncentral t (E t = δ·c(ν), c(ν) = √(ν/2)
    Γ((ν−1)/2)/Γ(ν/2)), and a two-sided interval at the audit's confidence by inverting the
    noncentral t. An estimate, not a bound: it assumes Gaussian scores, and it is reported apart
    from the bounds.
    """

    Config = NoOptions

    def run(self, game: Game, level: float) -> Findings:
        """Estimate ε from Gaussians fitted to the scores (Andrew et al. 2024; an estimate)."""
        scores, coins = np.asarray(game.scores, float), np.asarray(game.coins, bool)
        found = one_shot_interval(scores, coins, game.settings.delta,
                                  game.settings.confidence)
        if found is None:
            return Findings()
        estimate, low, high = found
        s = game.settings
        return Findings([AuditBound(
            ONE_SHOT, estimate, True, confidence=None, trials_in=int(coins.sum()),
            trials_out=int((~coins).sum()), delta=s.delta, canary=s.canary,
            threat_model=s.threat_model,
            threshold_rule="none: Gaussians with a common spread fitted to every trial",
            interval_low=low, interval_high=high, interval_level=s.confidence,
            note="an estimate, not a bound: it assumes Gaussian scores (false for Poisson "
                 "mixtures, pruning, quantisation); bias-corrected μ, noncentral-t interval")])


def one_shot_interval(scores: np.ndarray, coins: np.ndarray, delta: float,
                      confidence: float) -> tuple[float, float, float] | None:
    """(ε estimate, interval low, high) of :class:`OneShot`.

    None when δ = 0, either side has fewer than two trials, or the scores do not vary.
    """
    inside, outside = scores[coins], scores[~coins]
    n1, n0 = inside.size, outside.size
    if delta <= 0 or n1 < 2 or n0 < 2:
        return None
    dof = n1 + n0 - 2
    pooled = math.sqrt((((inside - inside.mean()) ** 2).sum()
                        + ((outside - outside.mean()) ** 2).sum()) / dof)
    if not pooled > rounding_floor(scores):  # a rounding residue is no spread (any CPU)
        return None
    scale = math.sqrt(1 / n1 + 1 / n0)
    t = (inside.mean() - outside.mean()) / (pooled * scale)
    bias = math.exp(0.5 * math.log(dof / 2) + math.lgamma((dof - 1) / 2) - math.lgamma(dof / 2))
    mu = max(0.0, t / bias * scale)
    alpha = 1 - confidence
    low = _noncentrality(t, dof, alpha / 2) * scale
    high = _noncentrality(t, dof, 1 - alpha / 2) * scale
    return (epsilon_from_mu(mu, delta), epsilon_from_mu(max(low, 0.0), delta),
            epsilon_from_mu(max(high, 0.0), delta))


def _noncentrality(t: float, dof: int, tail: float) -> float:
    """Return the noncentrality d at which P(T ≥ t) = ``tail`` for T ~ nct(dof, d).

    From 100 degrees of freedom on with the normal law T ≈ N(d, 1 + d²/(2·dof)) (exact enough, and
    robust at the large t of a mechanism without noise).
    """
    from scipy.optimize import brentq
    from scipy.stats import nct, norm

    if dof >= 100:
        def gap(d: float) -> float:
            return float(norm.sf((t - d) / math.sqrt(1 + d * d / (2 * dof)))) - tail
    else:
        def gap(d: float) -> float:
            return float(nct.sf(t, dof, d)) - tail

    low, high = t - 10 - abs(t), t + 10 + abs(t)
    if gap(low) > 0 or gap(high) < 0:
        return t
    return float(brentq(gap, low, high, xtol=1e-8))
