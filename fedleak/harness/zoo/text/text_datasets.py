"""Text data sets as the victim holds them: token ids ``[N, T]`` with labels, split by user.

A :class:`TextDataset` stands where an image data set stands in the victim (its rounds index
``tokens`` as they index images): sentences of a corpus
(:mod:`fedleak.harness.zoo.text.corpus`) encoded by a tokenizer
(:mod:`fedleak.harness.zoo.text.tokenizer`) to ``T`` tokens each, padding at the end. Labels
depend on the task the model trains:

- ``lm`` (decoder language model): ``labels[i, t]`` is the token after position ``t``, and
  ``-100`` (ignored by the loss) at the last position and wherever the next token is padding,
  so the loss is the mean cross-entropy over every real next token of the batch;
- ``classify`` (encoder classifier): the sentence's mood (statement, question, exclamation).

Padding is the trailing run of padding ids of a row (:func:`content_mask`); it is masked out
of attention and never scored. With ``canaries`` the pool also holds secret-sharer canaries
(:mod:`fedleak.harness.zoo.text.secret_sharer`), their secrets kept for scoring.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from fedleak.harness.zoo.datasets import DatasetInfo, ImageDataset
from fedleak.harness.zoo.text.corpus import MOODS, TEXT_CORPORA, Sentence, read_corpus
from fedleak.harness.zoo.text.secret_sharer import canary_texts
from fedleak.harness.zoo.text.tokenizer import TextTokenizer, load_tokenizer

LANGUAGE_MODEL = "lm"
CLASSIFY = "classify"
TEXT_TASKS = (LANGUAGE_MODEL, CLASSIFY)
IGNORE_INDEX = -100
DEFAULT_SEQ_LEN = 32


@dataclass(frozen=True)
class TextInfo(DatasetInfo):
    """What the model and the server may know of a text data set: the published tokenizer,
    sequence length and task (``shape`` is ``(T,)``; no channel statistics)."""

    seq_len: int = DEFAULT_SEQ_LEN
    task: str = LANGUAGE_MODEL
    tokenizer: TextTokenizer | None = None

    @property
    def vocab_size(self) -> int:
        return self.checked_tokenizer.vocab_size

    @property
    def checked_tokenizer(self) -> TextTokenizer:
        if self.tokenizer is None:
            raise ValueError(f"text data set {self.name} has no tokenizer")
        return self.tokenizer


def is_text(info: DatasetInfo) -> bool:
    """Whether ``info`` describes token sequences rather than images."""
    return isinstance(info, TextInfo)


@dataclass
class TextDataset:
    """Token ids ``[N, T]`` (int64, right-padded), labels, and the raw sentences.

    ``images`` is ``tokens``: the victim's rounds index a data set's inputs by that name.
    ``secrets`` are the canaries' secrets (empty without canaries) and ``canary_rows`` the rows
    holding them; ``cut`` says which sentences were longer than T tokens and cut there.
    """

    tokens: Tensor
    labels: Tensor
    info: TextInfo
    texts: list[str] = field(default_factory=list)
    users: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)
    canary_rows: list[int] = field(default_factory=list)
    cut: list[bool] = field(default_factory=list)

    @property
    def images(self) -> Tensor:
        return self.tokens

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def select(self, order: Tensor) -> TextDataset:
        """The rows ``order`` (a selection or permutation), canaries followed."""
        rows = [int(i) for i in order]
        where = {row: k for k, row in enumerate(rows)}
        kept = [(where[r], s) for r, s in zip(self.canary_rows, self.secrets, strict=True)
                if r in where]
        return replace(self, tokens=self.tokens[order].contiguous(),
                       labels=self.labels[order].contiguous(),
                       texts=[self.texts[i] for i in rows], users=[self.users[i] for i in rows],
                       cut=[self.cut[i] for i in rows] if self.cut else [],
                       canary_rows=[k for k, _ in kept], secrets=[s for _, s in kept])


#: a victim's private data: images, or token sequences
PrivateData = ImageDataset | TextDataset


def content_mask(ids: Tensor, pad_id: int) -> Tensor:
    """1 where a row holds content, 0 on its trailing run of ``pad_id`` (int64, like ids)."""
    real = (ids != pad_id).flip(-1).cumsum(-1).flip(-1) > 0
    return real.to(torch.int64)


def language_model_labels(ids: Tensor, pad_id: int) -> Tensor:
    """Next-token labels: ``ids[:, t + 1]``, ``-100`` at the last position and at padding."""
    mask = content_mask(ids, pad_id)
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:, :-1] = torch.where(mask[:, 1:] > 0, ids[:, 1:], IGNORE_INDEX)
    return labels


def random_text_batch(info: DatasetInfo, count: int, generator: torch.Generator
                      ) -> tuple[Tensor, Tensor]:
    """``count`` public random sequences of ``info``'s layout (start token, uniformly drawn
    text tokens, no padding) and their labels: a synthetic batch, as random images are."""
    assert isinstance(info, TextInfo)
    tok = info.checked_tokenizer
    text = torch.tensor([i for i in range(tok.vocab_size) if i not in tok.special_ids])
    ids = text[torch.randint(0, len(text), (count, info.seq_len), generator=generator)]
    ids[:, 0] = tok.start_id
    if info.task == LANGUAGE_MODEL:
        return ids, language_model_labels(ids, tok.pad_id)
    return ids, torch.randint(0, info.num_classes, (count,), generator=generator)


def load_text_dataset(
    name: str,
    split: str = "train",
    *,
    task: str = LANGUAGE_MODEL,
    seq_len: int = DEFAULT_SEQ_LEN,
    tokenizer: str | TextTokenizer | None = None,
    data_root: str | None = None,
    canaries: int = 0,
    canary_seed: int = 0,
) -> TextDataset:
    """Sentences of corpus ``name`` in ``split``, encoded for ``task`` to ``seq_len`` tokens.

    ``canaries`` secret-sharer sentences are spread evenly through the pool (their secrets
    drawn from ``canary_seed``).
    """
    if task not in TEXT_TASKS:
        raise ValueError(f"unknown text task {task!r}; choose one of {', '.join(TEXT_TASKS)}")
    if name not in TEXT_CORPORA:
        raise ValueError(f"unknown text data set {name!r}; choose one of "
                         f"{', '.join(TEXT_CORPORA)}")
    sentences = read_corpus(name, split, data_root)
    if not sentences:
        raise ValueError(f"{name} has no sentence in split {split}; choose another split")
    secrets: list[str] = []
    rows: list[int] = []
    if canaries:
        texts, secrets = canary_texts(canaries, canary_seed)
        step = max(1, len(sentences) // canaries)
        for k, text in enumerate(texts):
            rows.append(k * step + k)
            sentences.insert(rows[-1], Sentence(text, "canary", -1))
    tok = tokenizer if isinstance(tokenizer, TextTokenizer) else load_tokenizer(tokenizer)
    ids = tok.encode([s.text for s in sentences], seq_len)
    if task == LANGUAGE_MODEL:
        labels = language_model_labels(ids, tok.pad_id)
        classes: tuple[str, ...] = ()
        num_classes = tok.vocab_size
    else:
        labels = torch.tensor([s.mood for s in sentences], dtype=torch.int64)
        classes, num_classes = MOODS, len(MOODS)
    info = TextInfo(name=name, shape=(seq_len,), num_classes=num_classes, mean=(), std=(),
                    class_names=classes, seq_len=seq_len, task=task, tokenizer=tok)
    texts = [s.text for s in sentences]
    return TextDataset(ids, labels, info, texts, [s.user for s in sentences], secrets, rows,
                       tok.cut(texts, seq_len))
