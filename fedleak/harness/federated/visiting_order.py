"""The order a FedAvg user visits its images in, and the order the server's replay takes.

A user that shuffles draws a secret permutation per epoch (:func:`draw_order`); the server
cannot know it, and when it matters its replay takes one copy of the candidates per epoch
(:func:`epoch_copies`, :func:`copies_order`; Dimitrov et al. 2022) or the order an attack
models (:meth:`~fedleak.harness.federated.local_update.UpdateSimulator.visiting`).
"""

from __future__ import annotations

import torch

from fedleak.harness.federated.protocol import FEDSGD, Protocol


def draw_order(protocol: Protocol, num_images: int, generator: torch.Generator,
               device: torch.device | str = "cpu") -> torch.Tensor | None:
    """The user's secret visiting order [E, n] for a shuffled FedAvg (one permutation per
    epoch, as a ``DataLoader(shuffle=True)`` draws it), or None when it takes them in order."""
    if protocol.kind == FEDSGD or not protocol.shuffle:
        return None
    return torch.stack([torch.randperm(num_images, generator=generator)
                        for _ in range(protocol.local_epochs)]).to(device)


def epoch_copies(protocol: Protocol, num_images: int) -> int:
    """How many copies of the n candidate images the server's replay takes: E when the user's
    unseen order matters (:meth:`Protocol.order_matters`) and it trains several epochs, else 1
    (one epoch in any order is one assignment of the candidates to its slots)."""
    return protocol.local_epochs if protocol.order_matters(num_images) else 1


def copies_order(protocol: Protocol, num_images: int, device: torch.device | str
                 ) -> torch.Tensor | None:
    """The replay's visiting order over ``copies × n`` candidate images: epoch e visits its own
    copy e in order (None when one copy is taken)."""
    copies = epoch_copies(protocol, num_images)
    if copies == 1:
        return None
    return torch.arange(copies * num_images, device=device).view(copies, num_images)
