"""The server's differentiable replay of a text user's local update, from token embeddings.

The user's update is :func:`~fedleak.harness.federated.local_update.local_update` over a
:class:`~fedleak.harness.zoo.text.text_models.TextModel` on its private token ids; the replay is the
very same function over candidate *embeddings*: the model's input is then
``[B, T, d + 1]``, the embeddings with the attention mask as the last feature, which the
model splits again (:class:`~fedleak.harness.zoo.text.text_models.TextModel`). So FedSGD, FedAvg
(epochs, mini-batches, momentum), the loss (mean cross-entropy over the batch's real next
tokens, or over its sentences' classes) and the attention masking are the user's own — one
definition, as for images. The token embedding matrix is not looked up from embeddings, so
its entry of a replayed update is zero (when the language-model head is tied to it, that
entry holds the head's use alone).

Exact for FedSGD and for one local step. Over several FedAvg steps the user's own embedding
rows move with its training while replayed embeddings stay where the attack put them, so a
multi-step replay from embeddings is inexact (a few per cent of the update on the bundled
models at τ = 0.01); an attack that needs exactness there replays from token ids.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from fedleak.harness.federated.local_update import local_update
from fedleak.harness.federated.protocol import Protocol


class TextReplay:
    """``replay(inputs_embeds [B, T, d], attention_mask [B, T], labels) -> update`` at fixed
    global parameters (the contract of
    :data:`~fedleak.attacks.text_observation.TextReplayFn`), differentiable with
    respect to ``inputs_embeds``. Buffers are copied per call: the replay never moves them."""

    def __init__(self, model: nn.Module, parameters: Mapping[str, torch.Tensor],
                 buffers: Mapping[str, torch.Tensor], protocol: Protocol) -> None:
        self.model = model
        self.parameters = {k: v.detach().requires_grad_(True) for k, v in parameters.items()}
        self.buffers = {k: v.detach().clone() for k, v in buffers.items()}
        self.protocol = protocol

    def __call__(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor,
                 labels: torch.Tensor) -> list[torch.Tensor]:
        if inputs_embeds.dim() != 3 or attention_mask.shape != inputs_embeds.shape[:2]:
            raise ValueError(f"replay takes inputs_embeds [B, T, d] and attention_mask [B, T], "
                             f"got {tuple(inputs_embeds.shape)} and "
                             f"{tuple(attention_mask.shape)}")
        inputs = torch.cat([inputs_embeds, attention_mask[..., None].to(inputs_embeds)], -1)
        own = {k: v.clone() for k, v in self.buffers.items()}
        return local_update(self.model, self.parameters, own, inputs, labels.to(inputs.device),
                            self.protocol, create_graph=True)
