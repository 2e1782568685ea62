"""How a per-example canary reaches what the user releases: the local steps' weights and
where the canary sits among them, by the declaration.

A per-example mechanism acts on every local step: the canary's clipped gradient joins the
steps that hold it (fixed batches: the last batch of each epoch; Poisson: each step with
probability q), divided by the expected batch size, and step t's gradient enters the released
update with weight W_t (FedSGD: the gradient itself; FedAvg: θ_T − θ_0 = Σ_t W_t g_t for SGD
with the protocol's momentum, Nesterov and weight decay — computed with the training's own
step). So along a unit direction the canary moves the release by Σ_{t holding} W_t · h / B
(Poisson: q Σ_t W_t · h / B on average, with variance q(1 − q) Σ_t W_t² (h / B)²), and the
declared noise std s on each step's sum reaches it as s / B · √(Σ_t W_t²).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from fedleak.harness.federated.local_update import sgd_step
from fedleak.harness.federated.protocol import FEDSGD, Protocol, local_batches


def gradient_weights(protocol: Protocol, steps: int) -> np.ndarray:
    """W_t: how the gradient of local step t enters the released update (FedSGD: the gradient
    itself, W = 1; FedAvg: θ_T − θ_0 = Σ_t W_t g_t for SGD with the protocol's momentum,
    Nesterov and weight decay — a linear system, so its impulse responses, computed with the
    training's own step)."""
    if protocol.kind == FEDSGD:
        return np.ones(1)
    weights = []
    for t in range(steps):
        params = {"x": torch.zeros((), dtype=torch.float64)}
        velocity = None
        for s in range(steps):
            grad = [torch.tensor(1.0 if s == t else 0.0, dtype=torch.float64)]
            params, velocity = sgd_step(params, grad, velocity, protocol)
        weights.append(float(params["x"]))
    return np.array(weights)


@dataclass(frozen=True)
class StepPlan:
    """Where a per-example canary enters local training, and how that reaches the release."""

    weights: np.ndarray      # |W_t| of every step
    holding: np.ndarray      # fixed batches: the steps that hold the canary
    sample_rate: float | None
    batch: int               # the expected batch size the sum is divided by

    def shift(self, per_step: float) -> tuple[float, float]:
        """(mean, variance) of the canary's contribution to the release, per unit shift."""
        if self.sample_rate is None:
            return per_step * float(self.weights[self.holding].sum()), 0.0
        q = self.sample_rate
        return (per_step * q * float(self.weights.sum()),
                per_step ** 2 * q * (1 - q) * float((self.weights ** 2).sum()))

    def noise(self, std_on_sum: float) -> float:
        """The noise's std along a unit direction of the release."""
        return std_on_sum / self.batch * math.sqrt(float((self.weights ** 2).sum()))


def step_plan(protocol: Protocol, num_images: int, sample_rate: float | None) -> StepPlan:
    """The local steps of a round as the declaration says they run (sample rate: the declared
    Poisson q, or None for fixed or shuffled batches)."""
    if sample_rate is not None:
        steps = 1 if protocol.kind == FEDSGD else \
            protocol.local_epochs * max(1, round(1 / sample_rate))
        weights = np.abs(gradient_weights(protocol, steps))
        return StepPlan(weights, np.arange(steps), sample_rate,
                        max(round(sample_rate * num_images), 1))
    if protocol.kind == FEDSGD:
        return StepPlan(np.ones(1), np.array([0]), None, num_images)
    batches = local_batches(num_images, protocol.batch_size)
    per_epoch = len(batches)
    steps = protocol.local_epochs * per_epoch
    weights = np.abs(gradient_weights(protocol, steps))
    holding = np.array([(e + 1) * per_epoch - 1 for e in range(protocol.local_epochs)])
    last = batches[-1]
    return StepPlan(weights, holding, None, last.stop - last.start)
