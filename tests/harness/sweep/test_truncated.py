"""Budgets in work, wall clock only as a safety cap: a run the cap cuts says ``truncated``
everywhere (the attack's result, metrics.json, the printed lines, a sweep's records and
report) and never counts as a measurement."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedleak.attacks import create_attack
from fedleak.attacks.safety_limit import SafetyLimit, check_seconds
from fedleak.harness.attacker.records import ImageRecord, RoundRecord, RunHeader, UpdateRun
from fedleak.harness.federated.observe import observe
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.sweep.grid.spec import parse_spec
from fedleak.harness.sweep.measure.measurements import AttackMeasurement, done_line
from fedleak.harness.sweep.results import PointResult, summary_table
from fedleak.harness.sweep.worst_case import worst_cases
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.zoo.datasets import load_dataset
from fedleak.harness.zoo.models import build_model
from tests.helpers import tiny_spec

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_safety_limit_counts_as_cut_only_once_it_stopped_work() -> None:
    now = [0.0]
    limit = SafetyLimit(10.0, clock=lambda: now[0])
    now[0] = 4.0
    assert not limit.expired() and limit.left() == 6.0 and limit.reason("3 sets") is None
    now[0] = 10.0
    assert limit.expired() and limit.cut and limit.left() == 0.0
    reason = limit.reason("3 of 9 sets")
    assert reason is not None and "3 of 9 sets" in reason and "not a measurement" in reason
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="time-limit must be a positive number"):
            check_seconds(bad)


def digits_observation(count: int):  # noqa: ANN201
    digits = load_dataset("digits", "train")
    torch.manual_seed(0)
    model = build_model("mlp:width=512,depth=1", digits.info.shape, digits.info.num_classes)
    return observe(model, digits.images[:count], digits.labels[:count], digits.info, Protocol())


def test_spear_cut_by_its_safety_limit_is_truncated_and_out_of_budget_is_not() -> None:
    observation = digits_observation(8)
    cut = create_attack("spear", {"time_limit": 1e-9}).reconstruct(observation, seed=0)
    assert cut.truncated is not None and "safety limit" in cut.truncated
    assert cut.padding == list(range(8)) and any("truncated" in w for w in cut.warnings)
    spent = create_attack("spear", {"samples": 10, "batch": 1}).reconstruct(observation)
    assert spent.truncated is None  # the work budget ran out: that is the measurement


def test_spear_counts_its_budget_in_sampled_sets_not_seconds() -> None:
    """The same seed and budget try the same sets and find the same inputs, whatever the
    safety limit (as long as it does not cut)."""
    observation = digits_observation(6)
    runs = [create_attack("spear", {"samples": 6144, "batch": 2048, "time_limit": limit})
            .reconstruct(observation, seed=3) for limit in (3600.0, 1e6)]
    assert [r.extras["sets_tried"] for r in runs] == [runs[0].extras["sets_tried"]] * 2
    assert [r.extras["directions_found"] for r in runs] == \
        [runs[0].extras["directions_found"]] * 2
    assert all(r.truncated is None for r in runs)


def round_record(truncated: str | None, psnr: float) -> RoundRecord:
    return RoundRecord(
        round_id="r", update_kind="gradient", num_images=1, local_steps=1, victim_metadata={},
        iterations=1, objective=0.0, restart_objectives=[], wall_time_s=1.0, labels=[0],
        mean_psnr=psnr, mean_ssim=0.5, mean_mse=0.1, label_accuracy=1.0,
        images=[ImageRecord(0, 0, psnr, 0.5, 0.1)], exact=0, truncated=truncated)


def test_a_truncated_round_is_listed_and_left_out_of_the_summary(tmp_path: Path) -> None:
    header = RunHeader.now("v", "m", "digits", "spear", {}, {}, "cpu")
    run = UpdateRun(header, [round_record(None, 12.0), round_record("cut at 3 s", 99.0)])
    out = run.to_json()
    assert out["summary"]["mean_psnr"] == 12.0 and out["summary"]["rounds"] == 1
    assert out["truncated"] == ["round 1 (r): cut at 3 s"]
    assert out["rounds"][1]["truncated"] == "cut at 3 s" and "truncated" not in out["rounds"][0]
    lines = run.summary_lines(tmp_path)
    assert any("TRUNCATED" in line and "cut at 3 s" in line for line in lines)
    assert any("mean PSNR 12.00 dB" in line for line in lines)
    assert not any("99.00" in line and "mean" in line for line in lines)


def test_a_truncated_sweep_point_is_never_a_measurement() -> None:
    spec = parse_spec(tiny_spec('[[sweep.defense]]\nname = "prune"\nparam = "p"\n'
                                'values = [0.9]'))
    points = spec.points()
    honest = AttackMeasurement(attack="inverting-gradients", model="m", dataset="d", run="",
                               mean_psnr=15.0, mean_ssim=0.4)
    cut = AttackMeasurement(attack="inverting-gradients", model="m", dataset="d", run="",
                            mean_psnr=60.0, mean_ssim=0.9, truncated=["round 0 (r): cut"])
    results = [PointResult(points[0], "done", None, honest, None),
               PointResult(points[1], "done", None, cut, None)]
    assert results[1].truncated and results[1].psnr is None and results[1].ssim is None
    strongest = [row.strongest.get("honest") for row in worst_cases(results)]
    assert [s.psnr if s else None for s in strongest] == [15.0, None]
    table = summary_table(results)
    assert "done, truncated" in table and "truncated " + points[1].point_id in table
    assert "60.00" not in table
    assert "TRUNCATED" in done_line("x", points[1].point_id, cut, None)
    again = AttackMeasurement.from_json(json.loads(json.dumps(cut.to_json())))
    assert again.truncated == ["round 0 (r): cut"]


@pytest.mark.integration
def test_fedleak_attack_marks_a_truncated_round_across_processes(tmp_path: Path) -> None:
    args = ["--dataset", "digits", "--split", "train", "--images", "0-5", "--model",
            "mlp:width=512,depth=1", "--batch-size", "6"]
    with VictimProcess(args) as victim:
        done = subprocess.run([sys.executable, "-m", "fedleak", "attack", "--victim",
                               victim.address, "--attack", "spear", "-o", "time-limit=1e-9",
                               "--out", str(tmp_path / "run"), "--quiet"],
                              capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["rounds"][0]["truncated"] and len(metrics["truncated"]) == 1
    assert metrics["summary"]["rounds"] == 0 and metrics["summary"].get("exact") is None
    assert "TRUNCATED" in done.stdout
