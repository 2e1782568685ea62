"""Train the bundled tokenizer: byte-level BPE on the ``train`` split of ``shakespeare``.

    python -m fedleak.harness.zoo.text.tokenizer_training [--vocab-size 4096] [--out FILE]

Hugging Face ``tokenizers``' :class:`~tokenizers.models.BPE` with GPT-2's byte-level
pre-tokenizer and decoder (every UTF-8 text encodes, no unknown token ever appears), trained
on the train split's speeches only (held-out roles never shape the vocabulary), with the
special tokens ``<pad>`` (0), ``<unk>`` (1), ``<s>`` (2, the start of every sequence: BOS for
the decoder, CLS for the encoder), ``</s>`` (3, end / SEP) and ``<mask>`` (4). The result,
``text_data/shakespeare-bpe-4096.json``, is committed: training is deterministic for a given
``tokenizers`` version, and the file's sha256 is the tokenizer's identity on the wire.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedleak.harness.zoo.text.corpus import CORPUS_DIR, read_corpus

SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>", "<mask>")
BUNDLED_VOCAB_SIZE = 4096
BUNDLED_TOKENIZER_NAME = f"shakespeare-bpe-{BUNDLED_VOCAB_SIZE}"
BUNDLED_TOKENIZER_FILE = CORPUS_DIR / f"{BUNDLED_TOKENIZER_NAME}.json"


def train_tokenizer(vocab_size: int = BUNDLED_VOCAB_SIZE) -> str:
    """The trained tokenizer as ``tokenizer.json`` text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    texts = [s.text for s in read_corpus("shakespeare", "train")]
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return str(tokenizer.to_str(pretty=False))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, default=BUNDLED_VOCAB_SIZE)
    parser.add_argument("--out", type=Path, default=BUNDLED_TOKENIZER_FILE)
    args = parser.parse_args(argv)
    args.out.write_text(train_tokenizer(args.vocab_size) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
