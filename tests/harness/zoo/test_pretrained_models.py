"""Pretrained text victims from registry packages: the real files, loaded once per session.

all-MiniLM-L6-v2 (a BERT encoder) and SmolLM2-135M-Instruct (a llama decoder dequantised from
its Q4_1 GGUF) are read from the installed packages through the cache folder the zoo builds on
first use (``$FEDLEAK_CACHE`` or ``~/.cache/fedleak``): the first session on a machine pays
the dequantisation once (about 25 s of one core), later ones memory-map the float32 copy.
Batches are tiny (2 sentences of 8 tokens) and one torch thread runs them.
"""

from __future__ import annotations

import pytest
import torch

from fedleak.attacks.attack_registry import attack_class
from fedleak.harness.federated.text_observe import observe_text
from fedleak.harness.zoo.model_spec import ModelError
from fedleak.harness.zoo.text.pretrained import pretrained_folder
from fedleak.harness.zoo.text.text_datasets import TextDataset, load_text_dataset
from fedleak.harness.zoo.text.text_models import TextModel, build_text_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
T = 8


def _victim(name: str, task: str, seq_len: int = T) -> tuple[TextModel, TextDataset]:
    data = load_text_dataset("alice", "test", task=task, seq_len=seq_len,
                             tokenizer=str(pretrained_folder(name)))
    torch.manual_seed(0)
    return build_text_model(name, data.info), data


@pytest.fixture(scope="session")
def smollm2() -> tuple[TextModel, TextDataset]:
    return _victim("smollm2-135m", "lm")


@pytest.fixture(scope="session")
def minilm() -> tuple[TextModel, TextDataset]:
    return _victim("minilm", "classify", 16)


def test_minilm_is_the_pretrained_encoder_with_its_tokenizer_as_shipped(minilm) -> None:
    net, data = minilm
    tok = data.info.checked_tokenizer
    assert (net.architecture, net.family, tok.vocab_size) == ("encoder", "bert", 30522)
    assert net.base_config().hidden_size == 384 and net.base_config().num_hidden_layers == 6
    # the shipped tokenizer.json pads and cuts to 128; on load both are off
    assert tok.backend.padding is None and tok.backend.truncation is None
    long, short = data.tokens[0].tolist(), data.tokens[1].tolist()
    assert data.cut[0] and not data.cut[1]
    assert long[0] == tok.start_id and long[-1] == tok.end_id  # [SEP] closes a cut sentence
    assert tok.end_id in short and short[-1] == tok.pad_id
    assert data.texts[1] == "“Who are you?” said the Caterpillar."
    assert tok.decode(short).startswith("“ who are you? ” said the caterpillar")  # uncased
    logits = net(data.tokens[:2])
    assert logits.shape == (2, 3) and torch.isfinite(logits).all()


def test_smollm2_is_the_pretrained_decoder_and_completes_a_sentence(smollm2) -> None:
    net, data = smollm2
    tok = data.info.checked_tokenizer
    assert (net.architecture, net.family, tok.vocab_size) == ("decoder", "llama", 49152)
    assert net.tied_head() and net.base_config().hidden_size == 576
    assert sum(p.numel() for p in net.parameters()) == 134_515_008
    ids = tok.encode(["The quick brown fox jumps over the lazy"], 16)
    length = int((ids[0] != tok.pad_id).sum()) + 1  # the start token is the pad id too
    with torch.no_grad():
        logits = net(ids[:, :length])
    assert tok.decode([int(logits[0, :, -1].argmax())]) == "dog"


def test_pretrained_models_refuse_the_wrong_task(minilm, smollm2) -> None:
    with pytest.raises(ModelError, match="language model"):
        build_text_model("smollm2-135m", minilm[1].info)
    with pytest.raises(ModelError, match="no option"):
        build_text_model("minilm:hidden=8", minilm[1].info)


def test_dager_recovers_a_smollm2_batch_exactly(smollm2) -> None:
    net, data = smollm2
    x, y = data.tokens[:2], data.labels[:2]
    observation = observe_text(net, x, y, data.info)
    attack = attack_class("dager")()
    found = attack.recover(observation, device=torch.device("cpu"), seed=0, progress=None)
    tok = data.info.checked_tokenizer
    assert sorted(tok.decode(s) for s in found.sequences) == \
        sorted(tok.decode(r.tolist()) for r in x)
    assert found.extras["certified"] == 2 and not found.extras["truncated"]


def test_smollm2_as_lamps_prior_prefers_the_sentence_to_its_shuffle(minilm) -> None:
    from fedleak.attacks.text.lamp.model_prior import ModelPrior
    from fedleak.harness.attacker.text.language_prior import pretrained_prior

    _, data = minilm  # candidates in MiniLM's WordPiece ids, scored by SmolLM2's BPE
    tok = data.info.checked_tokenizer
    sentence = tok.encode(["Alice was beginning to get very tired of sitting by her sister."],
                          16)[0]
    content = int((sentence != tok.pad_id).sum())
    shuffled = sentence.clone()
    shuffled[1:content - 1] = sentence[1:content - 1].flip(0)
    prior = ModelPrior(pretrained_prior(tok), tok.vocab_size)
    nll = prior.nll(torch.stack([sentence, shuffled]), (torch.stack([sentence, shuffled])
                                                        != tok.pad_id).long())
    assert nll.shape == (2,) and float(nll[0]) + 1.0 < float(nll[1])


def test_dagers_full_span_warning_names_noise_below_the_hidden_size() -> None:
    from fedleak.attacks.text.dager.layer_search import full_span_warning
    from fedleak.attacks.text.dager.span_check import InputSpan

    full = InputSpan(basis=torch.eye(8, dtype=torch.float64),
                     singular_values=torch.ones(8, dtype=torch.float64), rank=8, input_dim=8)
    assert "noise" in full_span_warning((full, full), 1, 4)  # B·T = 4 < d = 8
    assert "B·T ≥ d" in full_span_warning((full, full), 4, 4)
