"""Build a text attack's threat model, a
:class:`~fedleak.attacks.text_observation.TextObservation`, in one place.

As for images (:mod:`fedleak.harness.federated.observe`), two doors: :func:`observe_text`, the
in-process path (a model, private token ids and labels, a protocol and optionally a defense
chain: the update is computed by the victim's own defended path), and
:func:`text_observation_from_update`, the server's path with the θ it sent and the update a
victim returned. Both give the ``transformers`` model with θ loaded, the update by the
model's own parameter names, the public facts and the replay
(:class:`~fedleak.harness.federated.text_replay.TextReplay`). Never the private ids.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

import torch

from fedleak.attacks.published import PublishedDefense, published
from fedleak.attacks.text_observation import TextObservation
from fedleak.defenses import DefenseChain
from fedleak.harness.federated.defended_update import defended_update
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.federated.text_replay import TextReplay
from fedleak.harness.zoo.text.text_datasets import TextInfo
from fedleak.harness.zoo.text.text_models import TextModel


def observe_text(
    model: TextModel,
    tokens: torch.Tensor,
    labels: torch.Tensor,
    info: TextInfo,
    protocol: Protocol | None = None,
    *,
    defenses: DefenseChain | None = None,
    generator: torch.Generator | None = None,
    public_sequences: list[list[int]] | None = None,
) -> TextObservation:
    """The server's view of one round in which the user trained ``model`` (its current
    parameters are θ) on ``tokens`` [n, T] with ``labels``, through ``defenses``."""
    protocol = protocol or Protocol()
    device = next(model.parameters()).device
    parameters = dict(model.named_parameters())
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    chain = defenses or DefenseChain()
    for defense in chain.update:
        defense.bind(list(parameters))
    generator = generator or torch.Generator().manual_seed(secrets.randbits(63))
    update, metadata = defended_update(model, parameters, dict(buffers), tokens.to(device),
                                       labels.to(device), protocol, chain, generator)
    return text_observation_from_update(
        model, parameters, buffers, update, protocol, info, num_sequences=int(tokens.shape[0]),
        metadata=metadata, defenses=published(chain.describe()),
        public_sequences=public_sequences)


def text_observation_from_update(
    model: TextModel,
    parameters: Mapping[str, torch.Tensor],
    buffers: Mapping[str, torch.Tensor],
    update: list[torch.Tensor],
    protocol: Protocol,
    info: TextInfo,
    *,
    num_sequences: int,
    update_kind: str | None = None,
    local_steps: int | None = None,
    metadata: Mapping[str, str] | None = None,
    device: torch.device | str | None = None,
    defenses: tuple[PublishedDefense, ...] = (),
    public_sequences: list[list[int]] | None = None,
) -> TextObservation:
    """What a server holds after a text round, on ``device`` (default: where θ lives); the
    model's parameters and buffers are set to θ (``parameters``, ``buffers``) in place."""
    device = torch.device(device) if device is not None else \
        next(iter(parameters.values())).device
    model = model.to(device)
    theta = {n: t.detach().to(device) for n, t in parameters.items()}
    fixed = {n: b.detach().to(device) for n, b in buffers.items()}
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(theta[name])
        for name, b in model.named_buffers():
            if name in fixed:
                b.copy_(fixed[name])
    replay = TextReplay(model, theta, fixed, protocol)
    tokenizer = info.checked_tokenizer
    names = list(parameters)
    embedding = model.embedding_name()
    return TextObservation(
        parameter_names=[model.hf_name(n) for n in names],
        parameters=[theta[n] for n in names],
        update=[u.to(device) for u in update],
        update_kind=update_kind or protocol.update_kind(),
        num_sequences=num_sequences,
        seq_len=info.seq_len,
        vocab_size=int(model.input_embeddings().num_embeddings),
        pad_id=tokenizer.pad_id,
        architecture=model.architecture,
        task=info.task,
        num_classes=info.num_classes,
        model=model.net,
        replay=replay,
        embedding_name=model.hf_name(embedding) if embedding else "",
        tied_head=model.tied_head(),
        start_id=tokenizer.start_id,
        end_id=tokenizer.end_id,
        special_ids=tokenizer.special_ids,
        local_steps=protocol.local_steps(num_sequences) if local_steps is None else local_steps,
        learning_rate=protocol.local_learning_rate,
        metadata=dict(metadata or {}),
        defenses=tuple(defenses),
        lora=hasattr(model.net, "peft_config"),
        public_sequences=list(public_sequences or []),
    )
