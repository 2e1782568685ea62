"""Every chart a person reads: no text clipped by the figure's edge, no text on other text
(measured with matplotlib's renderer, :mod:`fedleak.harness.metrics.chart_layout`), and each
bounds chart says alone which ε is which and at what δ.

The report is written from a run folder whose store holds the quick preset's points with
figures chosen to be hard to draw: spreads of 0.05 dB, an audited ε_LB of 0, two attacks of a
portfolio within 0.01 dB of each other, long defense labels. Every ``Figure.savefig`` is
intercepted and the figure checked before it is saved.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import pytest
from matplotlib.figure import Figure

from fedleak.harness.attacker.games.bound_pictures import plot_game
from fedleak.harness.metrics.chart_layout import text_problems
from fedleak.harness.sweep.grid.spec import parse_spec, preset_text
from fedleak.harness.sweep.measure.measurements import (
    AttackMeasurement,
    AuditMeasurement,
    UtilityMeasurement,
)
from fedleak.harness.sweep.report.folder import write_report
from fedleak.harness.sweep.store import STORE_NAME, ResultStore
from tests.helpers import load_bench_script

matplotlib.use("Agg")


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Every figure saved while the test runs, by file name: its text problems, and its
    texts joined (``"texts"`` of each)."""
    seen: dict[str, list[str]] = {}
    original = Figure.savefig

    def savefig(self: Figure, fname, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        name = Path(str(fname)).name
        seen[name] = text_problems(self)
        seen[name + " texts"] = [t.get_text() for t in self.findobj(matplotlib.text.Text)]
        return original(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return seen


def quick_run(folder: Path) -> Path:
    """A run folder of the quick preset's points with hard-to-draw figures (module doc)."""
    spec = parse_spec(preset_text("quick"))
    points = spec.points()
    run = folder / "run"
    run.mkdir()
    with ResultStore(run / STORE_NAME) as store:
        store.add_points(points)
        for index, point in enumerate(points):
            sigma = float(point.strength) if point.group.startswith("dpsgd") and \
                point.strength else None
            deployed = "poisson" in point.group
            blind = point.attack_options.get("objective") == "cosine"
            psnr = 25.0 if point.reference else 8.02 + 0.03 * (index % 3) if deployed or \
                (sigma or 0) >= 0.3 else 10.0 + 0.01 * blind + 0.5 * (index % 4)
            attack = AttackMeasurement(
                point.attack, point.model, point.dataset, "points/x", images=3, mean_psnr=psnr,
                mean_ssim=0.1 + 0.001 * index, defenses=list(point.defenses),
                epsilon=None, delta=1e-5 if sigma else None,
                floor_psnr=11.1, floor_ssim=0.05, floor_margin=psnr - 11.1,
                above_floor=3 if point.reference else 0)
            if sigma is not None:
                attack.noise_multiplier, attack.dp_steps = sigma, 1
                attack.sample_rate = 0.089 if deployed else 1.0
                attack.success_psnr, attack.successes, attack.success_rate = 20.0, 0, 0.0
                attack.kappa, attack.kappa_upper = 0.011, 0.025
                attack.reconstruction_bound = min(1.0, 0.04 / sigma)
                attack.fisher_psnr_ceiling = -10.0 - 20 * math.log10(sigma)
                attack.prior_psnr = 10.7
            store.record(point.point_id, "attack", attack.to_json(), 0.0)
            utility = UtilityMeasurement(
                0.9 - 0.01 * index, 0.1, [(0, 0.1), (1, 0.5)], 20 if deployed else 150, 4,
                0.5, "cosine", point.protocol.kind if point.protocol else "fedsgd",
                epsilon=(5.13 / sigma if deployed else 132.0 / sigma) if sigma else None,
                delta=1e-5 if sigma else None)
            if not store.done(point.point_id, "utility"):
                store.record(point.point_id, "utility", utility.to_json(), 0.0)
            if sigma is not None and not store.done(point.point_id, "audit"):
                audit = AuditMeasurement({"clopper-pearson": 0.0 if sigma >= 3 else 0.8 / sigma},
                                         0.95, 1000, 1e-5, "gradient",
                                         epsilon_claimed=3.0 / sigma)
                store.record(point.point_id, "audit", audit.to_json(), 0.0)
            store.set_status(point.point_id, "done")
        store.set_meta("name", "quick")
    return run


def test_every_report_chart_is_whole_and_apart(tmp_path: Path,
                                                 checked: dict[str, list[str]]) -> None:
    write_report(quick_run(tmp_path))
    charts = [name for name in checked if name.endswith(".png")]
    assert {"bounds.png", "privacy-utility-1.png", "strength-1.png", "worst-case-1.png"} \
        <= set(charts), charts
    problems = {name: checked[name] for name in charts if checked[name]}
    assert not problems, problems
    # the attacked images' trivial floor is drawn beside the figures, as a band
    for name in ("privacy-utility-1.png", "strength-1.png"):
        assert "trivial floor (best constant guess)" in " ".join(checked[name + " texts"]), name


def test_the_bounds_chart_says_which_epsilon_is_which_and_at_what_delta(
        tmp_path: Path, checked: dict[str, list[str]]) -> None:
    write_report(quick_run(tmp_path))
    texts = " ".join(checked["bounds.png texts"])
    assert "δ = 1e-05" in texts or "δ = 1e-5" in texts
    for phrase in ("whole deployment", "one audit trial", "one attacked step", "ε_LB = 0"):
        assert phrase in texts, phrase


def test_the_bench_and_game_pictures_are_whole_and_apart(tmp_path: Path,
                                                         checked: dict[str, list[str]]) -> None:
    bench = load_bench_script("bounds")

    class Summary:
        def __init__(self, n: int, sigma: float) -> None:
            self.kappa, self.bound = 1 / n, min(1.0, 0.3 / sigma + 1 / n)
            self.success_rate = 0.5 / (1 + sigma)
            self.ci_low, self.ci_high = self.success_rate / 2, min(1.0, self.success_rate * 2)
            self.bound_standard_error = 0.001
            self.ratio = self.success_rate / self.bound

    rows = [bench.Row(mode, n, sigma, Summary(n, sigma), 0.25 if mode == "poisson" else 1.0,
                      4 if mode == "poisson" else 1, 1.0)
            for mode in ("full-batch", "poisson") for n in (10,) for sigma in (0.5, 1, 2, 4)]
    bench.plot(rows, tmp_path / "bench-bounds.png")
    plot_game(tmp_path / "game.png", "informed adversary against dpsgd:noise-multiplier=1,"
              "max-grad-norm=0.1 with 10 candidates and 3 known records per trial",
              rate=0.267, low=0.123, high=0.459, trials=30, kappa=0.1, bound=0.389,
              bound_error=0.0)
    for name in ("bench-bounds.png", "game.png"):
        assert checked[name] == [], (name, checked[name])


def text_run(folder: Path) -> Path:
    """A run folder of the text-quick preset's points: both attacks recover everything
    undefended and nothing under DP (labels crowd at 0), one training diverges (∞)."""
    spec = parse_spec(preset_text("text-quick"))
    run = folder / "run"
    run.mkdir()
    with ResultStore(run / STORE_NAME) as store:
        store.add_points(spec.points())
        for index, point in enumerate(spec.points()):
            sigma = float(point.strength) if point.strength else None
            got = 1.0 if point.reference else 0.0
            attack = AttackMeasurement(point.attack, point.model, point.dataset, "points/x",
                                       defenses=list(point.defenses),
                                       epsilon=None if sigma is None else 20.0 / sigma)
            if point.attack == "dager":
                attack.rouge1 = attack.rouge2 = attack.rougeL = got
            attack.token_recall = attack.token_precision = got
            store.record(point.point_id, "attack", attack.to_json(), 0.0)
            if not store.done(point.point_id, "utility"):
                perplexity = math.inf if point.group.startswith("client-dp") and \
                    (sigma or 0) > 2 else 850.0 * (1 + index) ** 2
                store.record(point.point_id, "utility", UtilityMeasurement(
                    0.08, 0.0, [(0, 0.0), (20, 0.08)], 20, 16, 0.3, "constant", "fedsgd",
                    epsilon=None if sigma is None else 20.0 / sigma,
                    delta=None if sigma is None else 1e-5, perplexity=perplexity).to_json(), 0.0)
            store.set_status(point.point_id, "done")
        store.set_meta("name", "text-quick")
    return run


def test_the_text_charts_are_whole_and_apart(tmp_path: Path,
                                             checked: dict[str, list[str]]) -> None:
    write_report(text_run(tmp_path))
    charts = [name for name in checked if name.startswith("text-") and name.endswith(".png")]
    assert len(charts) == 2, list(checked)
    problems = {name: checked[name] for name in charts if checked[name]}
    assert not problems, problems
    texts = " ".join(checked[charts[0] + " texts"])
    assert "diverged" in texts  # a training with ∞ perplexity is named, not drawn
