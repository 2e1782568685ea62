"""The text-pretrained preset, shrunk to one point, through the real sweep runner on the real
pretrained SmolLM2-135M (the cache folder the zoo builds once, as tests/harness/zoo/
test_pretrained_models.py reads it): DAGER recovers the batch, the perplexity before any round is
the pretrained model's (far below the 49 152 ids a random model would be near), and the audit
gives a verdict. The perplexity is read on 4 held-out sentences (the preset: 256) and the audit
plays 4 trials (the preset: 20); the rest of the cost is three victim processes loading the
model and the model's parameters crossing the wire."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedleak.harness.sweep.grid.spec import load_preset, parse_spec, preset_text
from fedleak.harness.sweep.measure import text_measure
from fedleak.harness.sweep.runner import SweepOptions, run_sweep
from fedleak.harness.sweep.store import STORE_NAME, ResultStore
from fedleak.harness.zoo.model_spec import ModelError
from fedleak.harness.zoo.text.pretrained import pretrained_folder
from fedleak.harness.zoo.text.text_datasets import load_text_dataset
from fedleak.harness.zoo.text.text_models import build_text_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _tiny() -> str:
    text = preset_text("text-pretrained")
    text = text.replace('name = "token-set"\n\n[[sweep.attack]]\n', "")  # dager only
    text = text.replace("trials = 20", "trials = 4").replace("rounds = 2 ", "rounds = 1 ")
    head, _, _ = text.partition('[[sweep.defense]]\nname = "dpsgd"')
    return head


def test_the_text_pretrained_preset_trains_the_first_blocks_of_smollm2() -> None:
    spec = load_preset("text-pretrained")
    assert spec.dataset == "alice" and spec.split == "test" and spec.audit
    labels = [p.label for p in spec.points()]
    assert labels[0] == "no defense" and any("dpsgd" in x for x in labels) \
        and any("client-dp" in x for x in labels)
    assert all(p.model == "smollm2-135m:train-layers=2" for p in spec.points())


def test_train_layers_freezes_all_but_the_first_blocks_and_refuses_bad_values() -> None:
    info = load_text_dataset("shakespeare", "test", task="lm", seq_len=8).info
    net = build_text_model("gpt2:hidden=32,layers=3,heads=2,train-layers=1", info)
    trained = [n for n, _ in net.named_parameters()]
    assert "net.transformer.h.0.attn.c_attn.weight" in trained and "net.transformer.ln_f.weight" \
        in trained and not any(".h.1." in n or ".h.2." in n or "wte" in n for n in trained)
    with pytest.raises(ModelError, match="lora or train-layers"):
        build_text_model("gpt2:hidden=32,layers=1,heads=2,train-layers=1,lora=2", info)
    with pytest.raises(ModelError, match="has 1 blocks"):
        build_text_model("gpt2:hidden=32,layers=1,heads=2,train-layers=2", info)


@pytest.mark.e2e
def test_a_one_point_text_pretrained_sweep(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # perplexity on 4 held-out sentences, not 256: each evaluation runs all 30 blocks
    monkeypatch.setattr(text_measure, "EVALUATED", 4)
    pretrained_folder("smollm2-135m")  # built once per machine (cache), then memory-mapped
    spec = parse_spec(_tiny())
    assert len(spec.points()) == 1
    outcome = run_sweep(spec, tmp_path / "run", SweepOptions(show_progress=False),
                        echo=lambda _: None)
    assert not outcome.failed, outcome.failed
    with ResultStore(tmp_path / "run" / STORE_NAME) as store:
        found = {m.kind: m.metrics for m in store.measurements()}
    assert found["attack"]["rouge1"] == 1.0
    utility = found["utility"]
    assert math.isfinite(utility["perplexity"])
    assert 1.0 < utility["initial_perplexity"] < 1000  # the pretrained model's, not ~49 152
    assert found["audit"]["trials"] == 4 and found["audit"]["violation"] is False
