"""The options of a text victim (``--seq-len``, ``--tokenizer``, ``--canaries``), written once
and handed to a command as one :class:`TextOptions` value (docs/text.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import click

from fedleak.harness.cli.options import F, packed

DEFAULT_SEQ_LEN = 32  # fedleak.harness.zoo.text.text_datasets.DEFAULT_SEQ_LEN, without importing it


@dataclass(frozen=True)
class TextOptions:
    """How a text victim lays out its sentences (ignored for image data sets)."""

    seq_len: int
    tokenizer: str | None
    canaries: int


def text_options(function: F) -> F:
    """``--seq-len``, ``--tokenizer`` and ``--canaries``, handed over as ``text``."""
    decorators: list[Callable[[F], F]] = [
        click.option("--seq-len", default=DEFAULT_SEQ_LEN, show_default=True,
                     type=click.IntRange(2),
                     help="Text data sets: tokens per sequence T (start token, the sentence, "
                          "end token, padding)."),
        click.option("--tokenizer", default=None,
                     help="Text data sets: a local tokenizer.json or Hugging Face model or "
                          "tokenizer folder (never downloaded); default the bundled "
                          "shakespeare-bpe-4096, or the hf model's own folder."),
        click.option("--canaries", default=0, show_default=True, type=click.IntRange(0),
                     help="Text data sets: secret-sharer canary sentences ('my secret number "
                          "is ...', Carlini et al. 2019) spread through the private pool; "
                          "Score counts the secrets a reconstruction holds."),
    ]
    return packed(TextOptions, "text", decorators)(function)
