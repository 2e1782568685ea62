"""Which images of a split a run uses: ``--images 0-3,7`` and the private pool it selects."""

from __future__ import annotations

import torch

from fedleak.harness.zoo.datasets import ImageDataset
from fedleak.harness.zoo.text.text_datasets import PrivateData, TextDataset


class SelectionError(ValueError):
    """An ``--images`` selection that names no image or one outside the split."""


def parse_indices(text: str, count: int) -> list[int]:
    """Parse ``0-3,7`` into ``[0, 1, 2, 3, 7]``, each within ``[0, count)``."""
    indices: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, sep, last = part.partition("-")
        try:
            lo = int(first)
            hi = int(last) if sep else lo
        except ValueError:
            raise SelectionError(f"--images {text!r}: {part!r} is not an index or a range a-b") \
                from None
        if not 0 <= lo <= hi < count:
            raise SelectionError(f"--images {text!r}: {part!r} is outside 0-{count - 1} "
                                 f"({count} images in this split)")
        indices.extend(range(lo, hi + 1))
    if not indices:
        raise SelectionError(f"--images {text!r} selects no image")
    return indices


def private_pool(data: PrivateData, images: str | None, shuffle: bool, seed: int) -> PrivateData:
    """A selection of the split (``images``: for text, sentence indices), optionally shuffled
    by ``seed``."""
    order = torch.arange(len(data.labels))
    if images:
        order = torch.tensor(parse_indices(images, len(data.labels)))
    if shuffle:
        generator = torch.Generator().manual_seed(seed)
        order = order[torch.randperm(len(order), generator=generator)]
    if isinstance(data, TextDataset):
        return data.select(order)
    return ImageDataset(images=data.images[order], labels=data.labels[order], info=data.info)
