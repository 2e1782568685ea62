"""What a malicious server knows before it crafts θ, gathered from ``Describe`` and public data.

The public data is the bundled data set's *other* split (the victim holds ``train``: the server
draws on ``test``, and the other way round), loaded in the attacker's process, never the
victim's images. A victim that holds ``all`` leaves no disjoint split; the server then uses
``test``, which overlaps the victim's pool, and the run records a warning saying so. Data sets
read from a ``--data-root`` (CIFAR, image folders) are on the victim's machine only: the
server then has no public images and the attacks that need them are refused with that reason.
"""

from __future__ import annotations

import grpc
import torch
from torch import nn

from fedleak.attacks.malicious.crafted_parameters import ServerKnowledge
from fedleak.harness.attacker.client import VictimError
from fedleak.harness.zoo.datasets import (
    DatasetError,
    DatasetInfo,
    image_shape,
    load_dataset,
    normalize,
)
from fedleak.v1 import victim_pb2 as pb

BUNDLED = ("digits", "faces", "photos")
OTHER_SPLIT = {"train": "test", "test": "train", "all": "test"}


def public_images(dataset: str, victim_split: str, info: DatasetInfo) -> tuple[torch.Tensor, str,
                                                                              str | None]:
    """Normalised public images, where they come from, and a warning (or None)."""
    if dataset not in BUNDLED:
        raise VictimError(grpc.StatusCode.FAILED_PRECONDITION,
                          f"a malicious server needs public data like the user's; data set "
                          f"{dataset!r} is not bundled with fedleak, so the attacker has none: "
                          f"use digits, faces or photos")
    split = OTHER_SPLIT.get(victim_split, "test")
    try:
        data = load_dataset(dataset, split)
    except DatasetError as err:
        raise VictimError(grpc.StatusCode.FAILED_PRECONDITION, str(err)) from None
    warning = None
    if victim_split not in ("train", "test"):
        warning = (f"the victim holds split {victim_split or 'unknown'!r} of {dataset}; the "
                   f"server's public data ({split}) overlaps the private pool, which helps only "
                   "the choice of cut-offs, never the reading of single inputs")
    return normalize(data.images, info), f"{dataset} {split} split ({len(data)} images)", warning


def server_knowledge(
    described: pb.DescribeResponse,
    model: nn.Module,
    parameters: dict[str, torch.Tensor],
    buffers: dict[str, torch.Tensor],
    info: DatasetInfo,
    images_per_user: int,
    users: int,
    update_kind: str,
) -> tuple[ServerKnowledge, str | None]:
    """The :class:`ServerKnowledge` of a server facing the victim that ``described`` describes,
    and a warning to record (or None)."""
    images, source, warning = public_images(info.name, described.data.split, info)
    pool_per_user = max(described.num_private_images // max(users, 1), 1)
    return ServerKnowledge(
        model=model, parameters=parameters, buffers=buffers, public_images=images,
        public_source=source, image_shape=image_shape(info), num_classes=info.num_classes,
        update_kind=update_kind, images_per_user=images_per_user, users=users,
        same_data_each_round=pool_per_user <= images_per_user,
    ), warning
