"""Transformers for text federations: built from configs, replayed exactly, private per example."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedleak.harness.federated.local_update import local_update
from fedleak.harness.federated.private_update import per_example_gradients
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.federated.text_observe import observe_text
from fedleak.harness.federated.text_training import text_utility, train_text_model
from fedleak.harness.zoo.model_spec import ModelError
from fedleak.harness.zoo.text.text_datasets import load_text_dataset
from fedleak.harness.zoo.text.text_models import build_text_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
LM = load_text_dataset("shakespeare", "test", seq_len=16)
CLS = load_text_dataset("shakespeare", "test", task="classify", seq_len=16)
TINY = "hidden=32,heads=2"


def model(spec: str, data: object = LM, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_text_model(spec, data.info)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("spec", "data"), [(f"gpt2:{TINY}", LM), (f"gpt2:{TINY},tied=true", LM),
                                            (f"bert:{TINY}", CLS)])
def test_the_replay_from_embeddings_is_the_users_update(spec: str, data: object) -> None:
    net = model(spec, data)
    x, y = data.tokens[:4], data.labels[:4]  # type: ignore[attr-defined]
    observation = observe_text(net, x, y, data.info)  # type: ignore[attr-defined]
    embeds = observation.model.get_input_embeddings().weight[x].detach()
    replayed = observation.replay(embeds, (x != 0).long(), y)
    for name, got, sent in zip(observation.parameter_names, replayed, observation.update,
                               strict=True):
        if name != observation.embedding_name:  # not looked up from embeddings
            assert torch.allclose(got, sent, rtol=1e-4, atol=1e-7), name
    assert observation.architecture == ("encoder" if spec.startswith("bert") else "decoder")
    assert observation.tied_head == ("tied=true" in spec)


def test_padding_never_changes_the_update() -> None:
    """Right padding is masked out of attention and the loss: more of it changes nothing."""
    net = model(f"gpt2:{TINY},positions=24")
    short = load_text_dataset("shakespeare", "test", seq_len=16)
    longer = load_text_dataset("shakespeare", "test", seq_len=24)
    rows = [i for i in range(60) if short.tokens[i, -1] == 0][:3]  # sentences that fit in 16
    params = dict(net.named_parameters())
    a = local_update(net, params, {}, short.tokens[rows], short.labels[rows], Protocol())
    b = local_update(net, params, {}, longer.tokens[rows], longer.labels[rows], Protocol())
    for u, v in zip(a, b, strict=True):
        assert torch.allclose(u, v, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("spec", [f"gpt2:{TINY}", f"gpt2:{TINY},lora=2"])
def test_per_example_gradients_for_dp_sgd(spec: str) -> None:
    net = model(spec)
    x, y = LM.tokens[:3], LM.labels[:3]
    params = dict(net.named_parameters())
    rows = per_example_gradients(net, params, dict(net.named_buffers()), x, y)
    for i in range(3):
        alone = local_update(net, params, dict(net.named_buffers()), x[i:i + 1], y[i:i + 1],
                             Protocol())
        for row, g in zip(rows, alone, strict=True):
            assert torch.allclose(row[i], g, rtol=1e-4, atol=1e-7)


def test_lora_updates_carry_adapters_only() -> None:
    net = model(f"bert:{TINY},lora=4", CLS)
    names = [n for n, _ in net.named_parameters()]
    assert names and all("lora_" in n or "classifier" in n for n in names)
    assert any("word_embeddings" in n for n, _ in net.named_buffers())  # frozen base weights
    observation = observe_text(net, CLS.tokens[:2], CLS.labels[:2], CLS.info)
    assert observation.lora and observation.embedding_name == ""


def test_hidden_768_builds_and_a_published_config_rebuilds_it() -> None:
    net = model("gpt2:hidden=768,heads=12,layers=2")
    assert net.input_embeddings().weight.shape == (4096, 768)
    again = build_text_model("gpt2:hidden=768,heads=12,layers=2", LM.info,
                             config_json=net.config_json())
    assert [(n, p.shape) for n, p in again.named_parameters()] == \
        [(n, p.shape) for n, p in net.named_parameters()]
    assert all(getattr(net.base_config(), k) == 0.0 for k in ("resid_pdrop", "attn_pdrop"))


def test_bad_model_specs_say_what_to_change() -> None:
    with pytest.raises(ModelError, match="valid"):
        model("gpt2:width=3")
    with pytest.raises(ModelError, match="classify"):
        model("bert", LM)
    with pytest.raises(ModelError, match="multiple of heads"):
        model("gpt2:hidden=30,heads=4")
    with pytest.raises(ModelError, match="path=FOLDER"):
        model("hf:path=/no/such/folder")


def test_brief_training_lowers_perplexity() -> None:
    net = model(f"gpt2:{TINY}")
    before = text_utility(net, LM, limit=64)
    train_text_model(net, LM, steps=30, batch_size=16, lr=3e-3)
    after = text_utility(net, LM, limit=64)
    assert before.perplexity is not None and after.perplexity is not None
    assert after.perplexity < 0.5 * before.perplexity


def test_a_diverged_model_has_infinite_perplexity_not_an_error() -> None:
    """Client-level DP's noise on a single user's update can blow a model up (the text-quick
    preset's client-dp point did): its perplexity is recorded as ∞, not an OverflowError."""
    net = model(f"gpt2:{TINY}")
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(1e4)
    score = text_utility(net, LM, limit=16)
    assert score.perplexity == float("inf")


def test_a_local_hugging_face_folder_loads_without_a_network(tmp_path: Path) -> None:
    from fedleak.harness.zoo.text.tokenizer import load_tokenizer
    from fedleak.harness.zoo.text.tokenizer_training import BUNDLED_TOKENIZER_FILE

    net = model(f"gpt2:{TINY}")
    net.net.save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text(BUNDLED_TOKENIZER_FILE.read_text())
    data = load_text_dataset("shakespeare", "test", seq_len=16, tokenizer=str(tmp_path))
    assert load_tokenizer(tmp_path).sha256 == data.info.checked_tokenizer.sha256
    loaded = build_text_model(f"hf:path={tmp_path}", data.info)
    for (name, p), q in zip(net.named_parameters(), loaded.parameters(), strict=True):
        assert torch.equal(p, q), name  # the folder's weights, not a fresh init


def test_train_model_writes_a_text_checkpoint_a_victim_loads(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    out = tmp_path / "gpt2.pt"
    done = subprocess.run([sys.executable, "-m", "fedleak", "train-model", "--dataset",
                           "shakespeare", "--model", f"gpt2:{TINY}", "--seq-len", "16",
                           "--steps", "3", "--batch-size", "8", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["steps"] == 3 and record["test_perplexity"] > 1.0
    from fedleak.harness.victim.settings import VictimSettings, create_victim

    victim = create_victim(VictimSettings(dataset="shakespeare", model=f"gpt2:{TINY}",
                                          seq_len=16, checkpoint=str(out)))
    trained = torch.load(out, weights_only=True)
    assert all(torch.equal(p, trained[n]) for n, p in victim.model.named_parameters())
