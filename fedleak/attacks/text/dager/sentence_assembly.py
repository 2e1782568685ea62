"""Assemble an encoder batch's sentences from per-position token sets, all at once.

When the first-layer gradient pins tokens to positions
(:mod:`~fedleak.attacks.text.dager.position_split`), every pinned token belongs to exactly one
sentence at its position. The batch is then assembled as B slots (one per sentence) by block
coordinate descent on the summed second-span objective

    F(s¹, …, s^B) = Σ_k f(s^k),   f(s) = (1/ℓ) Σ_j d₂(h_j(s)),

where slot k has a length ℓ_k and ends with the end token ([SEP]) at ℓ_k − 1 (the longest
length L may also end with a word: a text cut at the batch length). Two kinds of blocks
alternate:

* **a position p**: with everything else fixed, the choice of the tokens at p over the slots
  that hold a word there is a linear assignment (slot k taking token τ changes f(s^k) only),
  solved exactly by the Hungarian method over the columns {the tokens pinned at p, each once and
  required} ∪ {the ``extra`` best other candidates of p, each up to B times}; B·(pinned + extra)
  sentence evaluations;
* **a slot's length**: every length 2..L for the slot's content (cut, or continued with the
  tokens it held there before), the best kept; L sentence evaluations per slot.

F is 0 at the batch and no block raises it (a pinned token dropped by a shorter slot is placed
again by its position's next assignment). The slots start at the longest length, with the
pinned tokens of each position in a random order and the other candidates in the order the split
ranks them. The slots then start the local search of :mod:`encoder`, which certifies them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

#: the cost bonus that makes a pinned token's column required
REQUIRED = 1e6

Distances = Callable[[torch.Tensor], torch.Tensor]


def sentence(row: torch.Tensor, length: int, end: int | None) -> torch.Tensor:
    """Slot content ``row`` [L] at ``length``: closed by ``end`` below L, as it is at L."""
    if length >= row.numel() or end is None:
        return row[:length]
    return torch.cat([row[:length - 1], torch.tensor([end])])


def objective(distances: Distances, sentences: list[torch.Tensor]) -> torch.Tensor:
    """Return f of each sentence (sentences of any lengths, evaluated grouped by length)."""
    values = torch.empty(len(sentences), dtype=torch.float64)
    by_length: dict[int, list[int]] = {}
    for k, s in enumerate(sentences):
        by_length.setdefault(s.numel(), []).append(k)
    for indices in by_length.values():
        batch = torch.stack([sentences[k] for k in indices])
        values[torch.tensor(indices)] = distances(batch).mean(dim=1).to(torch.float64)
    return values


def assemble(distances: Distances, candidates: list[torch.Tensor], pinned: list[int],
             batch_size: int, generator: torch.Generator, end: int | None = None,
             sweeps: int = 6, extra: int | None = None, lengths: list[int] | None = None,
             starts: list[torch.Tensor] | None = None
             ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Return B sentences and f of each (module docstring).

    ``distances(sentences [N, ℓ]) → d₂ [N, ℓ]``; ``candidates[p]`` lists the pinned tokens of
    position p first (``pinned[p]`` of them), then the others, best first; ``end`` the end token;
    ``lengths`` the slots' first lengths (else all L; kept only where every pinned token has a
    slot); ``starts`` sentences the first slots start from (their tokens and lengths, each
    slot's own token staying a column of every assignment), the rest as above.
    """
    extra = 3 * batch_size if extra is None else extra
    width = len(candidates)
    rows = torch.zeros(batch_size, width, dtype=torch.long)
    for p, options in enumerate(candidates):
        words = options if end is None or p == width - 1 else options[options != end]
        words = words if words.numel() else options
        count = min(pinned[p], words.numel())
        order = torch.cat([torch.randperm(count, generator=generator),
                           torch.arange(count, words.numel())])
        rows[:, p] = words[order[torch.arange(batch_size) % words.numel()]]
    first = [width] * batch_size
    if end is not None and lengths is not None and len(lengths) >= batch_size:
        guess = sorted((min(max(n, 2), width) for n in lengths), reverse=True)[:batch_size]
        first = guess if _feasible(guess, pinned) else first
    warm = [s[:width] for s in (starts or [])][:batch_size]
    if warm:
        rest = list(first)
        for s in warm:
            gaps = [abs(n - s.numel()) for n in rest]
            rest.pop(gaps.index(min(gaps)))
        trial = [s.numel() if end is not None and int(s[-1]) == end else width
                 for s in warm] + rest
        for k, s in enumerate(warm):
            rows[k, :s.numel()] = s
        first = trial if _feasible(trial, pinned) else first
    lengths = first
    values = objective(distances, [sentence(r, n, end) for r, n in zip(rows, lengths, strict=True)])
    for _ in range(sweeps):
        before = float(values.sum())
        for p, options in enumerate(candidates):
            rows, values = _assign(distances, rows, lengths, values, p, options, pinned[p],
                                   extra, end)
        if end is not None:
            lengths, values = _lengths(distances, rows, lengths, values, end, pinned)
        if float(values.sum()) >= before * (1 - 1e-6):
            break
    return [sentence(r, n, end) for r, n in zip(rows, lengths, strict=True)], values


def _assign(distances: Distances, rows: torch.Tensor, lengths: list[int], values: torch.Tensor,
            p: int, options: torch.Tensor, required: int, extra: int, end: int | None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose the best tokens at position ``p``, everything else fixed (linear assignment)."""
    from scipy.optimize import linear_sum_assignment

    width = rows.shape[1]
    open_end = p == width - 1
    slots = [k for k, n in enumerate(lengths) if n - 1 > p or (open_end and n == width)]
    if not slots:
        return rows, values
    words = options if end is None or open_end else options[options != end]
    columns = words[:required + extra]
    held = torch.unique(rows[slots, p])  # a warm slot's own token stays an option
    held = held[~torch.isin(held, columns) & torch.isin(held, words)]
    columns = torch.cat([columns, held])
    if columns.numel() < 2 and required == 0:
        return rows, values
    required = min(required, len(slots), columns.numel())
    variants = []
    for k in slots:
        for token in columns.tolist():
            row = rows[k].clone()
            row[p] = token
            variants.append(sentence(row, lengths[k], end))
    cost = objective(distances, variants).reshape(len(slots), columns.numel())
    matrix = torch.cat([cost[:, :required] - REQUIRED,
                        cost[:, required:].repeat_interleave(len(slots), dim=1)], dim=1)
    picked_rows, picked = linear_sum_assignment(matrix.numpy())
    chosen = torch.as_tensor(picked, dtype=torch.long)
    index = torch.where(chosen < required, chosen, required + (chosen - required) // len(slots))
    new_rows, new_values = rows.clone(), values.clone()
    for r, i in zip(picked_rows.tolist(), index.tolist(), strict=True):
        new_rows[slots[r], p] = columns[i]
        new_values[slots[r]] = cost[r, i]
    return new_rows, new_values


def _feasible(lengths: list[int], pinned: list[int]) -> bool:
    """Whether every position has a word slot for each of its pinned tokens."""
    width = len(pinned)
    return all(sum(n - 1 > p or (p == width - 1 and n == width) for n in lengths) >= pinned[p]
               for p in range(width))


def _lengths(distances: Distances, rows: torch.Tensor, lengths: list[int], values: torch.Tensor,
             end: int, pinned: list[int]) -> tuple[list[int], torch.Tensor]:
    """Each slot at its best length 2..L (content cut or continued), the best gains first.

    A length is taken only while every position keeps a word slot per pinned token.
    """
    width = rows.shape[1]
    options = list(range(2, width + 1))
    variants = [sentence(r, n, end) for r in rows for n in options]
    cost = objective(distances, variants).reshape(rows.shape[0], len(options))
    new_lengths, new_values = list(lengths), values.clone()
    order = torch.argsort(cost.min(dim=1).values - values).tolist()
    for k in order:
        for i in torch.argsort(cost[k]).tolist():
            if float(cost[k, i]) >= float(new_values[k]):
                break
            trial = list(new_lengths)
            trial[k] = options[i]
            if _feasible(trial, pinned):
                new_lengths, new_values[k] = trial, cost[k, i]
                break
    return new_lengths, new_values
