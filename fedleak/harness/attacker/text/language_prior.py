"""A pretrained language model the server holds, as LAMP's prior over the victim's token ids.

:func:`pretrained_prior` loads one of the zoo's pretrained decoders
(:mod:`fedleak.harness.zoo.text.pretrained`, by default ``smollm2-135m``) with its own
tokenizer and returns ``score(tokens, mask) → [N]``: each candidate sentence of the victim's
ids is decoded with the *victim's* tokenizer, re-encoded with the prior's (a WordPiece encoder
scored by a byte-level BPE decoder, as LAMP scores BERT candidates with GPT-2), and scored by
its mean next-token cross-entropy (log-perplexity) after the prior's start token. The server
holds this model; the victim never sees it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from fedleak.harness.zoo.text.pretrained import PRETRAINED_MODELS, pretrained_folder
from fedleak.harness.zoo.text.text_datasets import LANGUAGE_MODEL, TextInfo
from fedleak.harness.zoo.text.text_models import build_text_model
from fedleak.harness.zoo.text.tokenizer import TextTokenizer, load_tokenizer

PriorScore = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]


def pretrained_prior(victim: TextTokenizer, name: str = "smollm2-135m",
                     max_tokens: int = 64) -> PriorScore:
    """The log-perplexity scorer of pretrained decoder ``name`` over ``victim``'s ids."""
    source = PRETRAINED_MODELS.get(name)
    if source is None or source.task != LANGUAGE_MODEL:
        decoders = [n for n, s in PRETRAINED_MODELS.items() if s.task == LANGUAGE_MODEL]
        raise ValueError(f"the prior must be a pretrained language model: one of "
                         f"{', '.join(decoders)}; got {name!r}")
    own = load_tokenizer(pretrained_folder(name))
    info = TextInfo(name=name, shape=(max_tokens,), num_classes=own.vocab_size, mean=(),
                    std=(), class_names=(), seq_len=max_tokens, task=LANGUAGE_MODEL,
                    tokenizer=own)
    model = build_text_model(name, info).eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)

    def score(tokens: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        rows = tokens.tolist() if mask is None else \
            [[t for t, m in zip(r, k, strict=True) if m] for r, k in
             zip(tokens.tolist(), mask.tolist(), strict=True)]
        texts = [victim.decode(r) for r in rows]
        ids = own.encode(texts, max_tokens)
        labels = torch.full_like(ids, -100)
        real = ids != own.pad_id
        real[:, 0] = True  # the start token (the prior's pad id, too) is content
        labels[:, :-1] = torch.where(real[:, 1:], ids[:, 1:], -100)
        with torch.no_grad():
            logits = model(ids.to(next(model.parameters()).device))
        loss = F.cross_entropy(logits.float().cpu(), labels, reduction="none")
        counted = (labels != -100).sum(dim=1).clamp_min(1)
        return loss.sum(dim=1) / counted

    return score
