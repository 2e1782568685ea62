"""The sentence shapes (lengths, closed by the end token or not) DAGER's encoder search allows.

Used by :mod:`~fedleak.attacks.text.dager.encoder` (its docstring: **Lengths**).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from fedleak.attacks.text.dager.configuration import DagerConfig


class Shapes:
    """The sentence shapes the token filter allows.

    A length ℓ, ending with ``end`` at ℓ − 1 (a text shorter than the batch's length) or filling
    every position without it; and each shape's candidate sets.
    """

    def __init__(self, candidates: list[torch.Tensor], end: int | None, full: bool,
                 spare: torch.Tensor | None = None) -> None:
        self.candidates, self.end = candidates, end
        #: tokens the search may also try anywhere once its moves over the sets are spent
        self.spare = spare
        self.options: list[tuple[int, bool]] = []
        longest = len(candidates)
        #: the full shape's last position may hold the end token: a text of ``longest − 1``
        #: tokens closed by ``end`` and one cut at ``longest`` tokens are then one shape, and
        #: a single replacement moves between them
        self.open_end = full and end is not None and bool((candidates[-1] == end).any())
        if full or end is None:
            self.options.append((longest, False))
        if end is not None:
            self.options += [(i + 1, True) for i, c in enumerate(candidates)
                             if i > 0 and bool((c == end).any())
                             and not (self.open_end and i + 1 == longest)]
        self.options = sorted((o for o in self.options
                               if all(c.numel() for c in self.sets(*o))), reverse=True)

    def sets(self, length: int, ends: bool) -> list[torch.Tensor]:
        """Return the candidate sets of the shape (``length``, closed by the end token or not)."""
        content = [c if self.end is None else c[c != self.end]
                   for c in self.candidates[:length]]
        if self.open_end and length == len(self.candidates):
            content[-1] = self.candidates[-1]
        elif ends and self.end is not None:
            content[-1] = torch.tensor([self.end])
        return content

    def widened(self, length: int, ends: bool) -> list[torch.Tensor] | None:
        """Return the shape's sets with every ``spare`` token added where a set has a choice.

        None without spare tokens; the end token stays where :meth:`sets` puts it.
        """
        if self.spare is None:
            return None
        spare = self.spare if self.end is None else self.spare[self.spare != self.end]
        return [c if c.numel() < 2 else torch.cat([c, spare[~torch.isin(spare, c)]])
                for c in self.sets(length, ends)]

    def closes(self, sentence: torch.Tensor) -> bool:
        """Whether ``sentence`` ends with the end token."""
        return self.end is not None and int(sentence[-1]) == self.end

    def content(self, sentence: torch.Tensor) -> torch.Tensor:
        """``sentence`` without its closing end token."""
        return sentence[:-1] if self.closes(sentence) else sentence

    def shaped(self, sentence: torch.Tensor, filler: torch.Tensor, length: int, closed: bool
               ) -> torch.Tensor:
        """Return the sentence at shape (``length``, ``closed``).

        Its content cut, or continued from ``filler`` (a longer content seen before, or random
        candidates).
        """
        content = self.content(sentence)
        body = length - 1 if closed else length
        tokens = torch.cat([content[:body], filler[content.numel():body]])
        return torch.cat([tokens, torch.tensor([int(self.end or 0)])]) if closed else tokens

    def reshaped(self, sentence: torch.Tensor, filler: torch.Tensor) -> list[torch.Tensor]:
        """Return the sentence at every allowed shape (:meth:`shaped`)."""
        return [self.shaped(sentence, filler, *option) for option in self.options]


def shapes_of(candidates: list[torch.Tensor], config: DagerConfig, spare: bool) -> Shapes:
    """Return the shapes of a search's candidate sets (the split's, or a peel's: ``spare``).

    With ``spare`` every token of the sets but the start token may also be tried anywhere
    (:meth:`Shapes.widened`); the longest shape is open at its end when the sets reach
    ``config.max_length``.
    """
    full = config.max_length is None or len(candidates) >= config.max_length
    tokens = torch.unique(torch.cat(candidates)) if spare else None
    if tokens is not None and config.start_token is not None:
        tokens = tokens[tokens != config.start_token]
    return Shapes(candidates, config.end_token, full, tokens)
