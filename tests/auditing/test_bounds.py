"""The auditing room's bounds, in-process: reconstruction robustness, Fisher ceilings, κ, intervals,
and the prior-aware attack measured against the bound it must respect."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedleak.attacks.prior_aware import InformedObservation, PriorAwareAttack
from fedleak.auditing.game_statistics import success_rate
from fedleak.auditing.reconstruction.bounds import (
    BoundError,
    gaussian_bound,
    gaussian_mu,
    reconstruction_bound,
    subsampled_gaussian_bound,
)
from fedleak.auditing.reconstruction.fisher_information import (
    FisherCeiling,
    gaussian_step_information,
    jacobian_norm_squared,
)
from fedleak.auditing.reconstruction.prior_baseline import prior_baseline

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize(("kappa", "sigma", "steps", "expected"),
                         [(0.125, 10.0, 100, 0.440), (0.01, 1.0, 1, 0.092)])
def test_closed_form_matches_monte_carlo_at_full_batch(kappa: float, sigma: float, steps: int,
                                                       expected: float) -> None:
    """μ = √T/σ: Φ(Φ⁻¹(κ) + μ) is the issue's figure, and the Monte Carlo estimator of the
    Poisson case, run at q = 1, finds it within 0.01."""
    closed = gaussian_bound(kappa, sigma, steps)
    assert closed == pytest.approx(expected, abs=5e-4)
    estimate = subsampled_gaussian_bound(kappa, sigma, 1.0, steps, samples=100_000, seed=1)
    assert abs(estimate.value - closed) < 0.01
    assert 0 < estimate.standard_error < 0.005


def test_subsampling_lowers_the_bound_and_replace_one_raises_it() -> None:
    full = gaussian_bound(0.1, 1.0, 16)
    poisson = reconstruction_bound(0.1, 1.0, 0.1, 16, samples=40_000)
    assert poisson.method == "monte-carlo" and poisson.value < full - 0.1
    assert gaussian_mu(2.0, 4, "replace-one") == 2 * gaussian_mu(2.0, 4) == 2.0
    assert gaussian_bound(0.1, 2.0, 4, "replace-one") > gaussian_bound(0.1, 2.0, 4)
    assert reconstruction_bound(0.1, 0.0).value == 1.0  # no noise, no ceiling
    assert 0.1 < gaussian_bound(0.1, 1e6) < 0.1001     # all noise: the blind guess


@pytest.mark.parametrize(("call", "match"), [
    (lambda: gaussian_bound(1.0, 1.0), "κ"),
    (lambda: gaussian_bound(0.1, -1.0), "noise multiplier"),
    (lambda: gaussian_bound(0.1, 1.0, 0), "steps"),
    (lambda: gaussian_bound(0.1, 1.0, 1, "swap"), "adjacency"),
    (lambda: reconstruction_bound(0.1, 1.0, 0.5, 1, "replace-one"), "add/remove"),
    (lambda: reconstruction_bound(0.1, 1.0, 1.5), "sample rate"),
])
def test_bad_arguments_say_what_to_change(call, match: str) -> None:
    with pytest.raises(BoundError, match=match):
        call()


def test_clopper_pearson_interval() -> None:
    rate = success_rate(3, 10)
    assert rate.rate == 0.3
    assert (rate.low, rate.high) == pytest.approx((0.0667, 0.6525), abs=1e-4)
    assert success_rate(0, 20).low == 0.0 and success_rate(20, 20).high == 1.0


def test_prior_baseline_counts_the_best_fixed_guess() -> None:
    similarity = np.array([[100.0, 30.0, 10.0, 10.0],
                           [30.0, 100.0, 25.0, 10.0],
                           [10.0, 10.0, 10.0, 10.0]])
    baseline = prior_baseline(similarity, 20.0)
    assert baseline.kappa == 0.75 and baseline.upper > 0.75 and baseline.prior_size == 4


def test_jacobian_norm_is_the_frobenius_norm_of_a_linear_map() -> None:
    a = torch.randn(7, 12, generator=torch.Generator().manual_seed(0))
    x = torch.rand(3, 2, 2)
    value = jacobian_norm_squared(lambda v: a @ v.reshape(-1), x, chunk=5)
    assert value == pytest.approx(float(a.square().sum()), rel=1e-5)
    # noise s and sample rate q: Tr I = q ‖J‖² / s²; the ceiling falls as the noise grows
    quiet = FisherCeiling(gaussian_step_information(lambda v: a @ v.reshape(-1), x, 0.1), 12)
    loud = FisherCeiling(gaussian_step_information(lambda v: a @ v.reshape(-1), x, 1.0, 0.5), 12)
    assert quiet.trace == pytest.approx(200 * loud.trace, rel=1e-5)
    assert quiet.psnr_ceiling == pytest.approx(loud.psnr_ceiling + 10 * math.log10(200), rel=1e-6)
    assert FisherCeiling(gaussian_step_information(lambda v: v, x, 0.0), 12).psnr_ceiling \
        == math.inf


def test_prior_aware_attack_stays_under_the_bound_on_orthogonal_candidates() -> None:
    """One Gaussian step, ten orthogonal unit-norm candidate 'gradients' (the issue's
    simulation): seeded, the attack's success never exceeds Φ(Φ⁻¹(κ) + 1/σ) beyond its interval,
    and it reaches a good part of it."""
    torch.manual_seed(0)
    n, trials = 10, 300
    basis = torch.eye(n)

    def simulate(images: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        return [basis[labels[-1]]]

    for sigma in (0.5, 1.0):
        wins = 0
        for _ in range(trials):
            target = int(torch.randint(n, (1,)))
            observed = basis[target] + sigma * torch.randn(n)
            guess = PriorAwareAttack().guess(InformedObservation(
                [observed], torch.zeros(n, 1, 1, 1), torch.arange(n), torch.zeros(0, 1, 1, 1),
                torch.zeros(0, dtype=torch.long), simulate))
            wins += guess.candidate == target
        rate = success_rate(wins, trials)
        bound = gaussian_bound(1 / n, sigma)
        assert rate.low <= bound
        assert rate.rate >= 0.4 * bound
