"""The tests of what composition and the Gaussian mechanism assume, on simulated releases:
noise fresh in every release (lag correlations), independent across coordinates, and not
depending on the data (the canary-free phase); and the headline that names them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedleak.auditing.estimators.fresh_noise import lag_test
from fedleak.auditing.estimators.noise_correlation import ACROSS, correlation_tests
from fedleak.auditing.estimators.releases import Releases
from fedleak.auditing.result import (
    CORRELATED_NOISE,
    FRESH_NOISE,
    NOISE_LEVEL,
    DeclarationTest,
)
from fedleak.auditing.verdict import Evaluation, verdict_text


def _releases(noise: np.ndarray, cells: np.ndarray | None = None,
              groups: int = 2) -> Releases:
    t, m = noise.shape
    cells = np.zeros(t, np.int64) if cells is None else cells
    means = np.random.default_rng(0).normal(0, 5, (int(cells.max()) + 1, m))
    column_groups = np.arange(m) % groups
    return Releases(noise + means[cells], cells, column_groups,
                    tuple(f"t{g}" for g in range(groups)), 1.0, np.arange(m) // groups)


def test_fresh_noise_keeps_its_level_with_cells_of_unequal_means() -> None:
    rng = np.random.default_rng(1)
    rejected = 0
    for _ in range(60):
        cells = (rng.random(160) < 0.5).astype(np.int64)  # a coin that moves the mean
        test = lag_test(_releases(rng.normal(0, 1, (160, 64)), cells), None, "all", 0.05,
                        0.99)
        assert test is not None and test.identical == 0
        rejected += test.p_value <= 0.05
    assert rejected <= 9  # 3 expected at a 5 % level (Bonferroni over lags: fewer)


@pytest.mark.parametrize("period", [2, 5])
def test_noise_reused_across_releases_is_found_at_its_lag(period: int) -> None:
    rng = np.random.default_rng(2)
    fresh = rng.normal(0, 1, (200, 64))
    if period == 2:  # redrawn every second call
        noise = fresh[np.arange(200) // 2 * 2]
        lag = 1
    else:  # a seed cycle
        noise = fresh[np.arange(200) % period]
        lag = period
    test = lag_test(_releases(noise), None, "all", 1e-6, 0.99)
    assert test is not None and test.p_value == 0 and test.lag == lag and test.identical > 0


def test_a_small_lag_correlation_is_found_without_identical_releases() -> None:
    rng = np.random.default_rng(3)
    shared = rng.normal(0, 1, (201, 64))
    noise = 0.8 * rng.normal(0, 1, (200, 64)) + 0.6 * shared[1:]  # fresh in every release
    # a third of each release's noise variance shared with the next release's (ρ ≈ 0.18)
    mixed = 0.8 * rng.normal(0, 1, (200, 64)) + 0.6 * (shared[1:] + shared[:-1]) / math.sqrt(2)
    test = lag_test(_releases(mixed), None, "all", 1e-4, 0.99)
    assert test is not None and test.p_value < 1e-4 and test.identical == 0 and test.lag == 1
    assert lag_test(_releases(noise), None, "all", 1e-4, 0.99).p_value > 1e-4  # type: ignore


def test_independent_coordinates_keep_the_correlation_tests_level() -> None:
    rng = np.random.default_rng(4)
    p_values = []
    for _ in range(40):
        for test in correlation_tests(_releases(rng.normal(0, 1, (60, 96)), groups=3), 0.05,
                                      0.99):
            p_values.append(test.p_value)
    assert len(p_values) == 40 * 4  # three tensors and across them
    assert np.mean(np.array(p_values) <= 0.05) < 0.12


def test_one_draw_per_tensor_and_noise_copied_across_tensors_are_correlated_noise() -> None:
    rng = np.random.default_rng(5)
    scalar = np.repeat(rng.normal(0, 1, (80, 1)), 64, axis=1)  # one draw for every coordinate
    found = {t.group: t for t in correlation_tests(_releases(scalar, groups=1), 1e-6, 0.99)}
    assert found["t0"].p_value == 0 and found["t0"].cancelling > 0
    copied = rng.normal(0, 1, (80, 64))
    copied[:, 1::2] = copied[:, 0::2]  # tensor 1's noise is tensor 0's
    found = {t.group: t for t in correlation_tests(_releases(copied), 1e-6, 0.99)}
    assert found[ACROSS].p_value < 1e-6 and found["t0"].p_value > 1e-6


def _test(test: str, group: str, p: float, statement: str, **kw: object) -> DeclarationTest:
    return DeclarationTest(test, group, p, True, statement, **kw)  # type: ignore[arg-type]


def test_the_headline_names_the_most_specific_and_the_most_severe_finding() -> None:
    kurtosis = _test(NOISE_LEVEL, "shape (kurtosis)", 1e-30, "KURTOSIS")
    tensor = _test(NOISE_LEVEL, "b1", 1e-8, "ONE TENSOR", ratio=1 / 0.94)
    pooled = _test(NOISE_LEVEL, "all tensors pooled", 1e-9, "POOLED", ratio=3.12)
    bias = _test(NOISE_LEVEL, "b2", 1e-6, "BIAS", ratio=10.0)
    text = verdict_text(Evaluation([], [kurtosis, tensor], True, 1e-4, 1e-5), 4.0, 1e-5, 0.99)
    assert text.startswith("VIOLATION: ONE TENSOR")
    text = verdict_text(Evaluation([], [pooled, bias], True, 1e-4, 1e-5), 4.0, 1e-5, 0.99)
    assert text.startswith("VIOLATION: BIAS")
    correlated = _test(CORRELATED_NOISE, "t0", 0.0, "CORRELATED", epsilon_lb=math.inf)
    text = verdict_text(Evaluation([], [kurtosis, pooled, correlated], True, 1e-4, 1e-5), 4.0,
                        1e-5, 0.99)
    assert text.startswith("VIOLATION: CORRELATED") and "most severe" not in text
    reused = _test(FRESH_NOISE, "all tensors pooled", 1e-9, "REUSED", samples_out=300)
    text = verdict_text(Evaluation([], [reused, correlated], True, 1e-4, 1e-5), 4.0, 1e-5,
                        0.99)
    assert text.startswith("VIOLATION: REUSED") and "most severe: CORRELATED" in text
    assert "a run of 300 consecutive releases" in text
