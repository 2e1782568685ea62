"""Tests of the declared mechanism over every part of it.

The noise ratio per parameter group (``gaussian-scores``), the noise level per group
(``noise-level``) and the sampling (``sampling``).

Both read the victim's :class:`~fedleak.auditing.estimators.noise_ratio.StreamTable` — the released
updates projected on many public canaries, each with its own secret coin, covering every
parameter tensor and the claimed clip geometry — never the server's scores.

- ``gaussian-scores``: one noise-ratio test (:mod:`fedleak.auditing.estimators.noise_ratio`) per
  group of streams — each parameter tensor's canaries, the spread canaries that cross every tensor
  (a total-norm clip), and all tensors pooled (a shortfall everywhere) — so noise missing from
  one tensor or a clip of the wrong geometry is found without aiming a canary at it. Each test
  states its power: the noise shortfall it would have caught.
- ``noise-level``: the χ² test of :mod:`fedleak.auditing.estimators.noise_level` per tensor and
  pooled — whether the declared noise is there, on every coordinate away from the canaries; a few
  trials catch a few per cent of missing noise;
- ``interference``: per example, each canary is clipped on its own and the step sums them, so
  one canary's stream cannot depend on how many others joined the trial; an implementation
  that clips the batch's sum instead of each example (or divides by the batch's actual size)
  makes every stream shrink as more canaries join. The statistic is the score test of a
  common rescaling: the self-normalised covariance Z = Σ_t S_t (N_t − N̄) / √(Σ_t S_t² (N_t −
  N̄)²) between S_t = Σ_k m_k (y_tk − m_k) — each stream's residual weighted by its cell's
  level m_k, since a rescaling moves a stream in proportion to its level — and the trial's
  count of canaries N_t; ≈ N(0, 1) under the declaration (two-sided);
- ``sampling``: under declared Poisson sampling the canary joins a Binomial number of steps,
  so its in-trials spread more than its out-trials by Var(N)·h²; an implementation that
  shuffles or fixes its batches while its accountant assumes Poisson (Chua et al. 2024)
  includes the canary too regularly, and the excess spread is missing. The test compares the
  observed excess with the declared one (scaled by the measured shift), using the samples'
  fourth moments (no Gaussian assumption).
"""

from __future__ import annotations

import math

import numpy as np

from fedleak.auditing.estimator_registry import (
    Estimator,
    Findings,
    Game,
    NoOptions,
    register_estimator,
)
from fedleak.auditing.estimators.noise_level import noise_test
from fedleak.auditing.estimators.noise_ratio import RatioTest, cells, ratio_test
from fedleak.auditing.result import (
    GAUSSIAN_SCORES,
    INTERFERENCE,
    NOISE_LEVEL,
    SAMPLING,
    AuditBound,
    DeclarationTest,
    format_epsilon,
)

#: the group of the spread canaries (one coordinate in every tensor, total-norm clipped)
SPREAD = "spread (all tensors)"
#: the test pooling every tensor's canaries
POOLED = "all tensors pooled"


def stream_groups(game: Game) -> list[tuple[str, np.ndarray]]:
    """(test name, member streams) of the noise-ratio tests of ``game``."""
    table = game.streams
    if table is None:
        return []
    names = list(dict.fromkeys(table.groups))
    groups = [(g, np.flatnonzero(np.array(table.groups) == g)) for g in names]
    tensors = [g for g in names if g != SPREAD]
    if len(tensors) > 1:
        pooled = np.flatnonzero(np.isin(np.array(table.groups), tensors))
        groups.insert(0, (POOLED, pooled))
    return groups


@register_estimator(GAUSSIAN_SCORES)
class GaussianScores(Estimator):
    """Noise-ratio tests per parameter group (module docstring)."""

    Config = NoOptions

    def tests(self, game: Game) -> int:
        """Return one test per parameter group with streams, none without a claim."""
        return len(stream_groups(game)) if game.claims else 0

    def run(self, game: Game, level: float) -> Findings:
        """Run the noise-ratio test of each parameter group (module docstring)."""
        table, claim = game.streams, game.claim
        if table is None or claim is None or not game.claims:
            return Findings()
        found = Findings()
        s = game.settings
        for group, members in stream_groups(game):
            test = ratio_test(table, group, members, level, game.power)
            if test is None:
                continue
            epsilon_lb = claim.epsilon_at(test.ratio_lower)
            found.tests.append(DeclarationTest(
                GAUSSIAN_SCORES, group, test.p_value, False, _ratio_statement(group, test),
                test.samples_in, test.samples_out, test.ratio, test.ratio_lower,
                test.detectable_noise, game.power, epsilon_lb, level))
            found.bounds.append(AuditBound(
                GAUSSIAN_SCORES, epsilon_lb, False, confidence=1 - level,
                trials_in=test.samples_in, trials_out=test.samples_out, delta=s.delta,
                canary=s.canary, threat_model=s.threat_model,
                threshold_rule="none: the canaries' mean shift over the noise's spread",
                mu=claim.mu * test.ratio_lower if claim.mu is not None else None,
                group=group, note="assumes the declared family (Gaussian noise): ε of the "
                                  "declared mechanism with its noise divided by the ratio's "
                                  "lower bound"))
        return found


def _ratio_statement(group: str, test: RatioTest) -> str:
    """Return what one noise-ratio test found, in words; a spread of zero is named as such."""
    if math.isinf(test.ratio):
        return (f"{group}: the noise did not change across trials (the released values "
                f"without the canary varied by no more than float rounding: a fixed seed, "
                f"noise reused, or none) — the canaries are told apart exactly, ε_LB = ∞")
    return (f"{group}: the canaries are told apart {_ratio(test.ratio)}× as well as declared "
            f"(at least {_ratio(test.ratio_lower)}×), as if the noise were "
            f"{_ratio(1 / test.ratio)}× the declared std")


def _ratio(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.3g}"


def _inverse(value: float) -> float:
    """1/f as the equivalent ratio r (∞ for no noise at all)."""
    return math.inf if value <= 0 else 1 / value


def noise_groups(game: Game) -> list[tuple[str, list[str]]]:
    """(test name, member groups) of the noise-level tests of ``game``."""
    table = game.streams
    if table is None or table.noise is None:
        return []
    names = list(table.noise.groups)
    out = [(g, [g]) for g in names]
    if len(names) > 1:
        out.insert(0, (POOLED, names))
    return out


@register_estimator(NOISE_LEVEL)
class NoiseLevel(Estimator):
    """χ² tests of the declared noise per tensor and pooled (module docstring)."""

    Config = NoOptions

    def tests(self, game: Game) -> int:
        """Return one χ² test per noise group, plus the shape test when it applies."""
        return len(noise_groups(game)) + self.shape(game) if game.claims else 0

    @staticmethod
    def shape(game: Game) -> int:
        """1 when the noise's shape is tested too (an exact model, enough samples)."""
        table = game.streams
        return int(table is not None and table.exact and table.noise is not None
                   and table.noise.kurtosis() is not None)

    def run(self, game: Game, level: float) -> Findings:
        """Run the χ² tests of the declared noise, and the kurtosis test of its shape."""
        from scipy.stats import norm

        table = game.streams
        if table is None or table.noise is None or not game.claims:
            return Findings()
        found = Findings()
        kurtosis = table.noise.kurtosis() if self.shape(game) else None
        if kurtosis is not None:
            b2, se = kurtosis
            p_value = float(2 * norm.sf(abs(b2 - 3) / se))
            found.tests.append(DeclarationTest(
                NOISE_LEVEL, "shape (kurtosis)", p_value, False,
                f"the noise's kurtosis is {b2:.3g} (Gaussian: 3 ± {se:.2g}); noise of another "
                "law than the declared Gaussian", samples_out=int(table.noise.coordinate_dof),
                level=level))
        for name, members in noise_groups(game):
            dof, squares = table.noise.pooled(members)
            test = noise_test(name, dof, squares, level, game.power)
            if test is None:
                continue
            found.tests.append(DeclarationTest(
                NOISE_LEVEL, name, test.p_value, False,
                f"{name}: the noise is {test.factor:.3g}× the declared std (at most "
                f"{test.factor_upper:.3g}×, {int(test.dof)} degrees of freedom)",
                samples_out=int(test.dof), detectable_noise=test.detectable_noise,
                power=game.power, level=level, ratio=_inverse(test.factor),
                ratio_lower=_inverse(test.factor_upper)))
        return found


@register_estimator(SAMPLING)
class SamplingCheck(Estimator):
    """Whether the canary's inclusion varies as declared Poisson sampling makes it."""

    Config = NoOptions

    def applies(self, game: Game) -> bool:
        """Tell whether the claim declares sampling whose inclusion varies (shift variance > 0)."""
        return game.claims and game.streams is not None and \
            bool((game.streams.shift_variance > 0).any())

    def tests(self, game: Game) -> int:
        """Return one test when the check applies, else none."""
        return 1 if self.applies(game) else 0

    def run(self, game: Game, level: float) -> Findings:
        """Test the canary's inclusion against the declared Poisson sampling."""
        from scipy.stats import norm

        table = game.streams
        if table is None or not self.applies(game):
            return Findings()
        members = np.flatnonzero(table.shift_variance > 0)
        c = cells(table, members)
        if c is None:
            return Findings()
        w = c.weights
        p = float((w * c.rho).sum())
        scale = float((w * c.mean_difference).sum()) / p  # the measured signal over the declared
        declared = float((c.n1 * c.rho_variance).sum() / c.n1.sum())
        expected = scale * scale * declared
        var_scale = float((w ** 2 * (c.var_in / c.n1 + c.out_variance / c.n0)).sum()) / p ** 2
        se = math.sqrt(c.in_excess_se ** 2 + (2 * scale * declared) ** 2 * var_scale)
        z = (c.in_excess - expected) / se if se > 0 else (0.0 if c.in_excess >= expected
                                                          else -math.inf)
        p_value = float(norm.cdf(z))
        n1, n0 = c.samples
        statement = (f"the canaries' in-trials spread {format_epsilon(c.in_excess)} (noise "
                     f"variances) more than their out-trials; Poisson sampling as declared "
                     f"makes it {format_epsilon(expected)}")
        return Findings(tests=[DeclarationTest(SAMPLING, "sampling", p_value, False, statement,
                                               n1, n0, level=level)])


@register_estimator(INTERFERENCE)
class Interference(Estimator):
    """Whether one canary's stream depends on how many others joined (module docstring)."""

    Config = NoOptions

    def applies(self, game: Game) -> bool:
        """Tell whether independent streams of more than two canaries were measured."""
        table = game.streams
        return game.claims and table is not None and table.independent and \
            table.values.shape[1] > 2

    def tests(self, game: Game) -> int:
        """Return one test when the check applies, else none."""
        return 1 if self.applies(game) else 0

    def run(self, game: Game, level: float) -> Findings:
        """Test whether one canary's stream depends on how many others joined."""
        from scipy.stats import norm

        table = game.streams
        if table is None or not self.applies(game):
            return Findings()
        strata = table.strata if table.strata is not None else np.zeros(len(table.values))
        weighted = np.zeros_like(table.values)
        for k in range(table.values.shape[1]):
            y = table.values[:, k] / table.declared_std[k]
            for coin in (True, False):
                for h in np.unique(strata):
                    rows = (table.coins[:, k] == coin) & (strata == h)
                    if rows.any():
                        level = y[rows].mean()
                        weighted[rows, k] = level * (y[rows] - level)
        joined = table.coins.sum(axis=1).astype(float)
        centred = joined - joined.mean()
        summed = weighted.sum(axis=1)
        denominator = math.sqrt(float(((summed * centred) ** 2).sum()))
        z = float((summed * centred).sum()) / denominator if denominator > 0 else 0.0
        p_value = float(2 * norm.sf(abs(z)))
        statement = (f"one canary's stream moves with the number of canaries in its trial "
                     f"(z = {z:.3g}); each clipped on its own, as declared, they would not "
                     "interact")
        return Findings(tests=[DeclarationTest(INTERFERENCE, "all canaries", p_value, False,
                                               statement, int(table.values.size), 0,
                                               level=level)])
