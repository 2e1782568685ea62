"""Utility of a text model and brief centralised training of one (a federation's starting point).

- :func:`text_utility`: a language model's test *perplexity*, exp of the mean next-token
  cross-entropy over every real next token of the split (padding and the last position
  ignored, as in the user's loss), with its next-token accuracy; a classifier's test accuracy.
- :func:`train_text_model`: mini-batch Adam on the train split for a few epochs, the user's
  own loss (:func:`~fedleak.harness.federated.local_update.user_loss`): a "briefly trained"
  global model (trained layer norms and attention, unlike a random initialisation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from fedleak.harness.federated.local_update import user_loss
from fedleak.harness.zoo.text.text_datasets import IGNORE_INDEX, LANGUAGE_MODEL, TextDataset

#: the largest mean loss whose exp a float holds (log of the largest double, rounded down)
MAX_LOG = 709.0


@dataclass
class TextUtility:
    """Test accuracy (next-token accuracy for a language model) and perplexity (None for a
    classifier)."""

    accuracy: float
    perplexity: float | None


def text_utility(model: nn.Module, data: TextDataset, batch_size: int = 64,
                 limit: int | None = None) -> TextUtility:
    """Evaluate ``model`` (eval mode, no graph) on ``data`` (its first ``limit`` rows)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    rows = len(data) if limit is None else min(limit, len(data))
    correct, count, loss = 0, 0, 0.0
    with torch.no_grad():
        for start in range(0, rows, batch_size):
            stop = min(start + batch_size, rows)
            x = data.tokens[start:stop].to(device)
            y = data.labels[start:stop].to(device)
            logits = model(x)
            keep = y != IGNORE_INDEX
            correct += int(((logits.argmax(1) == y) & keep).sum())
            count += int(keep.sum())
            if data.info.task == LANGUAGE_MODEL:
                loss += float(F.cross_entropy(logits, y, reduction="sum"))
    model.train(was_training)
    mean = loss / max(count, 1)
    # a training that diverged has a mean loss past exp's range: its perplexity is infinite
    perplexity = (math.exp(mean) if mean < MAX_LOG else math.inf) \
        if data.info.task == LANGUAGE_MODEL else None
    return TextUtility(correct / max(count, 1), perplexity)


def train_text_model(model: nn.Module, train: TextDataset, *, epochs: int = 1,
                     batch_size: int = 32, lr: float = 1e-3, seed: int = 0,
                     steps: int | None = None) -> int:
    """Adam on ``train`` for ``epochs`` (at most ``steps`` steps), in place; the steps run."""
    generator = torch.Generator().manual_seed(seed)
    optimiser = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    device = next(model.parameters()).device
    model.train()
    done = 0
    for _ in range(epochs):
        order = torch.randperm(len(train), generator=generator)
        for start in range(0, len(order), batch_size):
            if steps is not None and done >= steps:
                return done
            rows = order[start:start + batch_size]
            optimiser.zero_grad()
            loss = user_loss(model(train.tokens[rows].to(device)), train.labels[rows].to(device))
            loss.backward()
            optimiser.step()
            done += 1
    return done
