"""Peel recovered sentences off a FedSGD gradient: the rest of the batch's gradient.

The update of one FedSGD round on a batch of B sentences is the gradient of the mean loss,

    G = (1/B) Σ_s ∇_θ ℓ(s, y_s),

a sum of one term per sentence (a transformer couples no two sentences of a batch: no batch
statistics, padding masked). The server holds the model, so once DAGER has recovered a
sentence s exactly it can compute that sentence's own term, up to its label y_s, and subtract
it: ``G − (1/B) ∇ℓ(s, y)`` is the gradient of the other B − 1 sentences alone, on which every
span and the first-layer split (:mod:`position_split`) hold for fewer, shorter inputs (fewer
repeated tokens, more of them pinned; a second span without s's ℓ vectors, so no search is
drawn back to s).

**The label** is read from the second span. With the right label the layer-one weight
gradient of s leaves exactly, and the rank of the stacked second-layer gradient
``Σ_i δ_i x_iᵀ`` falls by the ℓ vectors x_i of s (its tokens' δ_i are gone); with a wrong one
the difference ``Σ_{i∈s} (δ_i(y) − δ_i(y_s)) x_iᵀ`` stays in the gradient and the rank does
not fall at all (measured on MiniLM at 8 × 32: 204 → 172 for a 32-token sentence with its
label, 204 for both wrong labels; 204 → 180 for 24 tokens). A sentence is peeled with the
label whose residual has the smallest rank, and only when that rank fell by at least half the
sentence's length (else — a defense, several local steps, a loss not the mean over the batch —
nothing is peeled and the search goes on as without).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import torch

from fedleak.attacks.text.dager.span_check import NOISE_FACTOR, InputSpan, left_singular

#: ``sentence_gradient(tokens, label)``: the gradient by parameter name of one sentence's loss
#: alone (a batch of one), oriented like the update's gradients
SentenceGradient = Callable[[list[int], int], Mapping[str, torch.Tensor]]
#: the layer-one weight gradients (input dimension first) of a gradient by name
LayerGradients = Callable[[Mapping[str, torch.Tensor]], Sequence[torch.Tensor]]


def singular_values(layer: LayerGradients, gradients: Mapping[str, torch.Tensor]
                    ) -> torch.Tensor:
    """Return the singular values of a layer's stacked weight gradients, descending."""
    stacked = torch.cat([g.detach().to(torch.float64).cpu() for g in layer(gradients)], dim=1)
    return left_singular(stacked)[1]


def span_rank(layer: LayerGradients, gradients: Mapping[str, torch.Tensor],
              scale: float | None = None) -> int:
    """Return the rank of a layer's stacked weight gradients above float32 rounding noise.

    The singular values above ``NOISE_FACTOR·ε·scale`` (ε of float32; ``scale`` the largest
    singular value of the whole batch's gradient, default this one's): a residual is measured
    against the noise of the gradient it was cut from, so an emptied one has rank 0.
    """
    s = singular_values(layer, gradients)
    top = float(s[0]) if scale is None else scale
    return int((s > NOISE_FACTOR * torch.finfo(torch.float32).eps * top).sum())


def peel(gradients: Mapping[str, torch.Tensor], sentences: Sequence[list[int]],
         sentence_gradient: SentenceGradient, classes: int, batch_size: int,
         layer: LayerGradients) -> tuple[dict[str, torch.Tensor], list[int | None]]:
    """Subtract each sentence's term ``(1/B) ∇ℓ(s, y)`` from ``gradients`` (module docstring).

    Returns the residual gradients (only the names ``sentence_gradient`` returns are changed)
    and each sentence's label, None where no label made the rank of ``layer`` fall by half the
    sentence's length (that sentence is left in).
    """
    residual = {n: g.detach() for n, g in gradients.items()}
    scale = float(singular_values(layer, residual)[0])
    rank = span_rank(layer, residual, scale)
    labels: list[int | None] = []
    for tokens in sentences:
        best: tuple[int, int, dict[str, torch.Tensor]] | None = None
        for label in range(classes):
            term = sentence_gradient(tokens, label)
            trial = dict(residual)
            for name, g in term.items():
                trial[name] = residual[name] - g.to(residual[name]) / batch_size
            trial_rank = span_rank(layer, trial, scale)
            if best is None or trial_rank < best[0]:
                best = (trial_rank, label, trial)
        if best is not None and rank - best[0] >= max(1, len(tokens) // 2):
            rank, residual = best[0], best[2]
            labels.append(best[1])
        else:
            labels.append(None)
    return residual, labels


class Repinned(NamedTuple):
    """What the search needs again after a peel.

    The rest of the batch's second span, the first-layer split's candidate sets for it, how
    many of each are pinned, the lengths the end token's weights suggest.
    """

    span: InputSpan
    candidates: list[torch.Tensor]
    pinned: list[int]
    lengths: list[int] | None


#: ``repin(found sentences) -> Repinned | None``: the search's sets for the sentences not found
Repin = Callable[[list[list[int]]], Repinned | None]
