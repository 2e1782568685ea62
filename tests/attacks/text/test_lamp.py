"""LAMP and TAG in process: on a small random GPT-2 (hidden 32, one layer, vocabulary of 99
words) they find more of a sentence's tokens than chance and end far closer to the observed
gradient than where they started; the bigram prior prefers the text it was counted from; bad
input is refused with a message naming what to change. Few iterations, one torch thread.
"""

from __future__ import annotations

import pytest
import torch

from fedleak.attacks.text.lamp.bigram_prior import BigramPrior
from fedleak.attacks.text.lamp.inversion import LampConfig, invert_text, tag_config
from fedleak.attacks.text.lamp.matching import gradient_distance, nearest_tokens
from tests import text_attack_models as tm

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LENGTH = 6


def decoder_round(seed: int) -> tuple[torch.nn.Module, torch.Tensor, list[torch.Tensor]]:
    model = tm.gpt2(hidden=32, layers=1, seed=seed)
    ids = tm.sentences(1, LENGTH, start=40 + 9 * seed)
    return model, ids, list(tm.ordered(model, tm.gradients(model, ids)))


def own_labels(mask: torch.Tensor):  # type: ignore[no-untyped-def]
    """A causal LM's labels are its own tokens."""
    return lambda tokens: tokens.masked_fill(mask == 0, -100)


@pytest.mark.parametrize("name", ["lamp", "tag"])
def test_gradient_matching_recovers_more_than_chance(name: str) -> None:
    """Over three rounds, at least 2 of 18 tokens in place (chance: 18/99 ≈ 0.2 expected);
    every run ends below its random start's distance."""
    prior = BigramPrior([tm.sentences(1, 170)[0]], len(tm.vocabulary()))
    config = LampConfig(iterations=150, learning_rate=0.05) if name == "lamp" else \
        tag_config(iterations=150, learning_rate=0.02)
    correct = 0
    for seed in range(3):
        model, ids, observed = decoder_round(seed)
        mask = torch.ones_like(ids)
        vocabulary = model.get_input_embeddings().weight.detach()
        result = invert_text(tm.replay(model), observed, vocabulary, mask, own_labels(mask),
                             config, prior=prior)
        correct += int((result.tokens == ids).sum())
        assert result.objective < result.start_objective
        assert result.iterations == 150
        assert result.evaluations >= 150 + config.initialisations
    assert correct >= 2


def test_the_bigram_prior_prefers_the_text_it_counted() -> None:
    text = tm.sentences(1, 170)[0]
    prior = BigramPrior([text], len(tm.vocabulary()))
    window = text[20:40][None]
    shuffled = window[:, torch.randperm(20, generator=torch.Generator().manual_seed(0))]
    assert float(prior.nll(window)) < float(prior.nll(shuffled)) - 1.0
    assert prior.transitions == 169


def test_distances_and_projection() -> None:
    a = [torch.ones(3), torch.zeros(2)]
    assert float(gradient_distance(a, a, "cosine")) == pytest.approx(0.0, abs=1e-6)
    assert float(gradient_distance(a, [-a[0], a[1]], "cosine")) == pytest.approx(2.0, abs=1e-6)
    assert float(gradient_distance(a, a, "tag")) == 0.0
    table = torch.eye(4)
    assert nearest_tokens(torch.tensor([[0.9, 0.1, 0, 0]]), table).tolist() == [0]
    assert nearest_tokens(torch.tensor([[0.9, 0.1, 0, 0]]), table,
                          allowed=torch.tensor([2, 3])).tolist() == [2]


def test_gradient_matching_refuses_bad_input() -> None:
    model, ids, observed = decoder_round(0)
    mask = torch.ones_like(ids)
    vocabulary = model.get_input_embeddings().weight.detach()
    labels = own_labels(mask)
    with pytest.raises(ValueError, match="objective"):
        LampConfig(objective="psnr")
    with pytest.raises(ValueError, match="iterations"):
        LampConfig(iterations=0)
    with pytest.raises(ValueError, match="prior"):
        invert_text(tm.replay(model), observed, vocabulary, mask, labels, LampConfig())
    with pytest.raises(ValueError, match="template"):
        invert_text(tm.replay(model), observed, vocabulary, mask, labels, tag_config(),
                    template=torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="aligned"):
        invert_text(tm.replay(model), observed[:-1], vocabulary, mask, labels,
                    tag_config(iterations=1))
    with pytest.raises(ValueError, match="outside"):
        BigramPrior([torch.tensor([0, 500])], 99)
