"""Worst-case leakage: a sweep's portfolio of attacks per point, and the strongest per setting."""

from __future__ import annotations

import csv
import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest

from fedleak.attacks.attack_registry import ATTACKS
from fedleak.attacks.optimisation.presets.inverting_gradients import InvertingGradients
from fedleak.harness.sweep.grid.spec import SpecError, parse_spec
from fedleak.harness.sweep.measure.measurements import AttackMeasurement
from fedleak.harness.sweep.results import PointResult
from fedleak.harness.sweep.worst_case import server_role, worst_cases
from tests.helpers import tiny_spec

PORTFOLIO = """
[[sweep.attack]]
name = "inverting-gradients"
iterations = 10
objective = "cosine"
replay = "plain"
"""


def portfolio_spec(defenses: str, extra: str = PORTFOLIO, utility_rounds: int = 3) -> str:
    text = tiny_spec(defenses, utility_rounds=utility_rounds)
    return text.replace("batch_size = 1\n", "batch_size = 1\nportfolio = true\n", 1) + extra


def test_portfolio_points_are_the_applicable_attacks_at_one_budget() -> None:
    fedavg = '\n[[sweep.attack]]\nname = "fedavg"\niterations = 10\n'
    spec = parse_spec(portfolio_spec("", PORTFOLIO + fedavg))
    assert spec.portfolio
    points = spec.points()  # FedSGD: fedavg cannot attack it and is left out
    assert [(p.attack, p.attack_options.get("objective")) for p in points] == [
        ("inverting-gradients", None), ("inverting-gradients", "cosine")]
    assert len({p.point_id for p in points}) == 2 and len({p.utility_id for p in points}) == 1
    assert len(parse_spec(portfolio_spec("", PORTFOLIO + fedavg).replace(
        "portfolio = true", "portfolio = false")).points()) == 3
    with pytest.raises(SpecError, match="share one budget of objective evaluations"):
        parse_spec(portfolio_spec("", PORTFOLIO.replace("iterations = 10", "iterations = 20")))
    # L-BFGS spends up to inner evaluations a step: 1 step of 10 matches 10 iterations
    lbfgs = '\n[[sweep.attack]]\nname = "dlg"\niterations = 1\ninner-iterations = 10\n'
    assert len(parse_spec(portfolio_spec("", PORTFOLIO + lbfgs)).points()) == 3
    with pytest.raises(SpecError, match=r"dlg: 20\b"):
        parse_spec(portfolio_spec("", PORTFOLIO + lbfgs.replace("iterations = 1\n",
                                                                "iterations = 2\n")))
    with pytest.raises(SpecError, match="true or false"):
        parse_spec(portfolio_spec("").replace("portfolio = true", 'portfolio = "yes"'))
    only_fedavg = portfolio_spec("", "").replace('name = "inverting-gradients"', 'name = "fedavg"')
    with pytest.raises(SpecError, match="no listed attack"):
        parse_spec(only_fedavg)


def result(point, psnr: float) -> PointResult:
    measured = AttackMeasurement(attack=point.attack, model=point.model, dataset=point.dataset,
                                 run="", mean_psnr=psnr, mean_ssim=0.5)
    return PointResult(point, "done", None, measured, None)


def test_strongest_attack_per_setting_and_server_role(monkeypatch: pytest.MonkeyPatch) -> None:
    class Malicious(InvertingGradients):
        server_role: ClassVar[str] = "malicious-parameters"

    monkeypatch.setitem(ATTACKS._classes, "test-malicious", Malicious)
    assert server_role("test-malicious") == "malicious"
    assert server_role("inverting-gradients") == "honest"
    assert server_role("not-installed-anywhere") == "honest"
    extra = PORTFOLIO + '\n[[sweep.attack]]\nname = "test-malicious"\niterations = 10\n'
    spec = parse_spec(portfolio_spec('[[sweep.defense]]\nname = "prune"\nparam = "p"\n'
                                     'values = [0.9]', extra))
    points = spec.points()
    assert len(points) == 6
    psnr = {("no defense", None): 20.0, ("no defense", "cosine"): 19.0,
            ("prune p=0.9", None): 11.0, ("prune p=0.9", "cosine"): 13.0}
    results = [result(p, psnr[(p.label, p.attack_options.get("objective"))]
                      if p.attack == "inverting-gradients" else
                      30.0 if p.label == "prune p=0.9" else 25.0) for p in points]
    none, prune = worst_cases(results)
    assert (none.label, none.attacks, prune.label, prune.attacks) == (
        "no defense", 3, "prune p=0.9", 3)
    assert none.strongest["honest"].attack == "inverting-gradients (objective=auto, " \
        "replay=auto)"
    assert none.strongest["honest"].psnr == 20.0
    assert prune.strongest["honest"].attack == "inverting-gradients (objective=cosine, " \
        "replay=plain)"
    assert prune.strongest["honest"].psnr == 13.0
    assert prune.strongest["malicious"].attack == "test-malicious"
    assert prune.strongest["malicious"].psnr == 30.0


@pytest.mark.e2e
def test_portfolio_sweep_end_to_end(tmp_path: Path) -> None:
    """Two attacks per setting via the CLI: each measured and stored, utility trained once per
    setting and shared, the report names the strongest per setting."""
    spec = tmp_path / "portfolio.toml"
    spec.write_text(portfolio_spec('[[sweep.defense]]\nchain = ["prune:p=0.9"]\n'
                                   'label = "prune"', utility_rounds=1))
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "fedleak", "sweep", str(spec), "--out",
                           str(out), "--quiet", "--jobs", "2"], capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, done.stderr
    assert "4 point(s) measured" in done.stdout, done.stdout
    con = sqlite3.connect(out / "results.sqlite")
    measured = con.execute("SELECT point_id, kind, metrics FROM measurements").fetchall()
    con.close()
    assert sorted(kind for _, kind, _ in measured) == ["attack"] * 4 + ["utility"] * 4
    points = {p.point_id: p for p in parse_spec(spec.read_text()).points()}
    utility = {}
    for pid, kind, metrics in measured:
        if kind == "utility":
            utility.setdefault(points[pid].label, set()).add(metrics)
    assert all(len(copies) == 1 for copies in utility.values())  # shared, not retrained
    psnr = {pid: json.loads(m)["mean_psnr"] for pid, kind, m in measured if kind == "attack"}
    with (out / "report" / "worst-case.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["defense"] for r in rows] == ["no defense", "prune"]
    for row in rows:
        best = max(psnr[pid] for pid, p in points.items() if p.label == row["defense"])
        assert float(row["honest_psnr"]) == pytest.approx(best)
        assert row["attacks"] == "2" and row["honest_attack"].startswith("inverting-gradients")
    assert (out / "report" / "worst-case.png").exists()
    assert "Worst case per defense setting" in (out / "report.html").read_text()


def test_units_sharing_a_utility_run_in_one_chain() -> None:
    """With --jobs, the attacks of a portfolio at one setting go to one job (the first trains
    the utility, the others copy it), so two jobs never train the same utility at once."""
    from fedleak.harness.sweep.runner import utility_chains

    spec = parse_spec(portfolio_spec('[[sweep.defense]]\nchain = ["prune:p=0.9"]\n'
                                     'label = "prune"', utility_rounds=1))
    points = spec.points()
    chains = utility_chains([[p] for p in points])
    assert len(chains) == 2  # two settings, two attacks each
    for chain in chains:
        assert len({unit[0].utility_id for unit in chain}) == 1 and len(chain) == 2


def test_an_attacks_budget_counts_objective_evaluations() -> None:
    from fedleak.attacks import create_attack

    assert create_attack("inverting-gradients", {"iterations": 10, "restarts": 3}).budget() == 30
    assert create_attack("dlg", {"iterations": 4, "inner_iterations": 5}).budget() == 20
    assert create_attack("dlg", {"iterations": 4, "inner_iterations": 16,
                                 "line_search": "strong_wolfe"}).budget() == 80  # max_eval 20
    assert create_attack("inverting-gradients", {"iterations": 4,
                                                 "optimizer": "lbfgs:inner=7"}).budget() == 28
    assert create_attack("trap-weights").budget() is None  # analytic: no iterative budget
