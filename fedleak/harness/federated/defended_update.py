"""The user's update through its defense chain: the one defended path, victim and notebook alike.

Local training runs the protocol (its batches in the secret order drawn from ``generator``
when the protocol shuffles them, (:func:`~fedleak.harness.federated.local_update.local_update`),
or, when the chain has a per-example defense (DP-SGD), the privatised local training of
:func:`~fedleak.harness.federated.private_update.private_local_update`, whose privacy accounting
(ε spent, by the declaration's accountant) goes into the metadata; then every update defense
of the chain applies in order, Δ ← D_k(Δ), drawing its randomness from ``generator`` (a
declared clipped Gaussian update stage accounts its round into the metadata too). Transport
defenses (secure aggregation) act later, between users, and are not applied here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from fedleak.defenses import DefenseChain
from fedleak.harness.federated.local_update import CancelCheck, draw_order, local_update
from fedleak.harness.federated.private_update import TrialCanary, private_local_update
from fedleak.harness.federated.protocol import FEDSGD, Protocol


def defended_update(
    model: nn.Module,
    parameters: Mapping[str, torch.Tensor],
    buffers: Mapping[str, torch.Tensor],
    images: torch.Tensor,
    labels: torch.Tensor,
    protocol: Protocol,
    chain: DefenseChain,
    generator: torch.Generator,
    cancelled: CancelCheck | None = None,
    account: bool = True,
    canary: TrialCanary | None = None,
    observe: Callable[[list[torch.Tensor]], None] | None = None,
) -> tuple[list[torch.Tensor], dict[str, str]]:
    """The defended update (one tensor per parameter) and the defenses' public metadata.

    ``account`` charges the round to the accountants the chain's declarations earn
    (:attr:`~fedleak.defenses.DefenseChain.accountant`: the per-example mechanism's steps, the
    update stage's rounds) and reports their ε; the users of one secure-aggregation round are
    accounted once (each user's ε is the same), so the victim passes False for all but one.

    ``canary`` (an audit trial's) enters before every defense: as one more example of the
    per-example defense's local training (DP-SGD clips and noises it as data), or, without a
    per-example defense, as one more image at the end of the batch (input canary) or added to
    the finished update, Δ + c (gradient canary), before the update defenses. ``observe``
    (an audit's) is handed the update as it enters the update defenses.

    ``images`` are in the model's normalised space. Raises ``ValueError`` when local training
    is impossible (e.g. training-mode BatchNorm on a single value), and
    :class:`~fedleak.harness.federated.local_update.ComputationCancelled` when ``cancelled()``
    turns true before a local step.
    """
    metadata: dict[str, str] = {}
    if chain.per_example is not None:
        order = draw_order(protocol, int(images.shape[0]), generator, images.device)
        private = private_local_update(model, parameters, buffers, images, labels, protocol,
                                       chain.per_example, generator, cancelled, canary,
                                       order=order)
        update = private.update
        if account:
            epochs = 1 if protocol.kind == FEDSGD else protocol.local_epochs
            metadata.update(chain.accountant.local_training(
                int(images.shape[0]), protocol.batch_size, epochs, private.steps))
    else:
        if canary is not None and canary.image is not None:
            images = torch.cat([images, canary.image[None].to(images)])
            labels = torch.cat([labels, torch.tensor([canary.label], device=labels.device)])
        order = draw_order(protocol, int(images.shape[0]), generator, images.device)
        update = local_update(model, parameters, buffers, images, labels, protocol,
                              cancelled=cancelled, order=order)
        if canary is not None and canary.gradient is not None:
            update = [u + c.to(u) for u, c in zip(update, canary.gradient, strict=True)]
    if observe is not None:
        observe(update)
    for defense in chain.update:
        update = defense.apply(update, generator)
    if account:
        metadata.update(chain.accountant.rounds())
    return update, metadata
