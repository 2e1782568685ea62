"""Binary tasks on the multi-class data sets, for the KKT attack's classifier (labels y ∈ {±1}).

Haim et al. (2022, Sec. 5.1) train binary classifiers: MNIST odd/even and CIFAR-10
vehicles/animals. The tasks here, by data set name (the first group named is y = +1):

- ``digits``: odd digits (1, 3, 5, 7, 9) vs even digits.
- ``cifar10``: vehicles (airplane, automobile, ship, truck) vs animals.
- ``faces``: face (label 0) vs non-face (label 1).
- ``photos``: the first half of the photograph classes (labels 0–4) vs the second half.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from fedleak.harness.zoo.datasets import CIFAR10_CLASSES, PHOTO_NAMES

BinaryLabels = Callable[[Tensor], Tensor]

_CIFAR10_VEHICLES = ("airplane", "automobile", "ship", "truck")


def _positive_classes(name: str) -> tuple[int, ...]:
    if name == "digits":
        return (1, 3, 5, 7, 9)
    if name == "cifar10":
        return tuple(CIFAR10_CLASSES.index(c) for c in _CIFAR10_VEHICLES)
    if name == "faces":
        return (0,)
    if name == "photos":
        return tuple(range(len(PHOTO_NAMES) // 2))
    raise ValueError(f"no binary task for data set {name!r}; choose one of {', '.join(TASKS)}")


#: Data set name → what y = +1 and y = −1 mean.
TASKS: dict[str, str] = {
    "digits": "+1 odd digit, -1 even digit",
    "cifar10": "+1 vehicle (airplane, automobile, ship, truck), -1 animal",
    "faces": "+1 face, -1 non-face",
    "photos": "+1 photographs 0-4, -1 photographs 5-9",
}


def binary_task(name: str) -> BinaryLabels:
    """``labels (int64 class indices) -> y`` (float32, +1 or −1) for data set ``name``."""
    positive = torch.tensor(_positive_classes(name))

    def to_binary(labels: Tensor) -> Tensor:
        is_positive = torch.isin(labels.long().cpu(), positive).to(labels.device)
        return torch.where(is_positive, 1.0, -1.0)

    return to_binary


def balanced_subset(
    labels: Tensor, task: str, n: int, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """Indices of ``n`` samples, ⌈n/2⌉ with y = +1 and ⌊n/2⌋ with y = −1, and their y.

    The paper trains on balanced sets (e.g. 250 odd and 250 even digits). Samples are drawn
    without replacement by a generator seeded with ``seed``; positives come first.
    """
    if n < 2:
        raise ValueError(f"need n >= 2 training samples, got {n}")
    y = binary_task(task)(labels)
    generator = torch.Generator().manual_seed(seed)
    chosen = []
    for sign, count in ((1.0, (n + 1) // 2), (-1.0, n // 2)):
        pool = torch.nonzero(y == sign).flatten()
        if len(pool) < count:
            raise ValueError(
                f"task {task!r} has {len(pool)} samples with y={sign:+.0f}, need {count}"
            )
        chosen.append(pool[torch.randperm(len(pool), generator=generator)[:count]])
    indices = torch.cat(chosen)
    return indices, y[indices]
