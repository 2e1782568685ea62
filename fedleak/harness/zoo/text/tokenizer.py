"""Tokenizers for text federations: the bundled one, or a user's local Hugging Face tokenizer.

A tokenizer is public, as a real federation's is: the victim publishes it whole in
``Describe`` (its ``tokenizer.json`` and that text's sha256, the tokenizer's identity), so the
server decodes recovered ids into the text a person reads. Sources, never downloaded:

- ``None`` / ``shakespeare-bpe-4096``: the bundled byte-level BPE
  (:mod:`fedleak.harness.zoo.text.tokenizer_training` trains it);
- a path to a ``tokenizer.json`` file, or to a local Hugging Face model or tokenizer folder
  that holds one (``save_pretrained`` writes it).

Sequences are laid out the same way for every model: ``start`` (BOS / CLS) first, the text's
tokens, ``end`` (EOS / SEP) when the text ends within T tokens, then ``pad`` to T. A tokenizer
whose own post-processor closes every sequence with its end token (BERT's ``[CLS] A [SEP]``
template) keeps it on a sentence cut at T too (``[CLS]``, the first T − 2 tokens, ``[SEP]``), as
its model saw every input in pretraining. Padding and truncation stored in a ``tokenizer.json``
(all-MiniLM-L6-v2's pads and cuts everything to 128) are turned off on load: fedleak lays the
sequence out itself, and the JSON as shipped stays the tokenizer's identity. Special
tokens are found by their usual names (``<pad>``/``[PAD]``, ``<s>``/``[CLS]``/
``<|endoftext|>``, ``</s>``/``[SEP]``/``<|endoftext|>``); a tokenizer without a padding token
pads with its end token.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedleak.harness.zoo.text.tokenizer_training import (
    BUNDLED_TOKENIZER_FILE,
    BUNDLED_TOKENIZER_NAME,
)

_PAD_NAMES = ("<pad>", "[PAD]", "<|pad|>", "<|endoftext|>", "</s>")
_START_NAMES = ("<s>", "[CLS]", "<|startoftext|>", "<|endoftext|>", "<bos>")
_END_NAMES = ("</s>", "[SEP]", "<|endoftext|>", "<eos>")
_OTHER_NAMES = ("<unk>", "[UNK]", "<mask>", "[MASK]")


#: how to install what text federations need
TEXT_EXTRA = "pip install -c constraints.txt 'fedleak[text]'"


class TokenizerError(ValueError):
    """A tokenizer that cannot be loaded or used; the message says what to change."""


@dataclass(frozen=True)
class TextTokenizer:
    """A ``tokenizers.Tokenizer`` with the special ids fedleak lays sequences out with."""

    name: str
    json: str
    pad_id: int
    start_id: int
    end_id: int
    special_ids: tuple[int, ...]
    backend: Any
    end_kept: bool = False

    @property
    def sha256(self) -> str:
        """The identity of the tokenizer: sha256 of its ``tokenizer.json`` text."""
        return hashlib.sha256(self.json.encode("utf-8")).hexdigest()

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def encode(self, texts: list[str], seq_len: int) -> torch.Tensor:
        """``[N, seq_len]`` int64 ids: start, tokens, end (if it fits), padding."""
        if seq_len < 2:
            raise TokenizerError(f"sequence length must be at least 2 (start + a token), got "
                                 f"{seq_len}")
        rows = torch.full((len(texts), seq_len), self.pad_id, dtype=torch.int64)
        for i, encoding in enumerate(self.backend.encode_batch(texts, add_special_tokens=False)):
            ids = [self.start_id, *encoding.ids, self.end_id]
            if len(ids) > seq_len:
                ids = ids[:seq_len - 1] + [self.end_id] if self.end_kept else ids[:seq_len]
            rows[i, :len(ids)] = torch.tensor(ids, dtype=torch.int64)
        return rows

    def cut(self, texts: list[str], seq_len: int) -> list[bool]:
        """Whether each text is longer than ``seq_len`` tokens laid out (so cut there)."""
        encodings = self.backend.encode_batch(texts, add_special_tokens=False)
        return [len(e.ids) + 2 > seq_len for e in encodings]

    def fills(self, ids: list[int], seq_len: int) -> bool:
        """Whether the sequence ``ids`` (padding dropped) may be a sentence cut at ``seq_len``:
        it fills every position and lacks the end token (or the end token is kept on cuts)."""
        return len(ids) >= seq_len and (self.end_kept or ids[seq_len - 1] != self.end_id)

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, special tokens dropped."""
        kept = [i for i in ids if i not in self.special_ids and 0 <= i < self.vocab_size]
        return str(self.backend.decode(kept, skip_special_tokens=True)).strip()

    def text_tokens(self, ids: list[int]) -> list[int]:
        """``ids`` without padding and special tokens: the tokens that stand for text."""
        return [i for i in ids if i not in self.special_ids]


def load_tokenizer(source: str | Path | None = None) -> TextTokenizer:
    """The tokenizer at ``source`` (module docstring); :class:`TokenizerError` if unusable."""
    if source is None or str(source) == BUNDLED_TOKENIZER_NAME:
        return tokenizer_from_json(BUNDLED_TOKENIZER_FILE.read_text(encoding="utf-8"),
                                   BUNDLED_TOKENIZER_NAME)
    path = Path(source)
    if path.is_dir():
        path = path / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"{source} holds no tokenizer.json; save the tokenizer with "
                                 "save_pretrained (a fast tokenizer writes tokenizer.json)")
    if not path.is_file():
        raise TokenizerError(f"tokenizer {source} is neither {BUNDLED_TOKENIZER_NAME}, a "
                             "tokenizer.json file nor a folder holding one")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise TokenizerError(f"cannot read tokenizer {path}: {err}") from None
    return tokenizer_from_json(text, str(source))


def tokenizer_from_json(text: str, name: str) -> TextTokenizer:
    """A tokenizer from ``tokenizer.json`` text (what ``Describe`` publishes)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TokenizerError(f"text data needs the text extra ({TEXT_EXTRA})") from None

    try:
        backend = Tokenizer.from_str(text)
        settings = json.loads(text)
    except Exception as err:  # noqa: BLE001 - tokenizers raises its own Exception type
        raise TokenizerError(f"tokenizer {name} is not a tokenizers JSON file ({err})") from None
    backend.no_padding()
    backend.no_truncation()
    vocab = backend.get_vocab(with_added_tokens=True)

    def first(names: tuple[str, ...], what: str) -> int:
        for token in names:
            if token in vocab:
                return int(vocab[token])
        raise TokenizerError(f"tokenizer {name} has no {what} token (looked for "
                             f"{', '.join(names)}); add one to it")

    end = first(_END_NAMES, "end")
    pad = next((int(vocab[t]) for t in _PAD_NAMES if t in vocab), end)
    start = first(_START_NAMES, "start")
    others = {int(vocab[t]) for t in _OTHER_NAMES if t in vocab}
    specials = tuple(sorted({pad, start, end} | others))
    return TextTokenizer(name, text, pad, start, end, specials, backend,
                         _closes_with_end(settings.get("post_processor"), vocab, end))


def _closes_with_end(processor: Any, vocab: dict[str, int], end: int) -> bool:
    """Whether a ``tokenizer.json`` post-processor ends every single sequence with ``end``."""
    if not isinstance(processor, dict):
        return False
    if processor.get("type") in ("BertProcessing", "RobertaProcessing"):
        return True
    if processor.get("type") == "Sequence":
        return any(_closes_with_end(p, vocab, end) for p in processor.get("processors", []))
    single = processor.get("single") if processor.get("type") == "TemplateProcessing" else None
    last = single[-1] if isinstance(single, list) and single else {}
    token = last.get("SpecialToken", {}).get("id") if isinstance(last, dict) else None
    return token is not None and vocab.get(token) == end
