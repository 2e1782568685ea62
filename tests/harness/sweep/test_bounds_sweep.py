"""DP points where deployments sit, success at a threshold and the bounds chart (in-process)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedleak.defenses import build_chain, parse_defense_spec
from fedleak.defenses.dpsgd import make_accountant, record
from fedleak.harness.metrics.success_bounds import Mechanism, place, prior_kappa, round_mechanism
from fedleak.harness.sweep.grid.points import SpecError
from fedleak.harness.sweep.grid.spec import load_preset, parse_spec
from fedleak.harness.sweep.measure.measurements import AttackMeasurement, UtilityMeasurement
from fedleak.harness.sweep.report.bounds_chart import bounds_rows, plot_bounds
from fedleak.harness.sweep.results import PointResult
from tests.helpers import tiny_spec


def test_quick_preset_has_three_dp_points_at_epsilon_at_most_ten() -> None:
    """Poisson-sampled DP-SGD over FedAvg local steps on the user's whole split: the ε its
    accountant will claim after the utility rounds is at most 10 for three points."""
    points = [p for p in load_preset("quick").points()
              if p.group == "dpsgd-poisson" and "objective" not in p.attack_options]
    assert len(points) >= 3
    for point in points:
        assert point.protocol is not None and point.protocol.kind == "fedavg"
        utility = point.utility_settings
        (_, params), = [parse_defense_spec(d) for d in point.defenses]
        dp = build_chain([("dpsgd", params)]).per_example
        assert dp is not None
        q = dp.sample_rate(utility.batch_size, point.protocol.batch_size)
        assert q is not None and q < 0.1
        accountant = make_accountant("rdp")
        for _ in range(utility.rounds):
            record(accountant, float(params["noise-multiplier"]), q, round(1 / q))
        assert 0.5 <= accountant.get_epsilon(1e-5) <= 10
    # the earlier points keep their protocol, utility and ids
    first = load_preset("quick").points()[0]
    assert first.protocol is not None and first.protocol.kind == "fedsgd"
    assert first.utility["batch_size"] == 4


def test_a_defense_table_brings_its_own_protocol_and_utility() -> None:
    spec = parse_spec(tiny_spec(
        '[[sweep.defense]]\nname = "dpsgd"\nparam = "noise-multiplier"\nvalues = [2.0]\n'
        'params = { poisson = true }\n'
        'protocol = { kind = "fedavg", local_epochs = 1, local_batch_size = 2, lr = 0.1 }\n'
        'utility = { rounds = 2, batch_size = 8 }'))
    reference, dp = spec.points()
    assert reference.protocol is not None and reference.protocol.kind == "fedsgd"
    assert dp.protocol is not None and dp.protocol.batch_size == 2
    assert dp.utility["batch_size"] == 8 and dp.utility["rounds"] == 2
    assert reference.utility["batch_size"] != 8
    with pytest.raises(SpecError, match="unknown key.*batchsize"):
        parse_spec(tiny_spec('[[sweep.defense]]\nname = "prune"\nutility = { batchsize = 2 }'))
    with pytest.raises(SpecError, match="protocol"):
        parse_spec(tiny_spec('[[sweep.defense]]\nname = "prune"\nprotocol = { kind = "x" }'))


def test_success_at_a_threshold_sits_under_the_bound_of_the_mechanism() -> None:
    baseline = prior_kappa("digits", "train", 20.0)
    assert baseline is not None and 0 < baseline.kappa < baseline.upper < 0.05
    assert baseline.prior_size == 359  # the test split: the public prior of train images
    mechanism = round_mechanism({"sample_rate": "1", "dp_steps": "1"},
                                [("dpsgd", {"noise-multiplier": "1.5"})])
    assert mechanism == Mechanism(1.5, 1.0, 1)
    # in-order batches are no sampling: the image is in one step per epoch, at q = 1
    assert round_mechanism({"sample_rate": "0.25", "dp_steps": "8"},
                           [("dpsgd", {"noise-multiplier": "1", "poisson": "False"})], 2) \
        == Mechanism(1.0, 1.0, 2)
    assert round_mechanism({"sample_rate": "0.25", "dp_steps": "8"},
                           [("dpsgd", {"noise-multiplier": "1", "poisson": "True"})], 2) \
        == Mechanism(1.0, 0.25, 8)
    placed = place([25.0, 12.0, 21.0], baseline, mechanism)
    assert (placed.successes, placed.images) == (2, 3)
    assert placed.bound is not None and baseline.upper < placed.bound < 0.2
    assert place([25.0], None, None).bound is None
    assert prior_kappa("digits", "all") is None  # no public split


def _result(label: str, sigma: float, success: float, psnr: float, epsilon: float,
            attack: str = "inverting-gradients") -> PointResult:
    spec = parse_spec(tiny_spec(f'[[sweep.defense]]\nname = "dpsgd"\nparam = '
                                f'"noise-multiplier"\nvalues = [{sigma}]'))
    point = spec.points()[1]
    measured = AttackMeasurement(attack, "mlp", "digits", "run", images=3, mean_psnr=psnr,
                                 noise_multiplier=sigma, sample_rate=1.0, dp_steps=1,
                                 success_psnr=20.0, success_rate=success,
                                 successes=round(3 * success), kappa=0.01,
                                 reconstruction_bound=0.3, fisher_psnr_ceiling=-3.0)
    utility = UtilityMeasurement(0.9, 0.1, [(0, 0.1)], 2, 4, 0.5, "cosine", "fedsgd",
                                 epsilon=epsilon, delta=1e-5)
    return PointResult(point, "done", None, measured, utility)


def test_bounds_chart_takes_the_strongest_attack_and_an_audited_epsilon(tmp_path: Path) -> None:
    weak = _result("a", 1.0, 0.0, 9.0, 5.0)
    strong = _result("a", 1.0, 2 / 3, 21.0, 5.0)
    other = _result("b", 0.5, 1.0, 30.0, 50.0)
    rows = bounds_rows([weak, strong, other], audited={strong.point_id: 1.5})
    assert [r.epsilon for r in rows] == [5.0, 50.0]  # sorted by ε
    assert rows[0].success_rate == 2 / 3 and rows[0].epsilon_lb == 1.5
    assert rows[1].epsilon_lb is None and math.isclose(rows[1].bound or 0, 0.3)
    chart = plot_bounds(rows, tmp_path / "bounds.png", "test")
    assert chart.stat().st_size > 10_000
