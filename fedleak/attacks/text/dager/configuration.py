"""DAGER's settings, its result, and the count of its work.

The engine is :mod:`~fedleak.attacks.text.dager.layer_search`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DagerConfig:
    """DAGER's settings.

    ``l1_threshold``/``l2_threshold`` are τ₁/τ₂ on the span distance (0 for the inputs up to float32
    rounding, 10⁻⁶–10⁻⁴ in practice; ≳ 10⁻² for other tokens while B·T is well below d).
    ``max_candidates`` caps the tokens kept per position and ``max_prefixes`` the decoder's live
    prefixes (a cap that bites marks the result ``truncated``). ``end_token`` is the encoder's
    end-of-sentence id ([SEP]), ``None`` when every sentence fills the batch length.
    ``start_token`` is the published layout's first token (BOS / [CLS]): position 0 holds it and
    no other position does (``None``: unknown) — without it a model with rotary positions (llama)
    passes a run of the start token at every position, since attention over identical tokens
    returns the same value wherever it sits. ``max_evaluations`` caps the encoder search's
    sentence evaluations, ``restarts`` its failed starts in a row (a start sliding onto a
    recovered sentence fails), ``screen`` the moves its first-order screen passes to exact
    evaluation per step. ``ranks`` overrides the two spans' ranks (the paper's rank cutoff).
    """

    l1_threshold: float = 1e-3
    l2_threshold: float = 1e-4
    max_length: int | None = None
    max_candidates: int = 2048
    max_prefixes: int = 4096
    end_token: int | None = None
    start_token: int | None = None
    max_evaluations: int = 2_000_000
    restarts: int = 16
    screen: int = 64
    ranks: tuple[int | None, int | None] = (None, None)
    seed: int = 0

    def __post_init__(self) -> None:
        """Refuse thresholds outside (0, 1) and counts below 1."""
        for name in ("l1_threshold", "l2_threshold"):
            value = getattr(self, name)
            if not 0 < value < 1:
                raise ValueError(f"{name} must lie in (0, 1) (a span distance); got {value}")
        for name in ("max_candidates", "max_prefixes", "max_evaluations", "restarts", "screen"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1; got {getattr(self, name)}")
        if self.max_length is not None and self.max_length < 1:
            raise ValueError(f"max_length must be at least 1; got {self.max_length}")


@dataclass
class DagerResult:
    """The recovered sentences (token ids, padding left out), each with its certificate.

    ``certified[k]`` when sentence k passed the second span check (an exact recovery up to the
    check's threshold), ``scores[k]`` the distance certified: a decoder's largest along the
    sentence, an encoder's median over its positions (:mod:`dager_encoder`). ``candidates`` is the
    token filter's count per position, ``ranks`` the two spans' ranks against ``hidden_size``;
    ``evaluations`` counts the (partial) sentences whose second-layer input was computed — the
    attack's work. ``pinned``: the tokens the first-layer split pinned to a position (an encoder
    whose filter saturated; 0 otherwise). ``truncated`` when a cap or budget cut the search (then
    sentences may be missing); ``warnings`` say what a person must know.
    """

    sentences: list[list[int]]
    certified: list[bool]
    scores: list[float]
    candidates: list[int]
    ranks: tuple[int, int]
    hidden_size: int
    evaluations: int = 0
    pinned: int = 0
    truncated: bool = False
    warnings: list[str] = field(default_factory=list)


#: evaluations between two progress reports
REPORT_EVERY = 2000


class Work:
    """A counter of sentence evaluations against a budget.

    ``report(count, budget, found)`` is called every :data:`REPORT_EVERY` evaluations (``found``:
    the sentences recovered so far, :attr:`found`, which the encoder's search keeps; the decoder's,
    seconds long, leaves it 0 and its sentences are reported at the end).
    """

    def __init__(self, budget: int,
                 report: Callable[[int, int, float], None] | None = None) -> None:
        self.count = 0
        self.budget = budget
        self.found = 0
        self.report = report
        self._next = REPORT_EVERY

    def add(self, n: int) -> None:
        """Count ``n`` more units of work, reporting progress every so often."""
        self.count += n
        if self.report is not None and self.count >= self._next:
            self.report(self.count, self.budget, float(self.found))
            self._next = self.count + REPORT_EVERY

    @property
    def exhausted(self) -> bool:
        """Tell whether the work budget is spent."""
        return self.count >= self.budget

    @contextmanager
    def capped(self, n: int | None) -> Iterator[None]:
        """Within the block, count as exhausted after ``n`` more units (None: no cap)."""
        budget = self.budget
        if n is not None:
            self.budget = min(budget, self.count + n)
        try:
            yield
        finally:
            self.budget = budget
