"""What a text victim publishes through ``Describe``, as the server's typed objects: the
data description with the victim's own tokenizer (rebuilt from the published JSON and checked
against its sha256), and the model rebuilt from the published ``transformers`` config and
checked against the victim's parameter list, so both sides differentiate the same function.
"""

from __future__ import annotations

import grpc
import torch

from fedleak.harness.attacker.client import VictimClient, VictimError
from fedleak.harness.attacker.described import model_spec
from fedleak.harness.zoo.models import load_checkpoint
from fedleak.harness.zoo.text.text_datasets import TextInfo, load_text_dataset
from fedleak.harness.zoo.text.text_models import TextModel, build_text_model
from fedleak.harness.zoo.text.tokenizer import TokenizerError, tokenizer_from_json
from fedleak.v1 import victim_pb2 as pb


def is_text_victim(described: pb.DescribeResponse) -> bool:
    """Whether the victim holds text (it publishes ``DataSpec.text``)."""
    return described.data.HasField("text")


def text_info(described: pb.DescribeResponse) -> TextInfo:
    """The published text data description, with the victim's tokenizer."""
    if not is_text_victim(described):
        raise VictimError(grpc.StatusCode.FAILED_PRECONDITION,
                          f"the victim holds {described.data.dataset} images, not text; use an "
                          "image attack (fedleak attack --help lists them)")
    t = described.data.text
    try:
        tokenizer = tokenizer_from_json(t.tokenizer_json, t.tokenizer)
    except TokenizerError as err:
        raise VictimError(grpc.StatusCode.FAILED_PRECONDITION, str(err)) from None
    if tokenizer.sha256 != t.tokenizer_sha256:
        raise VictimError(grpc.StatusCode.FAILED_PRECONDITION,
                          "the victim's published tokenizer does not match its sha256")
    d = described.data
    return TextInfo(name=d.dataset, shape=(t.seq_len,), num_classes=d.num_classes, mean=(),
                    std=(), class_names=tuple(d.class_names), seq_len=t.seq_len, task=t.task,
                    tokenizer=tokenizer)


def text_server_model(described: pb.DescribeResponse, info: TextInfo) -> TextModel:
    """The architecture the victim published, checked against its parameter list."""
    spec = model_spec(described)
    model = build_text_model(spec, info, config_json=described.data.text.model_config)
    ours = [(n, list(p.shape)) for n, p in model.named_parameters()]
    theirs = [(p.name, list(p.shape)) for p in described.parameters]
    if ours != theirs:
        raise VictimError(grpc.StatusCode.FAILED_PRECONDITION,
                          f"the victim's {spec} does not match this fedleak's build of it from "
                          "the published config; run the same fedleak version on both sides")
    return model


def text_global_parameters(client: VictimClient, described: pb.DescribeResponse,
                           info: TextInfo, checkpoint: str | None, model_seed: int | None
                           ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """θ to send: the federation's global model, or a fresh seeded init, or a checkpoint of
    ours (a state dict of the same text model)."""
    if checkpoint is None and model_seed is None:
        return client.global_model()
    params, buffers = client.global_model()  # frozen base weights (LoRA) stay the victim's
    if model_seed is not None:
        torch.manual_seed(model_seed)
    model = text_server_model(described, info)
    if checkpoint:
        load_checkpoint(model, checkpoint)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    if checkpoint:
        buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    return params, buffers


def public_text(described: pb.DescribeResponse, info: TextInfo) -> list[list[int]]:
    """Public text the server holds, tokenised with the victim's tokenizer: a bundled corpus's
    split the victim does not draw from (train for a test victim, test for a train victim);
    none for a victim on all of it or on the user's own text."""
    other = {"train": "test", "test": "train"}.get(described.data.split)
    if described.data.dataset not in ("shakespeare", "alice") or other is None:
        return []
    data = load_text_dataset(described.data.dataset, other, task=info.task, seq_len=info.seq_len,
                             tokenizer=info.checked_tokenizer)
    pad = info.checked_tokenizer.pad_id
    return [[t for t in row if t != pad] for row in data.tokens.tolist()]
