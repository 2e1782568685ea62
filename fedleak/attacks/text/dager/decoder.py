"""DAGER's greedy search for decoders (Petrov et al. 2024).

In a causal model the second span's input at position i, ``h_i(x_{≤i})``, depends on the
prefix only. Starting from the empty prefix, every live prefix ``x_{<i}`` is extended by every
token c of the position's filtered set ``S_i`` (:func:`~fedleak.attacks.text.dager.layer_search
.token_candidates`), and an extension lives on iff

    d₂(h_i(x_{<i} c)) < τ₂                                   (the second span check)

A prefix none of whose extensions passes is a whole sentence (its next position holds padding,
which has no δ). All sentences of the batch survive (they are in the span exactly); a wrong
extension survives only by a coincidence of measure zero while B·T < d. Position 0 is special:
``h_0`` is a function of one token, as the first span's input is, so at random initialisation
(see :mod:`dager`, sharp edges) every token of the batch passes there and the pairs at position
1 decide. Of more than ``batch_size`` sentences found, those with the smallest span distances
are kept.

For a causal language model the recovered prefixes lack each sentence's last token (no loss
follows it, so its δ is zero in every layer); :func:`~fedleak.attacks.text.dager.last_token
.last_tokens` reads it from the final LayerNorm's gradient.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fedleak.attacks.text.dager.causal_extension import extension_inputs
from fedleak.attacks.text.dager.configuration import DagerConfig, DagerResult, Work
from fedleak.attacks.text.dager.span_check import InputSpan
from fedleak.attacks.text.transformer_layout import TransformerLayout


def search_decoder(layout: TransformerLayout, span: InputSpan, candidates: list[torch.Tensor],
                   batch_size: int, config: DagerConfig, work: Work, result: DagerResult,
                   gradients: Mapping[str, torch.Tensor]) -> None:
    """Fill ``result`` with the sentences the greedy search recovers (module docstring)."""
    prefixes = torch.zeros(1, 0, dtype=torch.long)
    scores = torch.zeros(1, dtype=torch.float64)
    finished: list[tuple[list[int], float]] = []
    for position, options in enumerate(candidates):
        if work.exhausted:
            break
        h = extension_inputs(layout, prefixes, options)
        distance = span.distance(h).cpu()
        work.add(distance.numel())
        passed = distance < config.l2_threshold
        for row in torch.nonzero(~passed.any(dim=1)).flatten().tolist():
            if position > 0:
                finished.append((prefixes[row].tolist(), float(scores[row])))
        rows, cols = torch.nonzero(passed, as_tuple=True)
        if rows.numel() == 0:
            prefixes, scores = prefixes[:0], scores[:0]
            break
        worst = torch.maximum(scores[rows], distance[rows, cols])
        order = torch.argsort(worst)
        if order.numel() > config.max_prefixes:
            result.truncated = True
            result.warnings.append(
                f"{order.numel()} prefixes passed at position {position}, more than "
                f"max_prefixes={config.max_prefixes}: the nearest were kept")
            order = order[:config.max_prefixes]
        rows, cols, scores = rows[order], cols[order], worst[order]
        prefixes = torch.cat([prefixes[rows], options[cols][:, None]], dim=1)
    finished += [(p.tolist(), float(s)) for p, s in zip(prefixes, scores, strict=True)]
    finished.sort(key=lambda item: item[1])
    kept = finished[:batch_size]
    if len(finished) > batch_size:
        result.warnings.append(f"{len(finished)} sentences passed, more than the batch's "
                               f"{batch_size}: the {batch_size} nearest the span were kept")
    sentences = [tokens for tokens, _ in kept]
    result.scores = [score for _, score in kept]
    result.certified = [score < config.l2_threshold for score in result.scores]
    if layout.next_token and sentences:
        from fedleak.attacks.text.dager.last_token import FITTED, last_tokens

        tokens, fit = last_tokens(layout, gradients, sentences)
        sentences = [s + [t] for s, t in zip(sentences, tokens, strict=True)]
        if fit > FITTED:
            result.certified = [False] * len(sentences)
            result.warnings.append(
                f"the last tokens explain the final LayerNorm's gradient only up to a relative "
                f"residual of {fit:.2g}: a sentence is missing or wrong, so the last tokens "
                "are a best guess")
    result.sentences = sentences
    if len(sentences) < batch_size:
        result.warnings.append(f"{len(sentences)} of {batch_size} sentences recovered "
                               "(identical sentences count once)")
