"""What a text victim publishes in ``Describe`` (``DataSpec.text``): its sequence layout, its
tokenizer (whole: it is public, as a deployed federation's is) and its model's architecture
(the ``transformers`` config), so a server rebuilds the model and reads recovered ids as text
without any file of the victim's."""

from __future__ import annotations

from torch import nn

from fedleak.harness.zoo.text.text_datasets import TextDataset
from fedleak.harness.zoo.text.text_models import TextModel
from fedleak.v1 import victim_pb2 as pb


def text_spec(data: object, model: nn.Module) -> pb.TextSpec | None:
    """``DataSpec.text`` for a text victim holding ``data`` and ``model``; None for images."""
    if not isinstance(data, TextDataset) or not isinstance(model, TextModel):
        return None
    info = data.info
    tok = info.checked_tokenizer
    embedding = model.embedding_name()
    return pb.TextSpec(
        seq_len=info.seq_len, vocab_size=tok.vocab_size, task=info.task,
        architecture=model.architecture, pad_id=tok.pad_id, start_id=tok.start_id,
        end_id=tok.end_id, special_ids=list(tok.special_ids), tokenizer=tok.name,
        tokenizer_sha256=tok.sha256, tokenizer_json=tok.json,
        model_config=model.config_json(), embedding=model.hf_name(embedding) if embedding
        else "", tied_head=model.tied_head(), lora=hasattr(model.net, "peft_config"),
        secrets=len(data.secrets))
