"""Centralised training of a zoo model on a labelled data set, for "trained" checkpoints.

Attacks on trained parameters (Inverting Gradients, Table 1's "trained" columns) need a model
that has learned something. This trains with the user's own loss (:func:`user_loss`, mean
cross-entropy) on normalised images, SGD with momentum and a cosine learning-rate schedule,
and reports test accuracy (the utility measure).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from fedleak.harness.federated.local_update import user_loss
from fedleak.harness.zoo.datasets import ImageDataset, normalize


@dataclass
class TrainingResult:
    epochs: int
    final_train_loss: float
    train_accuracy: float
    test_accuracy: float


@torch.no_grad()
def accuracy(model: nn.Module, data: ImageDataset, batch_size: int = 512) -> float:
    """Top-1 accuracy of ``model`` (eval mode) on ``data``."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    correct = 0
    for start in range(0, len(data.labels), batch_size):
        x = normalize(data.images[start:start + batch_size], data.info).to(device)
        y = data.labels[start:start + batch_size].to(device)
        correct += int((model(x).argmax(1) == y).sum())
    model.train(was_training)
    return correct / max(1, len(data.labels))


def train_classifier(
    model: nn.Module,
    train: ImageDataset,
    test: ImageDataset,
    *,
    epochs: int = 20,
    batch_size: int = 64,
    lr: float = 0.05,
    momentum: float = 0.9,
    weight_decay: float = 5e-4,
    seed: int = 0,
    device: str = "cpu",
    on_epoch: Callable[[int, float, float], None] | None = None,
) -> TrainingResult:
    """Train ``model`` in place; ``on_epoch(epoch, train_loss, test_accuracy)`` after each epoch.

    Learning rate follows lr·½(1 + cos(π·t/T)) over the T optimisation steps.
    """
    model.to(device).train()
    generator = torch.Generator().manual_seed(seed)
    optimiser = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                                weight_decay=weight_decay)
    n = len(train.labels)
    steps_per_epoch = math.ceil(n / batch_size)
    total = epochs * steps_per_epoch
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda t: 0.5 * (1 + math.cos(math.pi * t / total))
    )
    images = normalize(train.images, train.info)
    loss_value = float("nan")
    for epoch in range(epochs):
        order = torch.randperm(n, generator=generator)
        running = 0.0
        for start in range(0, n, batch_size):
            batch = order[start:start + batch_size]
            if len(batch) < 2 and any(isinstance(m, nn.modules.batchnorm._BatchNorm)
                                      for m in model.modules()):
                continue  # BatchNorm cannot train on a single image
            x, y = images[batch].to(device), train.labels[batch].to(device)
            loss = user_loss(model(x), y)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            scheduler.step()
            running += float(loss) * len(batch)
        loss_value = running / n
        if on_epoch is not None:
            on_epoch(epoch, loss_value, accuracy(model, test))
    return TrainingResult(
        epochs=epochs,
        final_train_loss=loss_value,
        train_accuracy=accuracy(model, train),
        test_accuracy=accuracy(model, test),
    )
