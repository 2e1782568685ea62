"""Scoring a text round's reconstruction inside the victim, and what a text victim publishes.

A ``Score`` call on a text round submits recovered sentences (token ids ``[m, L]``) and/or a
recovered token set (with counts). As for images, everything is checked first (an invalid
submission spends nothing), then the round's budget is spent — the same per-target and
per-private-sentence budget (:class:`~fedleak.harness.victim.scoring.budget.ScoreBudget`) — and
only then is anything compared (:mod:`fedleak.harness.metrics.text_metrics`), at report
precision (1e-4). The private sentences never leave; neither do their lengths.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fedleak.harness.metrics.text_metrics import (
    TextBatchScore,
    floor_rouge,
    most_frequent_token,
    score_sentences,
    token_set_score,
)
from fedleak.harness.victim.rounds import Round, RoundBook
from fedleak.harness.victim.scoring import precision
from fedleak.harness.victim.scoring.budget import ScoreBudget
from fedleak.harness.wire.codec import check_declared, decode_tensor
from fedleak.harness.wire.request_errors import InvalidArgument, refuse_long_lists
from fedleak.harness.zoo.text.secret_sharer import secrets_in
from fedleak.harness.zoo.text.text_datasets import TextDataset
from fedleak.v1 import victim_pb2 as pb

#: the most sentences one submission may hold (per private sentence of the round: 8)
SENTENCES_PER_PRIVATE = 8


@dataclass
class TextSubmission:
    """What a server submits for one text round."""

    tokens: torch.Tensor | None = None
    token_set: list[int] = field(default_factory=list)
    token_counts: list[int] = field(default_factory=list)
    padding: list[int] = field(default_factory=list)
    user_ids: list[int] = field(default_factory=list)


class TextScorer:
    """Scores text submissions against the private sentences of the victim's rounds."""

    def __init__(self, data: TextDataset, rounds: RoundBook, budget: ScoreBudget,
                 scored_indices: Callable[[Round, list[int]], torch.Tensor]) -> None:
        self.data = data
        self.rounds = rounds
        self.budget = budget
        self.scored_indices = scored_indices  # RoundScorer.scored_indices
        self.tokenizer = data.info.checked_tokenizer

    def most_frequent(self) -> int | None:
        """The private pool's most frequent text token: the floor's guess."""
        tok = self.tokenizer
        return most_frequent_token([tok.text_tokens(row) for row in self.data.tokens.tolist()])

    def check(self, round_id: str, submission: TextSubmission) -> torch.Tensor:
        """The private rows this submission is scored against; InvalidArgument when malformed."""
        round_ = self.rounds.get(round_id)
        indices = self.scored_indices(round_, submission.user_ids)
        tokens, vocab = submission.tokens, self.tokenizer.vocab_size
        if tokens is None and not submission.token_set:
            raise InvalidArgument("no tokens: submit recovered sentences as token ids [m, L] "
                                  "(tokens) and/or a recovered token_set")
        if tokens is not None:
            most = SENTENCES_PER_PRIVATE * len(indices)
            if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32):
                raise InvalidArgument(f"tokens must be integer ids [m, L], got "
                                      f"{tokens.dtype} {list(tokens.shape)}")
            if not 1 <= tokens.shape[0] <= most or tokens.shape[1] > 4 * self.data.info.seq_len:
                raise InvalidArgument(f"tokens must hold 1 to {most} sentences of at most "
                                      f"{4 * self.data.info.seq_len} ids, got "
                                      f"{list(tokens.shape)}")
            if bool(((tokens < -1) | (tokens >= vocab)).any()):
                raise InvalidArgument(f"token ids must lie in [0, {vocab}) (-1 fills a row "
                                      "after its sentence)")
        count = 0 if tokens is None else int(tokens.shape[0])
        if submission.padding and tokens is None:
            raise InvalidArgument("padding marks submitted sentences: send tokens with it")
        bad = sorted({j for j in submission.padding if not 0 <= j < count})
        if bad or len(set(submission.padding)) != len(submission.padding):
            raise InvalidArgument(f"padding must list distinct sentence indices in [0, "
                                  f"{count}), got {submission.padding[:8]}")
        if any(not 0 <= t < vocab for t in submission.token_set) or \
                len(set(submission.token_set)) != len(submission.token_set):
            raise InvalidArgument(f"token_set must list distinct ids in [0, {vocab})")
        if submission.token_counts and (
                len(submission.token_counts) != len(submission.token_set)
                or any(c < 0 for c in submission.token_counts)):
            raise InvalidArgument("token_counts must give one count >= 0 per token_set id")
        return indices

    def score(self, round_id: str, submission: TextSubmission) -> TextBatchScore:
        """Check ``submission``, spend the round's budget, and score it (module docstring)."""
        indices = self.check(round_id, submission)
        round_ = self.rounds.get(round_id)
        users = tuple(sorted(set(submission.user_ids) or round_.user_indices))
        what = f"round {round_id[:16]}" + (f" (users {list(users)})" if users else "")
        self.budget.spend(("round", round_id, users), what, indices.tolist())
        tok = self.tokenizer
        truth = [tok.text_tokens(row) for row in self.data.tokens[indices].tolist()]
        score = TextBatchScore()
        submitted: list[list[int]] = []
        if submission.tokens is not None:
            submitted = [tok.text_tokens([t for t in row if t >= 0])
                         for row in submission.tokens.tolist()]
            score = score_sentences(truth, submitted, tok.decode, submission.padding)
            score.floor = floor_rouge(truth, self.most_frequent(), tok.decode)
        recovered = submission.token_set or sorted(
            {t for j, s in enumerate(submitted) if j not in set(submission.padding) for t in s})
        counts = submission.token_counts or None
        if submission.token_set:
            kept = [(t, c) for t, c in zip(recovered, counts or [1] * len(recovered),
                                           strict=True) if t not in tok.special_ids]
            recovered = [t for t, _ in kept]
            counts = [c for _, c in kept] if counts else None
        score.tokens = token_set_score(truth, recovered, counts)
        rows = {int(i): k for k, i in enumerate(indices.tolist())}
        secrets = [s for r, s in zip(self.data.canary_rows, self.data.secrets, strict=True)
                   if r in rows]
        score.secrets = len(secrets)
        texts = [tok.decode(s) for j, s in enumerate(submitted) if j not in submission.padding]
        score.secrets_recovered = secrets_in(texts, secrets)
        return score


def text_score_pb(score: TextBatchScore, sequences: bool) -> pb.TextScore:
    """The ``ScoreResponse.text`` answer, at report precision."""
    unit = precision.unit
    reply = pb.TextScore(sequences_scored=sequences, rouge1=unit(score.rouge1),
                         rouge2=unit(score.rouge2), rouge_l=unit(score.rougeL),
                         exact=score.exact, sentences=len(score.sentences),
                         secrets=score.secrets, secrets_recovered=score.secrets_recovered)
    reply.sentence_scores.extend(
        pb.SentenceScore(index=s.index, matched_index=s.matched_index, rouge1=unit(s.rouge1),
                         rouge2=unit(s.rouge2), rouge_l=unit(s.rougeL), exact=s.exact,
                         padding=s.padding) for s in score.sentences)
    if score.floor is not None:
        reply.floor_scored = True
        reply.floor_rouge1, reply.floor_rouge2, reply.floor_rouge_l = (unit(v) for v in
                                                                       score.floor)
    tokens = score.tokens
    if tokens is not None:
        reply.token_set_scored = True
        reply.token_precision, reply.token_recall = unit(tokens.precision), unit(tokens.recall)
        reply.tokens_recovered, reply.tokens_true = tokens.recovered, tokens.true
        if tokens.count_precision is not None and tokens.count_recall is not None:
            reply.counts_scored = True
            reply.count_precision = unit(tokens.count_precision)
            reply.count_recall = unit(tokens.count_recall)
    return reply


def score_text(victim: Any, request: pb.ScoreRequest) -> pb.ScoreResponse:
    """``Score`` on a text victim: the submission decoded and scored (sentences, token set)."""
    if request.HasField("images") or request.HasField("features") or request.labels:
        raise InvalidArgument("this victim holds text: submit recovered sentences as tokens "
                              "(token ids [m, L]) and/or a token_set, not images, features "
                              "or labels")
    vocab = int(victim.data.info.checked_tokenizer.vocab_size)
    rows = SENTENCES_PER_PRIVATE * int(victim.data.tokens.shape[0])
    refuse_long_lists(request, {"token_set": vocab, "token_counts": vocab, "padding": rows,
                                "user_ids": rows}, "ScoreRequest")
    submission = TextSubmission(token_set=list(request.token_set),
                                token_counts=list(request.token_counts),
                                padding=list(request.padding), user_ids=list(request.user_ids))
    if request.HasField("tokens"):
        check_declared(request.tokens, "tokens", (None, None), floating=False,
                       wanted="[m, L] token ids (INT64)")
        submission.tokens = decode_tensor(request.tokens, "tokens")
    scorer = TextScorer(victim.data, victim.rounds, victim.score_budget,
                        victim.scorer.scored_indices)
    score = scorer.score(request.round_id, submission)
    return pb.ScoreResponse(text=text_score_pb(score, submission.tokens is not None))
