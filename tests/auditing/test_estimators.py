"""The auditing room in-process: each estimator against its published values, the game's
threshold discipline, and the canaries."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

from fedleak.auditing import (
    GameSettings,
    audit_bounds,
    calibration_split,
    clopper_pearson_epsilon,
    epsilon_from_mu,
    epsilon_two_gaussians,
    mu_from_epsilon,
    one_run_epsilon,
    score_histogram,
)
from fedleak.auditing.canaries import (
    dirac,
    flat_dot,
    input_canary,
    quiet_coordinate,
    random_direction,
)
from fedleak.auditing.estimators.gaussian_dp import delta_from_mu, mu_lower_bound
from fedleak.auditing.estimators.one_run import p_value
from fedleak.auditing.estimators.one_shot import (
    CosineNull,
    epsilon_gaussian_alternative,
    jeffreys_null_epsilon,
    jeffreys_threshold_epsilon,
)

#: The seed of Andrew et al.'s tests (google-research/federated, one_shot_epe).
ANDREW_SEED = 0xBAD5EED


def test_clopper_pearson_ceiling_of_500_perfect_trials_per_side() -> None:
    """No error in 500 + 500 trials, 0.5 % per side (99 % jointly), δ = 0: ε_LB = 4.54."""
    assert clopper_pearson_epsilon(0, 500, 0, 500, alpha=0.01, delta=0) == \
        pytest.approx(4.5419, abs=1e-3)
    # errors and δ only lower it; a coin-flip test certifies nothing
    assert clopper_pearson_epsilon(5, 500, 5, 500, 0.01, 0) < 4.54
    assert clopper_pearson_epsilon(0, 500, 0, 500, 0.01, 0.01) < 4.54
    assert clopper_pearson_epsilon(250, 500, 250, 500, 0.05, 0) == 0.0


@pytest.mark.parametrize("mu, epsilon", [(1.0, 4.377), (0.5, 1.993), (2.0, 9.997)])
def test_gaussian_dp_conversion_at_delta_1e5(mu: float, epsilon: float) -> None:
    assert epsilon_from_mu(mu, 1e-5) == pytest.approx(epsilon, abs=1e-3)
    assert mu_from_epsilon(epsilon_from_mu(mu, 1e-5), 1e-5) == pytest.approx(mu, rel=1e-6)


@pytest.mark.parametrize("epsilon, mu", [(0.0, 1.0), (1.0, 1.0), (3.0, 2.0), (10.0, 5.0),
                                         (50.0, 12.0), (0.5, 0.3)])
def test_delta_of_mu_gdp_equals_the_corollary_where_that_form_is_finite(epsilon: float,
                                                                        mu: float) -> None:
    direct = norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon + norm.logcdf(-epsilon / mu
                                                                            - mu / 2))
    assert delta_from_mu(epsilon, mu) == pytest.approx(direct, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("mu", [1e3, 1e8, 1e15, 1e150])
def test_gaussian_dp_at_a_huge_mu_is_finite_and_grows_as_mu_squared(mu: float) -> None:
    """The direct form of δ(ε) overflowed (``e^ε``) or cancelled to garbage once ε passed a
    few hundred: an audit of noise that never changes died with OverflowError on some CPUs.
    For large μ, δ ≈ Φ(μ/2 − ε/μ), so ε(μ, δ) ≈ μ²/2 + μ·Φ⁻¹(1 − δ)."""
    value = epsilon_from_mu(mu, 1e-5)
    assert math.isfinite(value)
    assert value == pytest.approx(mu * mu / 2 + mu * norm.isf(1e-5), rel=1e-4)
    assert epsilon_from_mu(1e200, 1e-5) == math.inf


def test_a_spread_of_float_rounding_is_no_spread() -> None:
    """Noise that never changes, released in float32 and summed in another order on another
    CPU, varies by a rounding residue only: the ratio test reads it as zero noise (r̂ = ∞),
    not as a huge finite ratio that depends on the kernels."""
    from fedleak.auditing.estimators.noise_ratio import StreamTable, ratio_test

    rng = np.random.default_rng(0)
    trials, streams = 400, 4
    coins = rng.random((trials, streams)) < 0.5
    fixed = rng.normal(size=streams)  # one noise draw, reused in every trial
    values = fixed + 3.0 * coins + rng.normal(scale=1e-7, size=(trials, streams))
    table = StreamTable(values, coins, ("w",) * streams, np.full(streams, 3.0),
                        np.ones(streams), np.zeros(streams))
    test = ratio_test(table, "w", np.arange(streams), 1e-4, 0.99)
    assert test is not None and math.isinf(test.ratio) and test.p_value == 0.0
    fresh = StreamTable(rng.normal(size=(trials, streams)) + 3.0 * coins, coins, ("w",) * streams,
                        np.full(streams, 3.0), np.ones(streams), np.zeros(streams))
    honest = ratio_test(fresh, "w", np.arange(streams), 1e-4, 0.99)
    assert honest is not None and math.isfinite(honest.ratio) and 0.8 < honest.ratio < 1.25


def test_mu_lower_bound_from_error_rates() -> None:
    # with rates bounded at exactly their observed values μ_LB would be Φ⁻¹(1−FPR) − Φ⁻¹(FNR);
    # Clopper–Pearson's upper bounds make it smaller, more trials bring it closer
    exact = float(norm.ppf(1 - 0.3085) - norm.ppf(0.3085))
    few = mu_lower_bound(31, 100, 31, 100, 0.05)
    many = mu_lower_bound(3085, 10_000, 3085, 10_000, 0.05)
    assert few < many < exact == pytest.approx(1.0, abs=1e-3)
    assert many == pytest.approx(exact, abs=0.07)


def test_one_run_bound_closed_form_and_delta() -> None:
    """δ = 0 and r right guesses out of r: q^r = p, so ε_LB = ln(q/(1 − q)) at q = p^(1/r)."""
    q = 0.05 ** (1 / 100)
    assert one_run_epsilon(1000, 100, 100, 0.05, 0.0) == pytest.approx(math.log(q / (1 - q)),
                                                                      abs=1e-5)
    assert one_run_epsilon(1000, 100, 100, 0.05, 1e-5) < one_run_epsilon(1000, 100, 100, 0.05,
                                                                          0.0)
    assert one_run_epsilon(1000, 100, 50, 0.05, 0.0) == 0.0  # chance accuracy
    assert p_value(0.0, 0.0, 10, 10, 0) == 1.0
    with pytest.raises(ValueError, match="correct"):
        p_value(1.0, 0.0, 10, 5, 6)


def test_andrew_et_al_test_constants() -> None:
    """The regression values of google-research/federated one_shot_epe's tests."""
    rng = np.random.default_rng(ANDREW_SEED)
    seen, unseen = rng.normal(1.0, 1.0, 100), rng.normal(0.0, 1.0, 100)
    assert jeffreys_threshold_epsilon(seen, unseen, 1e-2, 1e-2) == pytest.approx(0.6839449,
                                                                                 rel=1e-6)
    for dim, expected in [(200, 1.394838), (2000, 1.3880321)]:
        sigma = dim ** -0.5
        cosines = np.random.default_rng(ANDREW_SEED).normal(sigma, sigma, 100)
        assert jeffreys_null_epsilon(cosines, dim, 1e-2, 1e-2) == pytest.approx(expected,
                                                                                rel=1e-5)
    for dim, expected in [(200, 2.375326), (2000, 2.317789)]:
        sigma = dim ** -0.5
        assert epsilon_gaussian_alternative(sigma, sigma, dim, 1e-2) == \
            pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("delta", [1e-5, 1e-2])
def test_two_gaussians_equal_variance_is_the_gaussian_mechanism(delta: float) -> None:
    for sigma in (0.5, 1.0, 3.0):
        expected = epsilon_from_mu(1 / sigma, delta)
        assert epsilon_two_gaussians(0, sigma, 1, sigma, delta) == pytest.approx(expected,
                                                                                 rel=1e-6)
        assert epsilon_two_gaussians(0, sigma, 1, sigma + 1e-12, delta) == \
            pytest.approx(expected, rel=1e-5)


def test_two_gaussians_unequal_variance_matches_the_privacy_loss() -> None:
    """δ(ε) = E_P[max(0, 1 − e^{ε − L})], L the privacy loss, by Monte Carlo in both orders."""
    rng = np.random.default_rng(ANDREW_SEED)
    m1, s1, m2, s2, delta = 0.3, 1.2, 1.7, 0.8, 0.1
    epsilon = epsilon_two_gaussians(m1, s1, m2, s2, delta)
    worst = 0.0
    for (ma, sa), (mb, sb) in [((m1, s1), (m2, s2)), ((m2, s2), (m1, s1))]:
        y = rng.normal(ma, sa, 400_000)
        loss = norm.logpdf(y, ma, sa) - norm.logpdf(y, mb, sb)
        worst = max(worst, float(np.mean(np.maximum(0, 1 - np.exp(epsilon - loss)))))
    assert worst == pytest.approx(delta, abs=3e-3)


def test_cosine_null_is_the_beta_law_and_tends_to_normal() -> None:
    exact, approx = CosineNull(999), norm(scale=999 ** -0.5)
    for t in (-0.05, 0.0, 0.03, 0.08):
        assert math.exp(exact.log_sf(t)) == pytest.approx(float(approx.sf(t)), abs=2e-4)
    assert CosineNull(50).ppf(0.5) == pytest.approx(0.0, abs=1e-9)


def _gaussian_game(seed: int, mu: float, trials: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    coins = rng.random(trials) < 0.5
    return rng.normal(mu * coins, 1.0), coins


def test_bounds_stay_below_the_truth_and_the_gdp_route_is_tight() -> None:
    """A μ = 1 Gaussian mechanism (ε = 4.38 at δ = 1e-5), 1,000 trials per hypothesis:
    no bound exceeds the truth, and the GDP route is the tightest bound."""
    settings = GameSettings(delta=1e-5, confidence=0.95, canary="synthetic",
                            threat_model="sees the mechanism's output")
    found: dict[str, list[float]] = {}
    for seed in range(4):
        scores, coins = _gaussian_game(seed, 1.0, 2000)
        mask = calibration_split(2000, 0.2, np.random.default_rng(100 + seed))
        for bound in audit_bounds(scores, coins, mask, settings):
            found.setdefault(bound.estimator, []).append(bound.epsilon)
            if not bound.is_estimate:
                assert bound.epsilon < 4.377
                assert bound.confidence == 0.95 and bound.delta == 1e-5
                assert bound.trials_in + bound.trials_out == 1600
                assert "held-out split" in bound.threshold_rule
    assert min(found["gaussian-dp"]) > 2.3 and np.mean(found["gaussian-dp"]) > 2.9
    assert max(found["clopper-pearson"]) < min(found["gaussian-dp"])
    assert set(found) == {"clopper-pearson", "gaussian-dp", "one-run", "one-shot"}


def test_thresholds_are_never_chosen_on_the_evaluated_trials() -> None:
    settings = GameSettings(1e-5, 0.95, "synthetic", "test")
    scores, coins = _gaussian_game(7, 1.0, 600)
    mask = calibration_split(600, 0.5, np.random.default_rng(1))
    first = audit_bounds(scores, coins, mask, settings)
    moved = scores.copy()
    moved[~mask] = np.random.default_rng(2).normal(0, 1, int((~mask).sum()))  # new evaluation
    second = audit_bounds(moved, coins, mask, settings)
    for a, b in zip(first, second, strict=True):
        if not a.is_estimate:
            assert a.threshold == b.threshold and a.lower_threshold == b.lower_threshold
    declared = audit_bounds(scores, coins, mask, settings, declared_threshold=0.5)
    assert all(b.threshold == 0.5 and b.trials_in + b.trials_out == 600
               and "declared" in b.threshold_rule for b in declared if not b.is_estimate)


def test_a_broken_mechanism_is_caught() -> None:
    """Scores of σ = 0.5 where σ = 1 (ε 4.38) is claimed: the GDP bound passes the claim."""
    settings = GameSettings(1e-5, 0.95, "synthetic", "test")
    scores, coins = _gaussian_game(3, 2.0, 1000)
    bounds = audit_bounds(scores, coins, np.zeros(1000, bool), settings, declared_threshold=1.0)
    assert next(b for b in bounds if b.estimator == "gaussian-dp").epsilon > 4.377


def test_histogram_and_bad_input() -> None:
    scores, coins = _gaussian_game(0, 1.0, 200)
    histogram = score_histogram(scores, coins, bins=10)
    assert len(histogram.edges) == 11
    assert sum(histogram.canary_in) == coins.sum() and sum(histogram.canary_out) == 200 - \
        coins.sum()
    settings = GameSettings(1e-5, 0.95, "synthetic", "test")
    with pytest.raises(ValueError, match="finite"):
        audit_bounds(np.array([0.0, np.nan]), np.array([True, False]), np.array([True, False]),
                     settings)
    with pytest.raises(ValueError, match="confidence"):
        GameSettings(1e-5, 1.0, "x", "y")
    with pytest.raises(ValueError, match="calibration fraction"):
        calibration_split(10, 1.0, np.random.default_rng(0))


def test_canaries_are_public_functions_of_their_inputs() -> None:
    shapes = [(3, 4), (5,)]
    e = dirac(shapes, 13)
    assert e[1][1] == 1 and float(sum(t.abs().sum() for t in e)) == 1
    u = random_direction(shapes, seed=5)
    assert flat_dot(u, u) == pytest.approx(1.0, abs=1e-6)
    assert torch.equal(u[0], random_direction(shapes, seed=5)[0])
    assert quiet_coordinate([torch.tensor([[0.3, -0.001], [2.0, 1.0]]), torch.tensor([0.5])]) == 1
    image, label = input_canary((1, 8, 8), 10, seed=3)
    again, same = input_canary((1, 8, 8), 10, seed=3)
    assert torch.equal(image, again) and label == same and 0 <= image.min() <= image.max() <= 1
    with pytest.raises(ValueError, match="Dirac coordinate"):
        dirac(shapes, 17)
