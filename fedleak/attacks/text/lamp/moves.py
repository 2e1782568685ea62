"""LAMP's discrete steps (Balunović et al. 2022).

Candidate reorderings of one sentence's embeddings, each scored by the gradient distance plus the
language-model prior.

A candidate permutes the free positions (unmasked, not a known token such as [CLS]) of one
sentence by one of the paper's transformations: swap two tokens; move one token elsewhere;
move a span elsewhere; move a prefix to the end (a rotation). The continuous embeddings are
permuted, not re-projected, so a discrete step keeps what the continuous steps learnt.
"""

from __future__ import annotations

import torch

MOVES = ("swap", "move-token", "move-span", "rotate")


def reorder(free: list[int], kind: str, generator: torch.Generator) -> list[int]:
    """Return the free positions ``free`` (in order) rearranged by one move of ``kind``.

    The position each slot now reads from.
    """
    n = len(free)
    if n < 2:
        return list(free)

    def draw(high: int) -> int:
        return int(torch.randint(high, (1,), generator=generator))

    order = list(free)
    if kind == "swap":
        i, j = draw(n), draw(n - 1)
        j += j >= i
        order[i], order[j] = order[j], order[i]
    elif kind == "move-token":
        i = draw(n)
        token = order.pop(i)
        order.insert(draw(n), token)
    elif kind == "move-span":
        i = draw(n)
        j = i + 1 + draw(n - i)
        span, rest = order[i:j], order[:i] + order[j:]
        k = draw(len(rest) + 1)
        order = rest[:k] + span + rest[k:]
    elif kind == "rotate":
        k = 1 + draw(n - 1)
        order = order[k:] + order[:k]
    else:
        raise ValueError(f"unknown move {kind!r}; choose one of {', '.join(MOVES)}")
    return order


def candidates(embeddings: torch.Tensor, free: list[list[int]], count: int,
               generator: torch.Generator) -> list[torch.Tensor]:
    """Return ``count`` copies of ``embeddings``, each reordered by a random move.

    ``count`` copies of ``embeddings`` [B, T, d], each with one sentence's free positions reordered
    by a random move.
    """
    rows = [b for b, f in enumerate(free) if len(f) >= 2]
    out: list[torch.Tensor] = []
    if not rows:
        return out
    for _ in range(count):
        b = rows[int(torch.randint(len(rows), (1,), generator=generator))]
        kind = MOVES[int(torch.randint(len(MOVES), (1,), generator=generator))]
        order = reorder(free[b], kind, generator)
        new = embeddings.clone()
        new[b, free[b]] = embeddings[b, order]
        out.append(new)
    return out
