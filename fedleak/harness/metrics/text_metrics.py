"""Text reconstruction quality: ROUGE-1/2/L, exact sentences and token sets, sentences matched
one-to-one, padding never counted.

The private batch is n sentences of token ids; a reconstruction is m sentences (in any order)
and/or a set of token ids. Before anything is compared, padding and special tokens (start,
end, unknown, mask) are dropped from both sides, and a submitted sentence the attack marked as
padding (a placeholder slot) scores as empty.

- **ROUGE** (Lin 2004) through Google's ``rouge-score`` (the reference implementation behind
  ``evaluate``'s ``rouge``, as DAGER and LAMP report it): the F-measure of ROUGE-1 (unigrams),
  ROUGE-2 (bigrams) and ROUGE-L (longest common subsequence) of each private sentence's decoded
  text against its match, with the library's tokenizer (lowercased alphanumeric words, no
  stemming). Sentences are matched one-to-one by the Hungarian assignment maximising the sum
  of the three F-measures; a private sentence left without a match (m < n) scores 0. Batch
  figures are the means over the n private sentences.
- **Exact sequences**: a private sentence is recovered exactly when a non-padding submitted
  sentence has the same text token ids; the count is the largest one-to-one matching of such
  pairs (a multiset intersection), not read off the ROUGE assignment.
- **The floor**: what a guess made without the update scores — each private sentence guessed as
  the most frequent text token of the data (the victim's private pool; on a Flower node its
  batch) repeated to the sentence's length, its ROUGE-1/2/L against that sentence, averaged
  over the private sentences (:func:`floor_rouge`). A reconstruction whose ROUGE-1 and
  ROUGE-2 do not exceed it recovered nothing beyond that guess.
- **Token sets**: precision and recall of the set of submitted text-token ids (the attack's
  stated set, else the union of its sentences) against the batch's set; with stated counts,
  precision and recall of the multisets as well.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


@dataclass
class SentenceScore:
    """Private sentence ``index`` against submitted sentence ``matched_index`` (-1: none)."""

    index: int
    matched_index: int
    rouge1: float
    rouge2: float
    rougeL: float  # noqa: N815 - the metric's own name
    exact: bool = False
    padding: bool = False


@dataclass
class TokenSetScore:
    """Set (and, when counts were stated, multiset) precision and recall of recovered ids."""

    precision: float
    recall: float
    recovered: int
    true: int
    count_precision: float | None = None
    count_recall: float | None = None


@dataclass
class TextBatchScore:
    """Per-sentence scores and their means over the private sentences."""

    sentences: list[SentenceScore] = field(default_factory=list)
    rouge1: float = 0.0
    rouge2: float = 0.0
    rougeL: float = 0.0  # noqa: N815
    exact: int = 0
    tokens: TokenSetScore | None = None
    secrets: int = 0
    secrets_recovered: int = 0
    #: ROUGE-1/2/L of the most-frequent-token guess (the floor), when sentences were scored
    floor: tuple[float, float, float] | None = None


def rouge_scorer() -> object:
    """Google's ``rouge_score`` scorer for ROUGE-1/2/L (imported here: it takes seconds)."""
    from rouge_score import rouge_scorer as module

    return module.RougeScorer(list(ROUGE_TYPES), use_stemmer=False)


def rouge_matrix(truth: Sequence[str], submitted: Sequence[str]) -> np.ndarray:
    """``[n, m, 3]``: ROUGE-1/2/L F-measures of every private text against every submitted."""
    scorer = rouge_scorer()
    out = np.zeros((len(truth), len(submitted), len(ROUGE_TYPES)))
    for i, target in enumerate(truth):
        for j, prediction in enumerate(submitted):
            if not target.strip() or not prediction.strip():
                continue
            scores = scorer.score(target, prediction)  # type: ignore[attr-defined]
            out[i, j] = [scores[k].fmeasure for k in ROUGE_TYPES]
    return out


def exact_count(truth: Sequence[Sequence[int]], submitted: Sequence[Sequence[int]],
                padding: Sequence[int] = ()) -> tuple[int, dict[int, int]]:
    """The largest one-to-one matching of private to non-padding submitted sentences with the
    same ids: its size and, per private index, the submitted index it takes."""
    free: dict[tuple[int, ...], list[int]] = {}
    for j, sentence in enumerate(submitted):
        if j not in set(padding):
            free.setdefault(tuple(sentence), []).append(j)
    pairs: dict[int, int] = {}
    for i, sentence in enumerate(truth):
        bucket = free.get(tuple(sentence))
        if bucket:
            pairs[i] = bucket.pop(0)
    return len(pairs), pairs


def token_set_score(truth: Sequence[Sequence[int]], recovered: Sequence[int],
                    counts: Sequence[int] | None = None) -> TokenSetScore:
    """Precision/recall of the ``recovered`` ids (and multiset ones with ``counts``)."""
    true_counts = Counter(t for sentence in truth for t in sentence)
    got = set(recovered)
    hit = len(got & set(true_counts))
    score = TokenSetScore(precision=hit / len(got) if got else 0.0,
                          recall=hit / len(true_counts) if true_counts else 1.0,
                          recovered=len(got), true=len(true_counts))
    if counts is not None:
        stated = Counter({t: c for t, c in zip(recovered, counts, strict=True) if c > 0})
        common = sum((stated & true_counts).values())
        total, wanted = sum(stated.values()), sum(true_counts.values())
        score.count_precision = common / total if total else 0.0
        score.count_recall = common / wanted if wanted else 1.0
    return score


def score_sentences(truth: Sequence[Sequence[int]], submitted: Sequence[Sequence[int]],
                    decode: Callable[[list[int]], str], padding: Sequence[int] = ()
                    ) -> TextBatchScore:
    """ROUGE and exact scores of ``submitted`` sentences against the private ``truth`` (both
    text-token ids only); ``padding`` marks submitted placeholder slots (module docstring)."""
    from scipy.optimize import linear_sum_assignment

    pads = set(padding)
    truth_text = [decode(list(s)) for s in truth]
    sub_text = ["" if j in pads else decode(list(s)) for j, s in enumerate(submitted)]
    matrix = rouge_matrix(truth_text, sub_text) if submitted else np.zeros((len(truth), 0, 3))
    rows, cols = linear_sum_assignment(matrix.sum(-1), maximize=True) if submitted else ([], [])
    match = dict(zip((int(r) for r in rows), (int(c) for c in cols), strict=True))
    count, exact = exact_count(truth, submitted, padding)
    scores = []
    for i in range(len(truth)):
        j = match.get(i, -1)
        f = matrix[i, j] if j >= 0 else np.zeros(3)
        scores.append(SentenceScore(i, j, float(f[0]), float(f[1]), float(f[2]),
                                    exact=i in exact, padding=j in pads))
    batch = TextBatchScore(scores, exact=count)
    if scores:
        batch.rouge1 = float(np.mean([s.rouge1 for s in scores]))
        batch.rouge2 = float(np.mean([s.rouge2 for s in scores]))
        batch.rougeL = float(np.mean([s.rougeL for s in scores]))
    return batch


def most_frequent_token(sentences: Sequence[Sequence[int]]) -> int | None:
    """The most frequent id over ``sentences`` (text tokens only; ties: the smallest id), or
    None when they hold none."""
    counts = Counter(t for sentence in sentences for t in sentence)
    if not counts:
        return None
    return min(counts, key=lambda t: (-counts[t], t))


def floor_rouge(truth: Sequence[Sequence[int]], token: int | None,
                decode: Callable[[list[int]], str]) -> tuple[float, float, float]:
    """The floor's ROUGE-1/2/L (module docstring): the mean over the private sentences of the
    F-measures of ``token`` repeated to each sentence's length against it."""
    if token is None or not truth:
        return 0.0, 0.0, 0.0
    scorer = rouge_scorer()
    values = np.zeros((len(truth), len(ROUGE_TYPES)))
    for i, sentence in enumerate(truth):
        target, guess = decode(list(sentence)), decode([token] * max(1, len(sentence)))
        if target.strip() and guess.strip():
            scores = scorer.score(target, guess)  # type: ignore[attr-defined]
            values[i] = [scores[k].fmeasure for k in ROUGE_TYPES]
    mean = values.mean(0)
    return float(mean[0]), float(mean[1]), float(mean[2])


def prior_guess(public: Sequence[Sequence[int]], lengths: Sequence[int]) -> list[list[int]]:
    """A guess that uses no gradient: for each length ``L``, the ``L`` most frequent distinct
    ids of the attacker's ``public`` text in frequency order (ties: the smaller id)."""
    counts = Counter(t for sentence in public for t in sentence)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    return [ranked[:length] for length in lengths]


def shuffled_bag(truth: Sequence[Sequence[int]], seed: int = 0) -> list[list[int]]:
    """The batch's distinct ids (what an undefended embedding gradient's non-zero rows give) in
    a random order (``seed``), cut into sentences of the private lengths (cycled when the set
    is smaller than a sentence): ROUGE-1 of the token set, ROUGE-2 of a random order."""
    bag = sorted({t for sentence in truth for t in sentence})
    if not bag:
        return [[] for _ in truth]
    order = [bag[i] for i in np.random.default_rng(seed).permutation(len(bag))]
    out, at = [], 0
    for sentence in truth:
        out.append([order[(at + k) % len(order)] for k in range(len(sentence))])
        at += len(sentence)
    return out
