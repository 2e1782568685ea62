"""The update a Flower train reply carries, and the reply that carries a given update.

Flower clients reply with their whole new state θ′ (a strategy averages models), so the update
is read off the difference with the θ the server sent:

- FedAvg (``fedleak-protocol = fedavg``): the delta Δ = θ′ − θ (Inverting Gradients
  supplement eq. 1), what fedleak's victim sends;
- one-step FedSGD (``fedleak-protocol = fedsgd``): the client took one SGD step at τ over its
  batch, θ′ = θ − τ g, so the gradient is g = (θ − θ′) / τ.

Only parameters carry the update; buffers (BatchNorm running statistics) travel as they are.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fedleak.harness.federated.protocol import FEDSGD, Protocol


def update_of(sent: Mapping[str, torch.Tensor], got: Mapping[str, torch.Tensor],
              names: list[str], protocol: Protocol) -> list[torch.Tensor]:
    """The update (one tensor per name in ``names``) a reply ``got`` to ``sent`` carries."""
    if protocol.kind == FEDSGD:
        return [(sent[k] - got[k]) / protocol.learning_rate for k in names]
    return [got[k] - sent[k] for k in names]


def state_carrying(sent: Mapping[str, torch.Tensor], update: list[torch.Tensor],
                   names: list[str], protocol: Protocol) -> dict[str, torch.Tensor]:
    """θ′: ``sent`` with parameters ``names`` moved by ``update`` (the inverse of
    :func:`update_of`); other entries (buffers) are kept as they are in ``sent``."""
    out = dict(sent)
    for key, u in zip(names, update, strict=True):
        out[key] = sent[key] - protocol.learning_rate * u if protocol.kind == FEDSGD \
            else sent[key] + u
    return out
