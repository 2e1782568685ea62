"""A bigram language-model prior for text reconstructions, counted from public token sequences.

LAMP (Balunović et al., NeurIPS 2022, arXiv 2202.08827) scores its discrete candidates with a
language model's perplexity (GPT-2 in the paper). Nothing is downloaded here, so the prior is
a bigram model counted from public text the caller tokenises with the victim's tokenizer (text
the attack is not evaluated on), with add-k smoothing:

    P(w' | w) = (c(w, w') + k) / (c(w) + k V),      L_lm(s) = −(1/(T−1)) Σ_t log P(s_{t+1} | s_t),

the mean negative log-likelihood per transition (log-perplexity). A model of the victim's own
random initialisation would be no prior at all, which is why a counted one is used.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class BigramPrior:
    """Add-k smoothed bigram log-probabilities counted from public text.

    Add-k smoothed bigram log-probabilities over a vocabulary of ``vocab_size`` ids, counted from
    ``sequences`` (token id sequences of public text); stored sparsely (the pairs seen).
    """

    def __init__(self, sequences: Iterable[torch.Tensor | list[int]], vocab_size: int,
                 smoothing: float = 0.1) -> None:
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2; got {vocab_size}")
        if smoothing <= 0:
            raise ValueError(f"smoothing must be positive (add-k); got {smoothing}")
        keys = []
        for seq in sequences:
            ids = torch.as_tensor(seq, dtype=torch.long).flatten()
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
                raise ValueError(f"a sequence holds ids outside 0..{vocab_size - 1}: tokenise "
                                 "the public text with the victim's tokenizer")
            if ids.numel() > 1:
                keys.append(ids[:-1] * vocab_size + ids[1:])
        if not keys:
            raise ValueError("the public text gave no bigram (every sequence shorter than two "
                             "tokens)")
        pairs, counts = torch.unique(torch.cat(keys), return_counts=True)
        self.pairs = pairs
        self.counts = counts.double()
        self.context = torch.zeros(vocab_size, dtype=torch.float64).index_add_(
            0, pairs // vocab_size, self.counts)
        self.vocab_size = vocab_size
        self.smoothing = smoothing
        self.transitions = int(counts.sum())

    def log_prob(self, previous: torch.Tensor, following: torch.Tensor) -> torch.Tensor:
        """``log P(following | previous)``, elementwise over equal-shaped id tensors."""
        key = (previous * self.vocab_size + following).cpu()
        at = torch.searchsorted(self.pairs, key).clamp_max(self.pairs.numel() - 1)
        seen = self.pairs[at] == key
        count = torch.where(seen, self.counts[at], torch.zeros_like(self.counts[at]))
        k = self.smoothing
        out = torch.log((count + k) / (self.context[previous.cpu()] + k * self.vocab_size))
        return out.float().to(previous.device)

    def nll(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Return ``L_lm`` per sentence of ``tokens`` [N, T].

        ``L_lm`` per sentence of ``tokens`` [N, T] (only transitions between two unmasked tokens
        count): [N].
        """
        step = self.log_prob(tokens[:, :-1], tokens[:, 1:])
        keep = torch.ones_like(step) if mask is None else \
            (mask[:, :-1] * mask[:, 1:]).to(step.dtype)
        return -(step * keep).sum(dim=1) / keep.sum(dim=1).clamp_min(1)
