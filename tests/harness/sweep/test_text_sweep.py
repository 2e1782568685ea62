"""Sweeps on text: specs with text data and models, text attacks only on text, a tiny run
measuring ROUGE or token sets beside perplexity, charted in the report."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from fedleak.harness.sweep.grid.spec import SpecError, load_preset, parse_spec

SPEC = """
[sweep]
name = "text-tiny"
dataset = "shakespeare"
split = "test"
models = ["gpt2:hidden=32,layers=1,heads=2"]
rounds = 1
batch_size = 2
seq_len = 12

[[sweep.attack]]
name = "token-set"

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
values = [1.0]
params = { max-grad-norm = 1.0 }
"""


def test_text_specs_expand_and_carry_the_sequence_length() -> None:
    points = parse_spec(SPEC).points()
    assert [p.label for p in points] == ["no defense", "dpsgd noise-multiplier=1.0"]
    assert all(p.seq_len == 12 and "seq_len" in p.measured() for p in points)
    assert points[0].victim_settings().seq_len == 12
    image = parse_spec(SPEC.replace('"shakespeare"', '"digits"').replace(
        '"token-set"', '"dlg"').replace('"gpt2:hidden=32,layers=1,heads=2"', '"mlp"')
        .replace("seq_len = 12\n", ""))
    assert all("seq_len" not in p.measured() for p in image.points())  # image ids unchanged


@pytest.mark.parametrize(("change", "message"), [
    (('"token-set"', '"inverting-gradients"'), "cannot attack shakespeare"),
    (('"shakespeare"', '"digits"'), "cannot attack digits"),
    (('"shakespeare"', '"poems"'), "shakespeare, alice, textfile"),
    (('"gpt2:hidden=32,layers=1,heads=2"', '"gpt3"'), "gpt2, bert, minilm, smollm2-135m, hf"),
])
def test_a_text_spec_that_cannot_run_is_refused(change: tuple[str, str], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(SPEC.replace(*change))


def test_the_text_quick_preset_audits_dp_against_a_reference() -> None:
    spec = load_preset("text-quick")
    assert spec.dataset == "shakespeare" and spec.split == "test" and spec.audit
    labels = [p.label for p in spec.points()]
    assert labels[0] == "no defense" and any("dpsgd" in x for x in labels) \
        and any("client-dp" in x for x in labels)


@pytest.mark.e2e
def test_a_tiny_text_sweep_end_to_end(tmp_path: Path) -> None:
    spec = tmp_path / "text.toml"
    spec.write_text(SPEC)
    done = subprocess.run([sys.executable, "-m", "fedleak", "sweep", str(spec), "--out",
                           str(tmp_path / "run")], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ROUGE-1" in done.stdout  # the text summary table
    report = tmp_path / "run" / "report"
    assert (report / "text-privacy-utility.png").stat().st_size > 10_000
    with (report / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    reference, dp = rows
    assert float(reference["token_recall"]) == 1.0 and float(reference["token_precision"]) == 1.0
    assert float(dp["token_recall"]) < 1.0 and float(dp["epsilon"]) > 0
    assert float(reference["perplexity"]) > 1.0
