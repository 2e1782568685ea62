"""Build a :class:`Victim` from the options a person gives ``fedleak victim serve``."""

from __future__ import annotations

from pathlib import Path

import torch

from fedleak.harness.datasets import ImageDataset, load_dataset
from fedleak.harness.models import ModelSpec, build_model, load_checkpoint
from fedleak.harness.protocol import Protocol
from fedleak.harness.victim import Victim, VictimConfig


class SetupError(ValueError):
    """Options that cannot build a victim; the message says which option to change."""


def parse_indices(text: str, count: int) -> list[int]:
    """Parse ``0-3,7`` into ``[0, 1, 2, 3, 7]``, each within ``[0, count)``."""
    indices: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, sep, last = part.partition("-")
        try:
            lo = int(first)
            hi = int(last) if sep else lo
        except ValueError:
            raise SetupError(f"--images {text!r}: {part!r} is not an index or a range a-b") \
                from None
        if not 0 <= lo <= hi < count:
            raise SetupError(f"--images {text!r}: {part!r} is outside 0-{count - 1} "
                             f"({count} images in this split)")
        indices.extend(range(lo, hi + 1))
    if not indices:
        raise SetupError(f"--images {text!r} selects no image")
    return indices


def private_pool(
    data: ImageDataset, images: str | None, shuffle: bool, seed: int
) -> ImageDataset:
    """The victim's private images: a selection of the split, optionally shuffled by ``seed``."""
    order = torch.arange(len(data.labels))
    if images:
        order = torch.tensor(parse_indices(images, len(data.labels)))
    if shuffle:
        generator = torch.Generator().manual_seed(seed)
        order = order[torch.randperm(len(order), generator=generator)]
    return ImageDataset(images=data.images[order], labels=data.labels[order], info=data.info)


def create_victim(
    dataset: str,
    model: str,
    *,
    split: str = "train",
    images: str | None = None,
    shuffle: bool = False,
    data_root: str | None = None,
    download: bool = False,
    checkpoint: str | Path | None = None,
    batch_size: int = 1,
    seed: int = 0,
    protocol: Protocol | None = None,
    reveal: bool = False,
    device: str = "cpu",
) -> Victim:
    """Load the private pool, build the model (seeded init or checkpoint) and the victim."""
    data = private_pool(load_dataset(dataset, split, data_root, download), images, shuffle, seed)
    if batch_size > len(data.labels):
        raise SetupError(f"--batch-size {batch_size} exceeds the {len(data.labels)} private "
                         "images; lower it or select more with --images")
    spec = ModelSpec.parse(model)
    torch.manual_seed(seed)
    net = build_model(spec, data.info.shape, data.info.num_classes)
    if checkpoint is not None:
        load_checkpoint(net, str(checkpoint))
    config = VictimConfig(
        model=spec,
        protocol=protocol or Protocol(),
        num_images=batch_size,
        reveal_enabled=reveal,
        device=device,
    )
    return Victim(config, data, net)
