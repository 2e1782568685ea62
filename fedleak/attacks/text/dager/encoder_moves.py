"""The moves of DAGER's encoder search (:mod:`~fedleak.attacks.text.dager.encoder`).

Within a shape: replacements ``s_j ← c`` (c ∈ S_j), transpositions ``s_j ↔ s_k`` and the
shifts by one of a run ``s_j … s_k`` (a cyclic rotation, k ≥ j + 2), each with its first-order
gain ``Σ_m ⟨∇_{e_m} f, E_{new_m} − E_{s_m}⟩`` for the screen (:func:`moves`). Across shapes: a
closed sentence one token shorter or longer with its other tokens in order (:func:`indels`).
A token one position off together with the run it sits in (a word dropped or doubled in the
middle of a sentence) is one rotation, where replacements and transpositions need one move
per token of the run, each of which may raise f. :func:`outside` picks the moves over widened
sets that the narrow sets do not allow (the encoder's last stage when stuck).
"""

from __future__ import annotations

import torch

from fedleak.attacks.text.dager.encoder_shapes import Shapes


def indels(shapes: Shapes, sentence: torch.Tensor) -> list[torch.Tensor]:
    """Return the closed sentence one token shorter or longer, its other tokens in order.

    Shorter: any inner token deleted (the rest shifted left); longer: every candidate of the
    new last content position inserted before the end token. With the rotations of the descent
    (:func:`rotations`) a token inserted at the end reaches any position, and any token reaches
    the end to be deleted: the length changes together with the tokens it brings or drops,
    which the cut-or-continue shapes of :meth:`Shapes.reshaped` cannot do.
    """
    if not shapes.closes(sentence):
        return []
    length, end = sentence.numel(), sentence[-1:]
    allowed = set(shapes.options)
    out = []
    if (length - 1, True) in allowed:
        out += [torch.cat([sentence[:j], sentence[j + 1:]]) for j in range(1, length - 1)]
    longer = (length + 1, True) in allowed or (shapes.open_end and length + 1 ==
                                               len(shapes.candidates))
    if longer:
        options = shapes.candidates[length - 1]
        options = options[options != int(end)]
        out += [torch.cat([sentence[:-1], options[i:i + 1], end]) for i in range(options.numel())]
    return out


def moves(sentence: torch.Tensor, sets: list[torch.Tensor], grad: torch.Tensor,
           embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every replacement and transposition as (new sentences [M, ℓ], first-order gain [M])."""
    e = embeddings.to(torch.float64).cpu()
    current = e[sentence]
    variants, gains = [], []
    for j, options in enumerate(sets):
        options = options[options != sentence[j]]
        if options.numel() == 0:
            continue
        gains.append((e[options] - current[j]) @ grad[j])
        block = sentence.repeat(options.numel(), 1)
        block[:, j] = options
        variants.append(block)
    length = sentence.numel()
    allowed = [set(s.tolist()) for s in sets]
    pairs = [(j, k) for j in range(length) for k in range(j + 1, length)
             if sentence[j] != sentence[k] and int(sentence[k]) in allowed[j]
             and int(sentence[j]) in allowed[k]]
    if pairs:
        js, ks = torch.tensor(pairs).T
        delta = current[ks] - current[js]
        gains.append((delta * grad[js]).sum(1) - (delta * grad[ks]).sum(1))
        block = sentence.repeat(len(pairs), 1)
        rows = torch.arange(len(pairs))
        block[rows, js], block[rows, ks] = sentence[ks], sentence[js]
        variants.append(block)
    rotated = rotations(sentence, allowed, current, grad)
    if rotated is not None:
        variants.append(rotated[0])
        gains.append(rotated[1])
    if not variants:
        return sentence[None, :0].long(), torch.zeros(0)
    return torch.cat(variants), torch.cat(gains)


def rotations(sentence: torch.Tensor, allowed: list[set[int]], current: torch.Tensor,
               grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Every cyclic shift by one of a run ``s_j … s_k`` (k ≥ j + 2), as (sentences, gains).

    Left: ``s_m ← s_{m+1}`` (j ≤ m < k), ``s_k ← s_j``; right: ``s_m ← s_{m−1}`` (j < m ≤ k),
    ``s_j ← s_k`` — a token one position off with the run it sits in, which no replacement or
    transposition repairs one token at a time. The first-order gain is
    ``Σ_m ⟨∇_{e_m} f, E_{new_m} − E_{s_m}⟩`` from ``P_ab = ⟨E_{s_a}, ∇_{e_b} f⟩``; a run is
    shifted only where every token it moves is allowed at its new position.
    """
    length = sentence.numel()
    if length < 3:
        return None
    tokens = sentence.tolist()
    product = current @ grad.T  # P[a, b] = <E_{s_a}, ∇_b f>
    own = torch.diagonal(product)
    ahead = torch.diagonal(product, offset=-1)  # P[m+1, m]: s_{m+1} moved to m
    behind = torch.diagonal(product, offset=1)  # P[m−1, m]: s_{m−1} moved to m
    fits = [[tokens[a] in allowed[b] for b in range(length)] for a in range(length)]
    starts, ends, lefts, gains = [], [], [], []
    for j in range(length):
        left_ok = right_ok = True
        for k in range(j + 1, length):
            left_ok = left_ok and fits[k][k - 1]
            right_ok = right_ok and fits[k - 1][k]
            if k < j + 2 or len(set(tokens[j:k + 1])) == 1:
                continue
            base = float(own[j:k + 1].sum())
            if left_ok and fits[j][k]:
                starts.append(j)
                ends.append(k)
                lefts.append(True)
                gains.append(float(ahead[j:k].sum()) + float(product[j, k]) - base)
            if right_ok and fits[k][j]:
                starts.append(j)
                ends.append(k)
                lefts.append(False)
                gains.append(float(behind[j:k].sum()) + float(product[k, j]) - base)
    if not starts:
        return None
    block = sentence.repeat(len(starts), 1)
    for row, (j, k, left) in enumerate(zip(starts, ends, lefts, strict=True)):
        run = sentence[j:k + 1]
        block[row, j:k + 1] = torch.roll(run, -1 if left else 1)
    return block, torch.tensor(gains, dtype=torch.float64)


def blocks(order: torch.Tensor, size: int) -> list[torch.Tensor]:
    """Return ``order`` cut into consecutive blocks of ``size``."""
    return [order[i:i + size] for i in range(0, order.numel(), size)]


def outside(variants: torch.Tensor, sentence: torch.Tensor, sets: list[torch.Tensor]
            ) -> torch.Tensor:
    """Tell which variants [M, ℓ] of ``sentence`` put a token where ``sets`` do not hold it.

    Row i is True when some position m has ``variants[i, m] ≠ sentence[m]`` and
    ``variants[i, m] ∉ sets[m]``: the moves that only the widened sets allow.
    """
    found = torch.zeros_like(variants, dtype=torch.bool)
    for m, options in enumerate(sets):
        found[:, m] = (variants[:, m] != sentence[m]) & ~torch.isin(variants[:, m], options)
    return found.any(dim=1)


def kick(sentence: torch.Tensor, fit: torch.Tensor, sets: list[torch.Tensor],
          generator: torch.Generator) -> torch.Tensor:
    """Redraw the worse-fitting half of the sentence's positions at random.

    The sentence with the worse-fitting half of its positions (largest span distance) redrawn at
    random: a stuck mixture keeps the tokens of the sentence it leans to.
    """
    kicked = sentence.clone()
    for j in torch.argsort(fit, descending=True)[:sentence.numel() // 2].tolist():
        options = sets[j]
        if options.numel():  # a peel can leave a position of an old slot's length empty
            kicked[j] = options[int(torch.randint(len(options), (1,), generator=generator))]
    return kicked
