"""The declaration tests: their false-alarm rate and power by simulation, the multiplicity
correction, the Poisson mixture's curve, the one-shot estimate's honesty, the registry, and
in-process victims whose broken plug-ins the default audit catches while correct mechanisms
pass.

Simulations draw from seeded generators and check rates with margins several binomial
standard deviations wide, so they cannot flake and would fail if the statistic drifted by a
few per cent of its level."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from scipy.stats import norm

from fedleak.auditing import (
    GameSettings,
    StreamTable,
    evaluate,
    verdict_text,
)
from fedleak.auditing.estimator_registry import (
    ESTIMATOR_REGISTRY,
    Estimator,
    Findings,
    Game,
    NoOptions,
    register_estimator,
)
from fedleak.auditing.estimators.gaussian_dp import epsilon_from_mu, mu_lower_bound
from fedleak.auditing.estimators.noise_level import NoiseLevels, detectable_factor, noise_test
from fedleak.auditing.estimators.noise_ratio import cells, detectable_ratio, ratio_test
from fedleak.auditing.estimators.primary import one_shot_interval
from fedleak.auditing.estimators.subsampled_gaussian import mu_lower_bound_subsampled, tradeoff
from fedleak.auditing.result import DeclarationTest
from fedleak.auditing.verdict import holm
from tests.paths import REPO

ROOT = REPO


def _table(rng: np.random.Generator, trials: int, streams: int, rho: float, ratio: float = 1.0,
           q: float | None = None, always: bool = False) -> StreamTable:
    """Streams of a Gaussian mechanism whose canary shift is ρ (in noise units) as declared,
    told apart ``ratio`` times better; with ``q`` the canary joins with probability q
    (Poisson) — or always, when ``always`` (shuffled batches declared as Poisson)."""
    coins = rng.random((trials, streams)) < 0.5
    offsets = rng.normal(size=streams) * 5
    noise = rng.normal(size=(trials, streams)) / ratio
    if q is None:
        shift = coins * rho
        variance = np.zeros(streams)
    else:
        joined = np.ones((trials, streams)) if always else rng.random((trials, streams)) < q
        shift = coins * joined * rho / q
        variance = np.full(streams, (rho / q) ** 2 * q * (1 - q))
    return StreamTable(offsets + shift + noise, coins, ("g",) * streams,
                       np.full(streams, rho), np.ones(streams), variance)


def test_the_noise_ratio_test_keeps_its_level_and_has_its_stated_power() -> None:
    rng = np.random.default_rng(11)
    alpha, runs = 0.02, 1500
    members = np.arange(8)
    rejected = sum(ratio_test(_table(rng, 120, 8, 1.0), "g", members, alpha, 0.9).p_value
                   <= alpha for _ in range(runs))
    assert rejected / runs < alpha + 4 * math.sqrt(alpha / runs)  # level kept
    probe = cells(_table(rng, 120, 8, 1.0), members)
    assert probe is not None
    r90 = detectable_ratio(probe, alpha, 0.9)
    assert 1.05 < r90 < 1.5
    caught = sum(ratio_test(_table(rng, 120, 8, 1.0, ratio=r90), "g", members, alpha,
                            0.9).p_value <= alpha for _ in range(400))
    assert 0.82 < caught / 400 < 0.97  # the stated power, within simulation error


def test_a_mixture_is_tested_with_its_own_variance() -> None:
    """Poisson sampling: the in-trials are a mixture; the test keeps its level on it."""
    rng = np.random.default_rng(5)
    rejected = sum(ratio_test(_table(rng, 160, 8, 1.0, q=0.5), "g", np.arange(8), 0.02,
                              0.9).p_value <= 0.02 for _ in range(800))
    assert rejected / 800 < 0.02 + 4 * math.sqrt(0.02 / 800)


def test_the_noise_level_test_is_an_exact_chi_square() -> None:
    rng = np.random.default_rng(3)
    alpha, hits, shortfall = 0.01, 0, 0
    f = detectable_factor(2000, alpha, 0.9)
    for _ in range(2000):
        squares = float((rng.normal(size=2000) ** 2).sum())
        hits += noise_test("g", 2000, squares, alpha, 0.9).p_value <= alpha  # type: ignore
        short = float(((f * rng.normal(size=2000)) ** 2).sum())
        shortfall += noise_test("g", 2000, short, alpha, 0.9).p_value <= alpha  # type: ignore
    assert hits / 2000 < alpha + 4 * math.sqrt(alpha / 2000)
    assert abs(shortfall / 2000 - 0.9) < 0.04
    assert 0.9 < f < 1.0


def test_an_exact_model_is_tested_on_both_sides() -> None:
    """Canaries told apart half as well as declared: a departure where the model is exact."""
    import dataclasses

    rng = np.random.default_rng(6)
    weak = _table(rng, 200, 8, 1.0, ratio=1.0)
    weak = dataclasses.replace(weak, values=weak.values - weak.coins * 0.5)  # half the shift
    one_sided = ratio_test(weak, "g", np.arange(8), 1e-4, 0.9)
    two_sided = ratio_test(dataclasses.replace(weak, exact=True), "g", np.arange(8), 1e-4, 0.9)
    assert one_sided is not None and two_sided is not None
    assert one_sided.p_value > 0.5 and two_sided.p_value < 1e-6


def test_a_small_shift_keeps_the_level_in_the_lower_tail_too() -> None:
    """One weak stream (the shift a third of the noise): r̂ is normal, not log-normal, so a
    test of ln r̂ would reject the lower side about six times too often (found as 2 false
    alarms in 100 secure-aggregation audits); Fieller's keeps both tails and the bound's
    coverage."""
    import dataclasses

    rng = np.random.default_rng(12)
    alpha, runs, low, covered = 2e-3, 1500, 0, 0
    for _ in range(runs):
        table = dataclasses.replace(_table(rng, 1000, 1, 0.35), exact=True)
        test = ratio_test(table, "g", np.arange(1), alpha, 0.9)
        assert test is not None
        low += test.p_value <= alpha and test.ratio < 1
        covered += test.ratio_lower <= 1
    expected = runs * alpha / 2
    assert low <= expected + 4 * math.sqrt(expected) + 1
    assert covered / runs >= 1 - alpha - 4 * math.sqrt(alpha / runs)


def test_the_noise_shape_is_gaussian_or_not() -> None:
    rng = np.random.default_rng(7)

    def kurtosis(noise: np.ndarray) -> float:
        residuals = noise - noise.mean(axis=0)  # 200 trials × 300 coordinates
        levels = NoiseLevels(("g",), np.array([residuals.size - 300.0]),
                             np.array([float((residuals ** 2).sum())]),
                             coordinate_dof=residuals.size - 300.0,
                             coordinate_squares=float((residuals ** 2).sum()),
                             coordinate_fourth=float((residuals ** 4).sum()),
                             coordinate_count=float(residuals.size))
        found = levels.kurtosis()
        assert found is not None
        return (found[0] - 3) / found[1]

    assert abs(kurtosis(rng.normal(size=(200, 300)))) < 4
    assert kurtosis((rng.random((200, 300)) - 0.5) * math.sqrt(12)) < -50  # uniform: 1.8


def test_canaries_that_interact_are_found() -> None:
    """A batch's sum scaled by the number of canaries in it (a batch clipped as a whole)."""
    import dataclasses

    from fedleak.auditing.estimators.declared_mechanism import Interference

    rng = np.random.default_rng(9)
    table = dataclasses.replace(_table(rng, 300, 40, 1.0), independent=True)
    settings = GameSettings(1e-5, 0.95, "", "")

    def p_value(t: StreamTable) -> float:
        game = Game(np.zeros(4), np.array([1, 0, 1, 0], bool), np.zeros(4, bool), settings,
                    claim=_Claim(), streams=t)
        return Interference().run(game, 1e-3).tests[0].p_value

    assert p_value(table) > 1e-3
    scale = 20 / table.coins.sum(axis=1, keepdims=True)
    assert p_value(dataclasses.replace(table, values=table.values * scale)) < 1e-6


def test_holm_rejects_step_down() -> None:
    assert holm([0.001, 0.04, 0.012, 0.5], 0.05) == [True, False, True, False]
    assert holm([0.03, 0.04], 0.05) == [False, False]  # 0.03 > 0.05 / 2
    assert holm([0.02, 0.03], 0.05) == [True, True]


def test_the_mixture_curve_is_the_gaussian_at_q_1_and_bounds_subsampled_mechanisms() -> None:
    alpha = np.array([1e-4, 0.01, 0.3, 0.7])
    assert np.allclose(tradeoff(1.5, 1.0, alpha), norm.cdf(norm.isf(alpha) - 1.5), atol=2e-3)
    assert mu_lower_bound_subsampled(300, 1000, 300, 1000, 0.05, 1.0) == \
        pytest.approx(mu_lower_bound(300, 1000, 300, 1000, 0.05), abs=1e-3)
    rng = np.random.default_rng(0)
    over = 0
    for _ in range(40):  # q = 0.5, μ = 1: the bound stays at or below μ
        coins = rng.random(2000) < 0.5
        joined = rng.random(2000) < 0.5
        scores = rng.normal(size=2000) + coins * joined * 1.0
        fp, n0 = int((scores[~coins] >= 1.5).sum()), int((~coins).sum())
        fn, n1 = int((scores[coins] < 1.5).sum()), int(coins.sum())
        over += mu_lower_bound_subsampled(fp, n0, fn, n1, 0.05, 0.5) > 1.0
    assert over <= 4


def test_the_sampling_check_finds_shuffled_batches_declared_poisson() -> None:
    from fedleak.auditing.estimators.declared_mechanism import SamplingCheck

    rng = np.random.default_rng(8)

    def p_value(always: bool) -> float:
        table = _table(rng, 300, 16, 1.0, q=0.5, always=always)
        game = Game(np.zeros(4), np.array([1, 0, 1, 0], bool), np.zeros(4, bool),
                    GameSettings(1e-5, 0.95, "", ""), claim=_Claim(), streams=table)
        return SamplingCheck().run(game, 1e-3).tests[0].p_value

    assert p_value(always=True) < 1e-6
    assert p_value(always=False) > 1e-3


@dataclass(frozen=True)
class _Claim:
    epsilon: float = 4.38
    delta: float = 1e-5
    mu: float | None = 1.0
    sigma: float | None = None
    sample_rate: float | None = None
    steps: int = 1

    def epsilon_at(self, ratio: float) -> float:
        return epsilon_from_mu(ratio, self.delta)


def test_the_one_shot_estimate_is_bias_corrected_and_carries_an_interval() -> None:
    rng = np.random.default_rng(2)
    truth = epsilon_from_mu(1.0, 1e-5)
    estimates, covered = [], 0
    for _ in range(40):
        coins = rng.random(1000) < 0.5
        found = one_shot_interval(rng.normal(size=1000) + coins, coins, 1e-5, 0.95)
        assert found is not None
        estimate, low, high = found
        assert low <= estimate <= high
        estimates.append(estimate)
        covered += low <= truth <= high
    assert abs(np.mean(estimates) / truth - 1) < 0.05  # not pushed up by the fit
    assert covered >= 34


def test_a_new_estimator_is_one_registered_class() -> None:
    @register_estimator("always-half")
    class AlwaysHalf(Estimator):
        Config = NoOptions

        def tests(self, game: Game) -> int:
            return 1

        def run(self, game: Game, level: float) -> Findings:
            return Findings(tests=[DeclarationTest("always-half", "", 0.5, False, "half")])

    try:
        coins = np.arange(40) % 2 == 0
        game = Game(coins.astype(float), coins, np.zeros(40, bool),
                    GameSettings(1e-5, 0.95, "", ""), 0.5, claim=_Claim())
        evaluation = evaluate(game)
        assert any(t.test == "always-half" for t in evaluation.tests)
        assert evaluation.level == pytest.approx(1e-4 / 4)  # 3 primary bounds + this one
    finally:
        ESTIMATOR_REGISTRY._classes.pop("always-half")


def test_noise_levels_pool_groups() -> None:
    levels = NoiseLevels(("a", "b"), np.array([10.0, 30.0]), np.array([12.0, 27.0]))
    assert levels.pooled(["a", "b"]) == (40.0, 39.0)


def test_a_verdict_without_violation_states_its_power() -> None:
    rng = np.random.default_rng(4)
    table = _table(rng, 300, 8, 1.0)
    coins = table.coins[:, 0]
    game = Game(table.values[:, 0], coins, np.zeros(300, bool),
                GameSettings(1e-5, 0.95, "c", "t"), 0.5, claim=_Claim(), streams=table)
    evaluation = evaluate(game)
    text = verdict_text(evaluation, 4.38, 1e-5, 0.99)
    assert not evaluation.violation
    assert "would have caught" in text and "better than declared" in text


# -- in-process victims ---------------------------------------------------------------------

PLUGINS = [ROOT / "examples" / "broken_defenses", ROOT / "tests" / "test_plugin_package"]


@pytest.fixture(scope="module")
def plugin_path() -> Iterator[None]:
    from tests.defenses.test_mechanism_contract import installed

    yield from installed(PLUGINS)


def _audit(defense: str, *, trials: int = 0, protocol: object = None, seed: int = 1,
           **request: object) -> tuple[object, object]:
    """One default audit of a fresh in-process victim (8 digits, mlp:width=16)."""
    from fedleak.harness.federated.protocol import Protocol
    from fedleak.harness.victim.audit.request import AuditRequest
    from fedleak.harness.victim.limits import VictimLimits
    from fedleak.harness.victim.settings import VictimSettings, create_victim

    settings = VictimSettings(dataset="digits", model="mlp:width=16", split="all",
                              images="0-7", batch_size=8, defenses=(defense,),
                              defense_seed=seed, audit=True,
                              protocol=protocol or Protocol(),  # type: ignore[arg-type]
                              limits=VictimLimits(max_audit_trials=5000))
    victim = create_victim(settings)
    params, buffers = victim.global_model()
    session = victim.begin_audit(params, buffers, None,
                                 AuditRequest(trials=trials, **request))  # type: ignore
    unit = torch.cat([u.flatten().double() for u in session.canary.unit])
    scores: list[float] = []
    while session.left:
        done, _, _ = victim.run_audit_trials(session.audit_id, 256)
        for _, update in done:
            flat = torch.cat([u.flatten().double() for u in update])
            scores.append(session.canary.score_sign * float(flat @ unit))
    return session, victim.submit_audit_scores(session.audit_id, scores)


@pytest.mark.parametrize("bug", ["dp-noise-weights-only", "dp-short-noise",
                                 "dp-clip-per-tensor", "dp-clip-the-batch",
                                 "dp-uniform-noise"])
def test_the_default_audit_catches_broken_per_example_plugins(plugin_path: None,
                                                              bug: str) -> None:
    _, outcome = _audit(bug)
    assert outcome.violation, outcome.verdict  # type: ignore[attr-defined]
    assert outcome.verdict.startswith("VIOLATION")  # type: ignore[attr-defined]


@pytest.mark.parametrize(("bug", "trials", "named"), [
    ("dp-fixed-seed", 0, "the noise is not fresh across releases"),
    ("dp-noise-every-second-call", 0, "pairs of releases 1 apart it was identical"),
    ("noise-every-second-round", 200, "pairs of releases 1 apart it was identical"),
    ("dp-batch-calibrated-noise:max-grad-norm=10", 0, "canary-free releases"),
    ("dp-correlated-noise", 0, "correlated noise within"),
])
def test_the_default_audit_names_what_composition_and_the_mechanism_assume(
        plugin_path: None, bug: str, trials: int, named: str) -> None:
    """Noise reused across releases (per example, update stage), noise calibrated to the
    batch and one noise draw per tensor: each a named violation, never an INTERNAL."""
    _, outcome = _audit(bug, trials=trials)
    verdict = outcome.verdict  # type: ignore[attr-defined]
    assert outcome.violation and verdict.startswith("VIOLATION: ")  # type: ignore
    assert named in verdict.split(" (p = ")[0], verdict
    assert "consecutive releases" in verdict


def test_dpsgd_and_a_third_party_dpsgd_get_the_same_claim_and_bounds(plugin_path: None) -> None:
    ours, built_in = _audit("dpsgd:noise-multiplier=1", seed=3)
    theirs, plugin = _audit("private-sgd:noise-multiplier=1", seed=3)
    for outcome in (built_in, plugin):
        assert not outcome.violation, outcome.verdict  # type: ignore[attr-defined]
        assert "would have caught noise below" in outcome.verdict  # type: ignore
        assert "audited as a run of" in outcome.verdict  # type: ignore
    assert ours.claim.epsilon == theirs.claim.epsilon  # type: ignore[attr-defined]
    assert ours.trials == theirs.trials  # type: ignore[attr-defined]
    a = {(b.estimator, b.group): b.epsilon for b in built_in.bounds}  # type: ignore
    b = {(b.estimator, b.group): b.epsilon for b in plugin.bounds}  # type: ignore
    assert a.keys() == b.keys()
    for key, value in a.items():  # the same noise draws: the same bounds (float order aside)
        assert b[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key


def test_the_update_stage_is_covered_too(plugin_path: None) -> None:
    _, outcome = _audit("noise-clip-after-noise", trials=400)
    assert outcome.violation  # type: ignore[attr-defined]
    _, clean = _audit("client-dp:noise-multiplier=1,clip-norm=1", trials=400)
    assert not clean.violation, clean.verdict  # type: ignore[attr-defined]
    groups = {t.group for t in clean.tests}  # type: ignore[attr-defined]
    assert {"layers.1.bias", "layers.5.weight", "spread (all tensors)"} <= groups


def test_shuffled_batches_declared_poisson_are_found(plugin_path: None) -> None:
    from fedleak.harness.federated.protocol import Protocol

    protocol = Protocol(kind="fedavg", batch_size=4, learning_rate=0.05, shuffle=True)
    _, outcome = _audit("dp-shuffle-as-poisson:poisson=true", protocol=protocol)
    assert outcome.violation  # type: ignore[attr-defined]
    rejected = {t.test for t in outcome.tests if t.rejected}  # type: ignore[attr-defined]
    assert "sampling" in rejected
