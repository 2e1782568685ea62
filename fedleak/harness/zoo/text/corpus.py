"""Federated text that ships with fedleak, and a user's own text, as sentences split by user.

**shakespeare**: Andrej Karpathy's *tinyshakespeare* (``data/tinyshakespeare/input.txt`` of
github.com/karpathy/char-rnn, 1 115 394 bytes, sha256 ``86c4e6aa…65ed``), a public-domain
selection of Shakespeare's plays as ``SPEAKER:`` blocks, committed gzipped under
``text_data/``. As the LEAF benchmark does (Caldas et al. 2018), it is split by speaking role:
each *speech* (one block: a role's turn, its lines joined by spaces) is one sentence, and the
role is its user. Roles are numbered in order of first appearance; role r is *held out* (the
``test`` split) iff ``r % 5 == 4``: the held-out roles' text was never used to train the
tokenizer nor to tune an attack. ``train`` is every other role's speeches, ``all`` every
speech in order.

**alice**: Lewis Carroll's *Alice's Adventures in Wonderland* (1865, public domain), the text of
Project Gutenberg eBook #11 (the Millennium Fulcrum Edition 3.0) with Project Gutenberg's header
and licence removed (151 099 bytes, sha256 ``e3917589…bfdb1``), committed gzipped under
``text_data/``: text that neither the bundled tokenizer nor any attack was tuned on, and that the
pretrained models' own users would type more nearly than Elizabethan verse. Each chapter is a
user; each sentence of a paragraph (split after ``.``, ``?``, ``!`` before a capital or an
opening quote; ``_`` emphasis marks dropped; sentences of fewer than 3 words skipped) is a
sentence. Chapter c (0-based) is held out iff ``c % 5 == 4`` (chapters V and X: 248 sentences).

**textfile**: the user's own text under ``data_root``: a ``.txt`` file (each non-empty line a
sentence, one user), or a folder of ``.txt`` files (each file one user, sorted by name), split
by the same every-5th rule over users (one file: over lines). Text is read as UTF-8; nothing is
downloaded.

Each sentence also gets a *mood* (``statement``, ``question``, ``exclamation``) from its last
punctuation mark: the label of the encoder's classification task.
"""

from __future__ import annotations

import gzip
import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

CORPUS_DIR = Path(__file__).with_name("text_data")
SHAKESPEARE_FILE = CORPUS_DIR / "tinyshakespeare.txt.gz"
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
ALICE_FILE = CORPUS_DIR / "alice.txt.gz"
ALICE_SHA256 = "e3917589f48b4e9f4b731a6b7e127cf9ddd6e1b3819c78be02a2702ee73bfdb1"
TEXT_CORPORA = ("shakespeare", "alice", "textfile")
HELD_OUT_EVERY = 5
MOODS = ("statement", "question", "exclamation")


class CorpusError(ValueError):
    """Text that cannot be read as asked; the message says what to change."""


@dataclass(frozen=True)
class Sentence:
    """One sentence of the corpus and the user (role, file) it belongs to."""

    text: str
    user: str
    user_index: int

    @property
    def mood(self) -> int:
        """0 statement, 1 question, 2 exclamation (the last punctuation mark decides)."""
        marks = [c for c in self.text if c in ".?!"]
        return {"?": 1, "!": 2}.get(marks[-1], 0) if marks else 0


def read_corpus(name: str, split: str, data_root: str | Path | None = None) -> list[Sentence]:
    """The sentences of corpus ``name`` (:data:`TEXT_CORPORA`) in ``split`` (train, test, all)."""
    if name == "shakespeare":
        sentences = shakespeare_sentences()
    elif name == "alice":
        sentences = alice_sentences()
    elif name == "textfile":
        sentences = textfile_sentences(data_root)
    else:
        raise CorpusError(f"unknown text corpus {name!r}; choose one of "
                          f"{', '.join(TEXT_CORPORA)}")
    return split_sentences(sentences, split, by_line=name == "textfile"
                           and len({s.user for s in sentences}) == 1)


def split_sentences(sentences: list[Sentence], split: str, by_line: bool = False
                    ) -> list[Sentence]:
    """``test``: the held-out users' sentences (user index ``% 5 == 4``; ``by_line``: every
    5th sentence instead); ``train`` the rest; ``all`` every sentence."""
    if split not in ("train", "test", "all"):
        raise CorpusError(f"unknown split {split!r}; choose one of train, test, all")
    if split == "all":
        return list(sentences)
    held = [(i if by_line else s.user_index) % HELD_OUT_EVERY == HELD_OUT_EVERY - 1
            for i, s in enumerate(sentences)]
    return [s for s, h in zip(sentences, held, strict=True) if h == (split == "test")]


@lru_cache(maxsize=1)
def shakespeare_text() -> str:
    """The bundled tinyshakespeare text, checked against its published sha256."""
    raw = gzip.decompress(SHAKESPEARE_FILE.read_bytes())
    if hashlib.sha256(raw).hexdigest() != SHAKESPEARE_SHA256:
        raise CorpusError(f"{SHAKESPEARE_FILE} is damaged (sha256 differs); reinstall fedleak")
    return raw.decode("utf-8")


@lru_cache(maxsize=1)
def shakespeare_speeches() -> tuple[Sentence, ...]:
    """Every speech of the corpus in order, its role numbered by first appearance."""
    roles: dict[str, int] = {}
    speeches = []
    pending = ""  # a ``SPEAKER:`` line whose speech follows after a blank line
    for block in shakespeare_text().split("\n\n"):
        lines = [line.strip() for line in block.strip().splitlines() if line.strip()]
        if lines and lines[0].endswith(":"):
            pending, lines = lines[0][:-1].strip(), lines[1:]
        if not lines or not pending:
            continue
        index = roles.setdefault(pending, len(roles))
        speeches.append(Sentence(" ".join(lines), pending, index))
        pending = ""
    return tuple(speeches)


def shakespeare_sentences() -> list[Sentence]:
    return list(shakespeare_speeches())


@lru_cache(maxsize=1)
def alice_text() -> str:
    """The bundled *Alice's Adventures in Wonderland*, checked against its sha256."""
    raw = gzip.decompress(ALICE_FILE.read_bytes())
    if hashlib.sha256(raw).hexdigest() != ALICE_SHA256:
        raise CorpusError(f"{ALICE_FILE} is damaged (sha256 differs); reinstall fedleak")
    return raw.decode("utf-8")


_CHAPTER = re.compile(r"\n\s*CHAPTER [IVXL]+\.\n")
_SENTENCE_END = re.compile(r"(?<=[.!?])[”’]?\s+(?=[“‘A-Z(])")


def alice_sentences() -> list[Sentence]:
    """The book's sentences in order, each chapter a user (module docstring)."""
    sentences = []
    for index, chapter in enumerate(_CHAPTER.split(alice_text())[1:]):
        body = chapter.split("\n", 1)[1]  # the chapter's title line goes
        for paragraph in re.split(r"\n\s*\n", body):
            text = " ".join(paragraph.split()).replace("_", "")
            if not text or set(text) <= {"*", " "}:
                continue
            sentences += [Sentence(t.strip(), f"chapter-{index + 1}", index)
                          for t in _SENTENCE_END.split(text) if len(t.split()) >= 3]
    return sentences


def textfile_sentences(data_root: str | Path | None) -> list[Sentence]:
    """A user's own text: one ``.txt`` file (one user) or a folder of them (one user each)."""
    if data_root is None:
        raise CorpusError("textfile needs --data-root pointing at a .txt file (one sentence a "
                          "line) or a folder of .txt files (one user each)")
    root = Path(data_root)
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(p for p in root.iterdir() if p.suffix == ".txt" and p.is_file())
        if not files:
            raise CorpusError(f"textfile: {root} holds no .txt file; add one per user")
    else:
        raise CorpusError(f"textfile: --data-root {root} does not exist")
    sentences: list[Sentence] = []
    for index, path in enumerate(files):
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise CorpusError(f"textfile: cannot read {path} as UTF-8 text ({err})") from None
        sentences += [Sentence(line.strip(), path.stem, index) for line in lines if line.strip()]
    if not sentences:
        raise CorpusError(f"textfile: {root} holds no non-empty line; add sentences, one a line")
    return sentences
