"""The registered text attacks on a TextObservation built by the harness: DAGER exact on a
decoder, LAMP and TAG within their budget, refusals that name the reason."""

from __future__ import annotations

import pytest
import torch

from fedleak.attacks import attack_class, create_attack
from fedleak.attacks.base import UpdateSetting
from fedleak.attacks.text.lamp.named_attacks import sentence_length
from fedleak.attacks.text_observation import TextObservation
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.federated.text_observe import observe_text
from fedleak.harness.metrics.text_metrics import score_sentences
from fedleak.harness.zoo.text.text_datasets import load_text_dataset
from fedleak.harness.zoo.text.text_models import build_text_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
LM = load_text_dataset("shakespeare", "test", seq_len=16)


def observed(spec: str = "gpt2:hidden=128,heads=4", rows: int = 2,
             protocol: Protocol | None = None) -> TextObservation:
    torch.manual_seed(0)
    model = build_text_model(spec, LM.info)
    public = [[t for t in row if t] for row in
              load_text_dataset("shakespeare", "train", seq_len=16).tokens[:200].tolist()]
    return observe_text(model, LM.tokens[:rows], LM.labels[:rows], LM.info, protocol,
                        public_sequences=public)


def rouge(observation: TextObservation, sequences: list[list[int]],
          padding: list[int]) -> tuple[float, float, int]:
    tok = LM.info.checked_tokenizer
    truth = [tok.text_tokens(row) for row in LM.tokens[:observation.num_sequences].tolist()]
    score = score_sentences(truth, [tok.text_tokens(s) for s in sequences], tok.decode, padding)
    return score.rouge1, score.rouge2, score.exact


def test_dager_recovers_the_decoders_batch_exactly() -> None:
    observation = observed()
    found = create_attack("dager").reconstruct(observation)
    assert rouge(observation, found.sequences, found.padding) == (1.0, 1.0, 2)
    assert found.extras["certified"] == 2 and not found.extras["truncated"]
    assert found.iterations > 0  # work: sentence evaluations
    assert attack_class("dager").unsuited(UpdateSetting("delta", 4, 2)) is not None


@pytest.mark.parametrize("name", ["lamp", "tag"])
def test_lamp_and_tag_return_a_sentence_per_private_one(name: str) -> None:
    observation = observed()
    found = create_attack(name, {"iterations": 20, "discrete_every": 10}
                          if name == "lamp" else {"iterations": 20}).reconstruct(observation)
    assert len(found.sequences) == 2 and found.iterations >= 20
    assert found.extras["token_set"]
    assert found.extras["prior"] == ("bigram" if name == "lamp" else "none")
    r1, _, _ = rouge(observation, found.sequences, found.padding)
    assert 0.0 < r1 <= 1.0  # the token set alone puts batch words in every sentence


def test_the_longest_sentence_is_read_off_the_position_gradient() -> None:
    observation = observed(rows=3)
    true = max(int((row != 0).sum()) for row in LM.tokens[:3])
    assert sentence_length(observation) == true


def test_lora_updates_are_refused_by_dager() -> None:
    with pytest.raises(ValueError, match="LoRA"):
        create_attack("dager").reconstruct(observed("gpt2:hidden=128,heads=4,lora=2"))
