"""A text victim's private pool from its settings: the corpus, the task its model trains, the
tokenizer and the canaries (:mod:`fedleak.harness.zoo.text.text_datasets`)."""

from __future__ import annotations

from typing import Any

from fedleak.harness.zoo.model_spec import ModelSpec
from fedleak.harness.zoo.text.corpus import TEXT_CORPORA
from fedleak.harness.zoo.text.pretrained import PRETRAINED_MODELS, pretrained_folder
from fedleak.harness.zoo.text.text_datasets import (
    CLASSIFY,
    LANGUAGE_MODEL,
    TextDataset,
    load_text_dataset,
)


def is_text_dataset(name: str) -> bool:
    """Whether data set ``name`` is text (token sequences) rather than images."""
    return name in TEXT_CORPORA


def model_tokenizer(model: str) -> str | None:
    """The tokenizer a text model brings: an hf model's folder, a pretrained model's own (its
    cache folder); None for the zoo's configs (the bundled tokenizer)."""
    spec = ModelSpec.parse(model)
    if spec.name == "hf":
        return spec.options.get("path")
    if spec.name in PRETRAINED_MODELS:
        return str(pretrained_folder(spec.name))
    return None


def model_task(model: str) -> str:
    """The task a text model trains: ``lm`` for a decoder (gpt2; hf by default, or
    ``hf:task=...``), ``classify`` for an encoder classifier (bert)."""
    spec = ModelSpec.parse(model)
    if spec.name == "bert":
        return CLASSIFY
    if spec.name in PRETRAINED_MODELS:
        return PRETRAINED_MODELS[spec.name].task
    if spec.name == "hf":
        return CLASSIFY if spec.options.get("task", LANGUAGE_MODEL) == CLASSIFY \
            else LANGUAGE_MODEL
    return LANGUAGE_MODEL


def load_text_pool(settings: Any) -> TextDataset:
    """The split of ``settings.dataset`` encoded for ``settings.model``'s task (the hf model's
    own folder, or a pretrained model's own tokenizer, unless ``--tokenizer`` names another);
    canaries seeded by ``settings.seed``."""
    tokenizer = settings.tokenizer or model_tokenizer(settings.model)
    return load_text_dataset(settings.dataset, settings.split, task=model_task(settings.model),
                             seq_len=settings.seq_len, tokenizer=tokenizer,
                             data_root=settings.data_root, canaries=settings.canaries,
                             canary_seed=settings.seed)
