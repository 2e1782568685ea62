"""Sweeps that audit: ``[sweep.audit]`` parsed and checked, stored as a typed measurement (older
stores widened to accept it), and every point carrying ε_LB beside ε in the report."""

from __future__ import annotations

import csv
import sqlite3
import time
from pathlib import Path

import pytest

from fedleak.harness.sweep.grid.spec import SpecError, parse_spec
from fedleak.harness.sweep.measure.measurements import AuditMeasurement
from fedleak.harness.sweep.results import load_results, summary_table
from fedleak.harness.sweep.runner import SweepOptions, run_sweep
from fedleak.harness.sweep.store import ResultStore
from tests.helpers import tiny_spec

AUDIT = '\n[sweep.audit]\ntrials = 300\nthreshold = "half-shift"\nseed = 2\n'
NOISE = '[[sweep.defense]]\nname = "noise"\nparams = { sigma = 1.0 }'


def test_audit_table_becomes_each_points_audit_without_moving_old_ids() -> None:
    plain = parse_spec(tiny_spec(NOISE))
    audited = parse_spec(tiny_spec(NOISE) + AUDIT)
    assert audited.audit == {"trials": 300, "threshold_rule": "half-shift", "seed": 2}
    for before, after in zip(plain.points(), audited.points(), strict=True):
        assert before.audit is None and after.audit == audited.audit
        assert before.point_id != after.point_id  # what is measured changed
        assert before.utility_id == after.utility_id  # the utility did not
    declared = parse_spec(tiny_spec(NOISE) + "\n[sweep.audit]\nthreshold = 0.5\n")
    assert declared.audit == {"trials": 2000, "threshold_rule": "declared", "threshold": 0.5}


def test_the_attacks_of_a_portfolio_share_one_audit_per_setting(tmp_path: Path) -> None:
    """The game measures the defended update, not the attack: points differing only in their
    attack share an audit id (and the stored audit), points differing in the defense do not."""
    two_attacks = (tiny_spec(NOISE) + AUDIT
                   + '[[sweep.attack]]\nname = "inverting-gradients"\niterations = 10\ntv = 0.1\n')
    points = parse_spec(two_attacks.replace(
        "[sweep]", "[sweep]\nportfolio = true", 1)).points()
    by_setting: dict[str, set[str]] = {}
    for p in points:
        by_setting.setdefault(p.label, set()).add(p.audit_id)
    assert len({p.point_id for p in points}) == 2 * len(by_setting)  # two attacks per setting
    assert all(len(ids) == 1 for ids in by_setting.values())
    assert len({next(iter(ids)) for ids in by_setting.values()}) == len(by_setting)
    first, second = [p for p in points if p.label == points[-1].label]
    measured = AuditMeasurement(epsilon_lb={"gaussian-dp": 2.0}, confidence=0.95, trials=300,
                                delta=1e-5, canary="gradient canary")
    with ResultStore(tmp_path / "results.sqlite") as store:
        store.add_points([first, second])
        assert store.shared_audit(second) is None
        store.record(first.point_id, "audit", measured.to_json(), time.time())
        assert store.shared_audit(second) == measured.to_json()


@pytest.mark.parametrize("table, message", [
    ("trials = -1", "trials must lie in"),
    ("cannary = 'input'", "unknown key(s) cannary"),
    ("threshold = 'best'", "threshold must be split, half-shift or a number"),
    ("canary = 'client'", "some [[sweep.defense]] tables have one user"),
    ("calibration = 1.5", "calibration_fraction must lie in (0, 1)"),
])
def test_audit_table_errors_name_what_to_change(table: str, message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        parse_spec(tiny_spec(NOISE) + f"\n[sweep.audit]\n{table}\n")


def test_a_store_from_before_audits_is_widened_keeping_its_rows(tmp_path: Path) -> None:
    db = tmp_path / "results.sqlite"
    with sqlite3.connect(db) as con:
        con.executescript("""
            CREATE TABLE points (id TEXT PRIMARY KEY, spec TEXT NOT NULL, label TEXT NOT NULL,
                position INTEGER NOT NULL, status TEXT NOT NULL DEFAULT 'pending', error TEXT,
                updated_at REAL NOT NULL);
            CREATE TABLE measurements (id INTEGER PRIMARY KEY AUTOINCREMENT,
                point_id TEXT NOT NULL REFERENCES points(id),
                kind TEXT NOT NULL CHECK (kind IN ('attack', 'utility')),
                metrics TEXT NOT NULL, started_at REAL NOT NULL, finished_at REAL NOT NULL,
                UNIQUE (point_id, kind));
            INSERT INTO points VALUES ('p1', '{}', 'x', 0, 'done', NULL, 0);
            INSERT INTO measurements (point_id, kind, metrics, started_at, finished_at)
                VALUES ('p1', 'attack', '{"mean_psnr": 9.5}', 0, 1);""")
    measured = AuditMeasurement(epsilon_lb={"gaussian-dp": 3.1}, confidence=0.95, trials=300,
                                delta=1e-5, canary="gradient canary", epsilon_claimed=4.38)
    with ResultStore(db) as store:
        store.record("p1", "audit", measured.to_json(), time.time())
        assert store.done("p1", "attack") and store.done("p1", "audit")
        assert store.audit("p1") == measured and store.audit("p1").best == ("gaussian-dp", 3.1)
        assert [m.id for m in store.measurements("p1")] == [1, 2]


@pytest.mark.e2e
def test_a_sweep_point_carries_its_epsilon_lb_beside_its_epsilon(tmp_path: Path) -> None:
    text = tiny_spec(NOISE, iterations=2, utility_rounds=1, name="audited").replace(
        "[[sweep.defense]]\nreference = true\n", "") + AUDIT
    text = text.replace("[sweep.utility]\n", "[sweep.utility]\nenabled = false\n")
    outcome = run_sweep(parse_spec(text), tmp_path / "run",
                        SweepOptions(show_progress=False), echo=lambda _: None)
    assert not outcome.failed and len(outcome.measured) == 1
    (result,) = load_results(tmp_path / "run")
    audit = result.audit
    assert audit is not None and audit.trials == 300 and not audit.violation
    assert set(audit.epsilon_lb) == {"clopper-pearson", "gaussian-dp", "one-run",
                                     "gaussian-scores"}  # the worst tensor's, declared family
    assert set(audit.estimates) == {"one-shot"}
    assert audit.epsilon_claimed == pytest.approx(4.377, abs=1e-3)  # noise σ = 1, ‖c‖ = 1
    assert 1.0 < audit.epsilon_lb["gaussian-dp"] <= audit.epsilon_claimed
    assert audit.confidence == 0.95 and audit.delta == 1e-5 and "dirac" in audit.canary
    assert (tmp_path / "run" / audit.run / "audit.json").exists()
    assert "ε_LB" in summary_table([result])
    from fedleak.harness.sweep.report.folder import write_report

    write_report(tmp_path / "run")
    with (tmp_path / "run" / "report" / "results.csv").open() as handle:
        (row,) = list(csv.DictReader(handle))
    assert float(row["epsilon_lb"]) == pytest.approx(audit.epsilon_lb["gaussian-dp"])
    assert row["epsilon_lb_estimator"] == "gaussian-dp" and row["audit_violation"] == "False"
    assert "ε_LB" in (tmp_path / "run" / "report.html").read_text()
