"""Token-set recovery (Melis et al. 2019): exact on undefended updates, from rows or the span."""

from __future__ import annotations

import pytest
import torch

from fedleak.attacks import create_attack
from fedleak.defenses import build_chain, parse_defense_spec
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.federated.text_observe import observe_text
from fedleak.harness.metrics.text_metrics import token_set_score
from fedleak.harness.zoo.text.text_datasets import load_text_dataset
from fedleak.harness.zoo.text.text_models import build_text_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
LM = load_text_dataset("shakespeare", "test", seq_len=32)
CLS = load_text_dataset("shakespeare", "test", task="classify", seq_len=32)


def recovered(spec: str, data: object, method: str = "auto", n: int = 6,
              protocol: Protocol | None = None, defense: str | None = None
              ) -> tuple[float, float, str]:
    torch.manual_seed(0)
    net = build_text_model(spec, data.info)  # type: ignore[attr-defined]
    x, y = data.tokens[:n], data.labels[:n]  # type: ignore[attr-defined]
    chain = build_chain([parse_defense_spec(defense)]) if defense else None
    observation = observe_text(net, x, y, data.info, protocol,  # type: ignore[attr-defined]
                               defenses=chain, generator=torch.Generator().manual_seed(0))
    found = create_attack("token-set", {"method": method}).reconstruct(observation)
    tok = data.info.checked_tokenizer  # type: ignore[attr-defined]
    truth = [tok.text_tokens(row) for row in x.tolist()]
    score = token_set_score(truth, found.token_set or [])
    return score.precision, score.recall, found.extras["method"]


@pytest.mark.parametrize(("spec", "data", "method"), [
    ("gpt2:hidden=64,heads=2", LM, "rows"),             # untied: embedding rows + head labels
    ("gpt2:hidden=256,heads=4,tied=true", LM, "span"),  # tied head: the first layer's span
    ("bert:hidden=64,heads=2", CLS, "rows"),
])
def test_exact_on_undefended_fedsgd(spec: str, data: object, method: str) -> None:
    assert recovered(spec, data) == (1.0, 1.0, method)


def test_exact_on_a_fedavg_delta() -> None:
    protocol = Protocol(kind="fedavg", local_epochs=2, batch_size=3, learning_rate=0.01)
    assert recovered("gpt2:hidden=64,heads=2", LM, protocol=protocol)[:2] == (1.0, 1.0)


def test_the_last_token_needs_the_head() -> None:
    """A sequence cut at T: its last token is visible only as a label (the head's rows)."""
    torch.manual_seed(0)
    net = build_text_model("gpt2:hidden=64,heads=2", LM.info)
    x, y = LM.tokens[:6], LM.labels[:6]
    observation = observe_text(net, x, y, LM.info)
    without = create_attack("token-set", {"labels": False}).reconstruct(observation)
    tok = LM.info.checked_tokenizer
    truth = [tok.text_tokens(row) for row in x.tolist()]
    assert token_set_score(truth, without.token_set or []).precision == 1.0
    only_last = {row[-1] for row in x.tolist() if row[-1] != tok.pad_id} - \
        {t for row in x.tolist() for t in row[:-1]}
    assert only_last and not only_last & set(without.token_set or [])


def test_dp_sgd_leaves_no_token_set() -> None:
    precision, recall, _ = recovered("gpt2:hidden=64,heads=2", LM,
                                     defense="dpsgd:noise-multiplier=1,max-grad-norm=1")
    assert recall < 0.2


def test_lora_updates_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="LoRA"):
        recovered("gpt2:hidden=64,heads=2,lora=2", LM)
