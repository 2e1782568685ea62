"""A pretrained language model as LAMP's prior: the perplexity of each candidate sentence.

LAMP (Balunović et al., NeurIPS 2022, arXiv 2202.08827, Sec. 4.2) ranks its discrete candidates
by ``L_rec + α_lm L_lm`` with ``L_lm`` the candidate's log-perplexity under a pretrained
language model (GPT-2 for BERT victims in the paper):

    L_lm(s) = −(1/(n−1)) Σ_{t=1}^{n−1} log P_LM(w_{t} | w_{<t}),

``w`` the candidate's text re-tokenised with the *prior's* tokenizer (the victim's may differ:
a WordPiece encoder attacked with a byte-level BPE decoder's prior). The attack sees only a
callable ``score(tokens, mask) → [N]`` that does the re-tokenising and the forward; the harness
builds one from a model it holds (:mod:`fedleak.harness.attacker.text.language_prior`), so
this room stays torch only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

#: ``score(tokens [N, T] of the victim's vocabulary, mask [N, T]) → log-perplexity [N]``
SentenceScore = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]


class ModelPrior:
    """LAMP's language-model prior from a scoring callable (module docstring).

    The same interface as :class:`~fedleak.attacks.text.lamp.bigram_prior.BigramPrior`.
    """

    def __init__(self, score: SentenceScore, vocab_size: int, name: str = "model") -> None:
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2; got {vocab_size}")
        self.score = score
        self.vocab_size = vocab_size
        self.name = name

    def nll(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``L_lm`` per sentence of ``tokens`` [N, T] (masked positions dropped): [N]."""
        with torch.no_grad():
            out = self.score(tokens, mask)
        if out.shape != tokens.shape[:1]:
            raise ValueError(f"the prior's score returned shape {tuple(out.shape)}; expected "
                             f"one value per sentence ({tokens.shape[0]})")
        return out.float().to(tokens.device)
