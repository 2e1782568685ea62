"""Build the attack's threat model, an :class:`~fedleak.attacks.Observation`, in one place.

Two doors lead here:

- :func:`observe` is the in-process (notebook) path, like Opacus's ``make_private``: give a
  model, private images on [0, 1], their labels, the data description and a protocol (and,
  optionally, a defense chain); the user's update is computed with the very code a victim runs
  (:func:`~fedleak.harness.federated.defended_update.defended_update`) and the server's view of
  that round comes back, ready for ``attack.reconstruct``. Tests and bench scripts use it.
- :func:`observation_from_update` is the server's path: the attacker process calls it with
  the θ it sent and the update a victim returned over the wire.

Both return the same thing: the parameters sent, the update received, the public facts
(update kind, n, data shape, classes, normalisation, local steps, τ) and ``simulate``, an
:class:`~fedleak.harness.federated.local_update.UpdateSimulator` that replays the user's local
update on candidate images with a graph. Never the private images.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

import torch
from torch import nn

from fedleak.attacks import Observation
from fedleak.attacks.published import PublishedDefense, published
from fedleak.defenses import DefenseChain
from fedleak.harness.federated.defended_update import defended_update
from fedleak.harness.federated.local_update import UpdateSimulator
from fedleak.harness.federated.protocol import FEDAVG, Protocol
from fedleak.harness.zoo.datasets import DatasetInfo, image_shape, normalize


def observe(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    info: DatasetInfo,
    protocol: Protocol | None = None,
    *,
    defenses: DefenseChain | None = None,
    generator: torch.Generator | None = None,
    give_labels: bool = False,
    return_buffers: bool | None = None,
) -> Observation:
    """The server's view of one round in which the user trained ``model`` on ``images``.

    ``images`` are on [0, 1] (normalised here with ``info``); the model's current parameters
    and buffers are the global model θ the server sent, on the model's device. ``defenses``
    run as on a victim, with randomness from ``generator`` (a secret seed when None).
    ``give_labels`` puts the true labels into the observation, for threat models in which the
    server knows them (a victim never sends them). ``return_buffers`` puts the buffers local
    training left into the observation, as a victim returning them does (None: for FedAvg, the
    victim's default ``--return-buffers fedavg``).
    """
    protocol = protocol or Protocol()
    device = next(model.parameters()).device
    parameters = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    x = normalize(images.to(device), info).float()
    y = labels.to(device)
    chain = defenses or DefenseChain()
    for defense in chain.update:
        defense.bind(list(parameters))
    generator = generator or torch.Generator().manual_seed(secrets.randbits(63))
    own_buffers = {n: b.detach().clone() for n, b in buffers.items()}  # training moves them
    update, metadata = defended_update(model, parameters, own_buffers, x, y, protocol, chain,
                                       generator)
    return observation_from_update(
        model, parameters, buffers, update, protocol, info, num_images=int(images.shape[0]),
        metadata=metadata, labels=y.clone() if give_labels else None,
        defenses=published(chain.describe()),
        returned_buffers=own_buffers if (protocol.kind == FEDAVG if return_buffers is None
                                         else return_buffers) else None,
    )


def observation_from_update(
    model: nn.Module,
    parameters: Mapping[str, torch.Tensor],
    buffers: Mapping[str, torch.Tensor],
    update: list[torch.Tensor],
    protocol: Protocol,
    info: DatasetInfo,
    *,
    num_images: int,
    update_kind: str | None = None,
    local_steps: int | None = None,
    metadata: Mapping[str, str] | None = None,
    labels: torch.Tensor | None = None,
    device: torch.device | str | None = None,
    defenses: tuple[PublishedDefense, ...] = (),
    returned_buffers: Mapping[str, torch.Tensor] | None = None,
) -> Observation:
    """What a server holds after a round, on ``device`` (default: where ``parameters`` live).

    ``update_kind`` and ``local_steps`` default to what ``protocol`` implies for
    ``num_images`` images; a victim reports both, and the attacker passes what it reported.
    ``defenses`` is the defense chain the victim publishes in ``Describe``;
    ``returned_buffers`` the buffers it sent with the update, if any.
    """
    device = torch.device(device) if device is not None else \
        next(iter(parameters.values())).device
    model = model.to(device)
    simulator = UpdateSimulator(model, {n: t.to(device) for n, t in parameters.items()},
                                {n: b.to(device) for n, b in buffers.items()}, protocol,
                                num_images)
    return Observation(
        parameter_names=list(parameters),
        parameters=list(simulator.parameters.values()),
        update=[u.to(device) for u in update],
        update_kind=update_kind or protocol.update_kind(),
        num_images=num_images,
        image_shape=image_shape(info),
        num_classes=info.num_classes,
        mean=info.mean,
        std=info.std,
        simulate=simulator,
        local_steps=protocol.local_steps(num_images) if local_steps is None else local_steps,
        learning_rate=protocol.local_learning_rate,
        labels=labels,
        metadata=dict(metadata or {}),
        defenses=tuple(defenses),
        returned_buffers=None if returned_buffers is None else
        {n: b.to(device) for n, b in returned_buffers.items()},
    )
