"""The text chart of a partial sweep: the y-axis names the chart's own measure even where no
point is drawn yet, and each curve joins the settings of one defense table only, at one kind
of claimed ε (the deployment's, never an attacked step's beside it)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest
from matplotlib.figure import Figure

from fedleak.harness.sweep.grid.spec import parse_spec
from fedleak.harness.sweep.measure.measurements import AttackMeasurement, UtilityMeasurement
from fedleak.harness.sweep.report.text_charts import plot_text_privacy_utility
from fedleak.harness.sweep.results import PointResult

matplotlib.use("Agg")

SPEC = """
[sweep]
name = "text-partial"
dataset = "shakespeare"
split = "test"
models = ["gpt2:hidden=32,layers=1,heads=2"]
rounds = 1
batch_size = 2
seq_len = 12

[[sweep.attack]]
name = "{attack}"

[sweep.utility]
rounds = 2
batch_size = 4
lr = 0.5
schedule = "constant"

[[sweep.defense]]
reference = true

[[sweep.defense]]
name = "dpsgd"
param = "noise-multiplier"
values = [0.5, 1.0, 3.0]
params = {{ max-grad-norm = 1.0 }}

[[sweep.defense]]
name = "dpsgd"
param = "noise-multiplier"
values = [0.5, 1.0]
params = {{ max-grad-norm = 0.1 }}
"""


def _floats(values: object) -> list[float]:
    return [float(v) for v in values]  # type: ignore[attr-defined]


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """Per axes of the saved figure: its labels and its lines (label, xs, ys)."""
    seen: list[dict[str, object]] = []

    def savefig(self: Figure, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        for ax in self.axes:
            seen.append({"ylabel": ax.get_ylabel(), "xlabel": ax.get_xlabel(),
                         "lines": [(line.get_label(), _floats(line.get_xdata()),
                                    _floats(line.get_ydata())) for line in ax.get_lines()]})

    monkeypatch.setattr(Figure, "savefig", savefig)
    return seen


def partial(attack: str, trained: tuple[float, ...] = (0.0, 0.5)) -> list[PointResult]:
    """Every point attacked but σ = 3 (pending); utility trained only at the strengths in
    ``trained`` (0: the reference), so σ = 1's ε is only its attacked step's (1.0, against
    80 deployed at σ = 0.5). Recall 0.5/σ at clip 1 and 0.4/σ at clip 0.1."""
    out = []
    for point in parse_spec(SPEC.format(attack=attack)).points():
        sigma = point.strength or 0.0
        if sigma == 3.0:
            out.append(PointResult(point, "pending", None, None, None))
            continue
        measured = AttackMeasurement(point.attack, point.model, point.dataset, "points/x",
                                     defenses=list(point.defenses),
                                     epsilon=None if point.reference else 1.0 / sigma)
        small_clip = "max-grad-norm=0.1" in point.defenses[0] if point.defenses else False
        got = 1.0 if point.reference else (0.4 if small_clip else 0.5) / sigma
        measured.token_recall = measured.token_precision = got
        if attack == "dager":
            measured.rouge1 = measured.rouge2 = got
        utility = None
        if sigma in trained:
            utility = UtilityMeasurement(
                0.1, 0.0, [(0, 0.0), (2, 0.1)], 2, 4, 0.5, "constant", "fedsgd",
                epsilon=None if point.reference else 40.0 / sigma,
                delta=None if point.reference else 1e-5, perplexity=900.0 * (1 + sigma))
        out.append(PointResult(point, "done", None, measured, utility))
    return out


@pytest.mark.parametrize(("attack", "measure"), [("token-set", "token-set recall"),
                                                 ("dager", "ROUGE-1")])
def test_the_y_axis_names_the_charts_measure_before_any_training(
        attack: str, measure: str, tmp_path: Path, drawn: list[dict[str, object]]) -> None:
    plot_text_privacy_utility(partial(attack, trained=()), tmp_path / "c.png", "ctx")
    assert len(drawn) == 2
    for panel in drawn:  # the left panel draws nothing yet: no utility is measured
        label = str(panel["ylabel"])
        assert measure in label, label
        assert ("ROUGE" in label) == (attack == "dager"), label
        assert ("token-set" in label) == (attack == "token-set"), label


@pytest.mark.parametrize("attack", ["token-set", "dager"])
def test_each_curve_is_one_defense_table_at_one_kind_of_epsilon(
        attack: str, tmp_path: Path, drawn: list[dict[str, object]]) -> None:
    plot_text_privacy_utility(partial(attack), tmp_path / "c.png", "ctx")
    left, right = drawn
    for panel in (left, right):
        curves = [line for line in panel["lines"]  # type: ignore[attr-defined]
                  if line[0] != "no defense (reference)" and len(line[1]) > 0]
        names = [name for name, _, _ in curves]
        assert len(names) == len(set(names)) == 2, names  # one curve per clip, told apart
        assert any("0.1" in name for name in names), names
        for name, _, ys in curves:
            clip = 0.4 if "0.1" in name else 0.5
            allowed = {1.0, clip / 0.5, clip / 1.0}  # ★, σ = 0.5, σ = 1 of that table only
            assert set(ys) <= allowed, (name, ys)
    # the ε axis: the deployment's ε only; σ = 1 (utility not trained yet) is not drawn at
    # its attacked step's ε = 1 beside σ = 0.5's deployed ε = 80
    xs = {x for _, line_xs, _ in right["lines"] for x in line_xs}  # type: ignore[attr-defined]
    assert 1.0 not in xs, xs
    assert 80.0 in xs, xs
    assert "deployment" in str(right["xlabel"]), right["xlabel"]
