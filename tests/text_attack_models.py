"""Small random transformers, a public-domain text and an autograd replay for the in-process
tests of the text attacks (DAGER, LAMP, TAG). Nothing is downloaded: models come from
``transformers`` configs with random weights; the text is the Zen of Python (the ``this``
module), split into words and numbered by first appearance.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import re
from collections.abc import Sequence

import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import transformers  # noqa: E402

PAD, UNK, CLS, SEP = 0, 1, 2, 3
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]


def zen_words() -> list[str]:
    """The Zen of Python as a list of words and punctuation marks."""
    with contextlib.redirect_stdout(io.StringIO()):  # importing ``this`` prints the poem
        import this
    text = codecs.decode(this.s, "rot13")
    return re.findall(r"[A-Za-z']+|[^\sA-Za-z']", text)


def vocabulary() -> list[str]:
    """The special tokens, then every word of the text in order of first appearance."""
    return SPECIAL + list(dict.fromkeys(zen_words()))


def sentences(count: int, length: int, start: int = 0, step: int = 7) -> torch.Tensor:
    """``count`` windows of ``length`` token ids of the text, ``step`` words apart."""
    ids = {w: i for i, w in enumerate(vocabulary())}
    words = torch.tensor([ids[w] for w in zen_words()])
    return torch.stack([words[start + k * step:start + k * step + length] for k in range(count)])


def gpt2(hidden: int = 64, layers: int = 2, vocab: int | None = None, seed: int = 0,
         classifier: bool = False) -> nn.Module:
    """A random GPT-2 (language model, or two-class classifier) without dropout, with eager
    attention (PyTorch's fused CPU attention has no second derivative, which gradient
    matching needs)."""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_embd=hidden, n_layer=layers, n_head=4, n_positions=64,
        vocab_size=vocab or len(vocabulary()), resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, num_labels=2, pad_token_id=PAD, bos_token_id=CLS, eos_token_id=SEP,
        attn_implementation="eager")
    model = transformers.GPT2ForSequenceClassification(config) if classifier else \
        transformers.GPT2LMHeadModel(config)
    return model.eval()


def bert(hidden: int = 64, layers: int = 2, vocab: int | None = None, seed: int = 0
         ) -> nn.Module:
    """A random two-class BERT classifier without dropout, with eager attention."""
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
        intermediate_size=4 * hidden, vocab_size=vocab or len(vocabulary()),
        max_position_embeddings=64, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, num_labels=2, pad_token_id=PAD,
        attn_implementation="eager")
    return transformers.BertForSequenceClassification(config).eval()


def with_markers(ids: torch.Tensor) -> torch.Tensor:
    """``[CLS] ids [SEP]`` for every row."""
    count = ids.shape[0]
    return torch.cat([torch.full((count, 1), CLS), ids, torch.full((count, 1), SEP)], dim=1)


def loss_of(model: nn.Module, inputs: dict[str, torch.Tensor],
            labels: torch.Tensor) -> torch.Tensor:
    """The user's loss: a causal LM's mean next-token cross-entropy (padding −100), or the
    classifier's cross-entropy."""
    out = model(**inputs, labels=labels)
    return out.loss


def gradients(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor | None = None,
              mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The FedSGD gradient of ``model`` on the batch ``ids`` by parameter name (a causal LM's
    labels are its tokens, padding −100)."""
    mask = torch.ones_like(ids) if mask is None else mask
    if labels is None:
        labels = ids.masked_fill(mask == 0, -100)
    loss = loss_of(model, {"input_ids": ids, "attention_mask": mask}, labels)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    return dict(zip(names, torch.autograd.grad(loss, params), strict=True))


def matched(model: nn.Module) -> list[str]:
    """The parameters gradient matching compares: all but the input embedding (whose gradient
    a replay on continuous embeddings cannot give; its rows are the token-set attack's)."""
    embedding = model.get_input_embeddings().weight
    return [n for n, p in model.named_parameters() if p.requires_grad and p is not embedding]


def replay(model: nn.Module):  # type: ignore[no-untyped-def]
    """``replay(inputs_embeds, attention_mask, labels) -> gradients`` with a graph, of the
    :func:`matched` parameters in model order."""
    names = set(matched(model))
    params = [p for n, p in model.named_parameters() if n in names]

    def run(embeds: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor
            ) -> list[torch.Tensor]:
        loss = loss_of(model, {"inputs_embeds": embeds, "attention_mask": mask}, labels)
        return list(torch.autograd.grad(loss, params, create_graph=True))

    return run


def ordered(model: nn.Module, named: dict[str, torch.Tensor]) -> Sequence[torch.Tensor]:
    """The :func:`matched` gradients of ``named``, in model order."""
    return [named[n] for n in matched(model)]
