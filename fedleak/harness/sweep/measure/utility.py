"""Utility: test accuracy of a model trained through the defended path, over the wire.

The sweep plays the federated server against a victim that runs the point's defense chain on
a labelled training split, B images per round. For R rounds it sends θ, receives the defended
update and applies it:

    FedSGD:  θ ← θ − η_r · g̃          η_r = η · ½(1 + cos(π r / R))   (or η, ``constant``)
    FedAvg:  θ ← θ + Δ̃                (the user's local rate τ is the protocol's)

With secure aggregation among K users (a ``secagg`` point) every round is a real
secure-aggregation round, each user training on its own B images, and the server applies the
mean of the survivors' updates (the unmasked sum divided by their number). Then it scores the
model on the test split (:func:`fedleak.harness.training.accuracy`). The
privacy budget is the victim's own claim: ``epsilon_total`` of the last update's metadata, as
its accountant computed it over every round it served.

Buffers (BatchNorm running statistics) are never part of an update, so a BatchNorm model is
evaluated with the global model's buffers; prefer models without BatchNorm (mlp, lenet-zhu)
for utility.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from fedleak.harness.attacker.client import ReceivedUpdate, VictimClient
from fedleak.harness.attacker.described import defense_specs, server_model
from fedleak.harness.attacker.secagg_rounds import (
    as_received_update,
    run_secagg,
)
from fedleak.harness.attacker.text.text_described import is_text_victim
from fedleak.harness.federated.training import accuracy
from fedleak.harness.sweep.grid.points import Point, UtilitySettings
from fedleak.harness.sweep.measure.measurements import UtilityMeasurement, float_or_none
from fedleak.harness.sweep.measure.text_measure import text_federated_training
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.victim.settings import VictimSettings
from fedleak.harness.zoo.datasets import load_dataset

RoundCallback = Callable[[int, str], None]


def utility_victim_settings(point: Point, checkpoint: str | None) -> VictimSettings:
    """A victim holding the whole training split, shuffled, B images per round."""
    return dataclasses.replace(
        point.victim_settings(), split="train", shuffle=True,
        batch_size=point.utility_settings.batch_size, defense_seed=point.seed + 1,
        checkpoint=checkpoint)


def learning_rate(settings: UtilitySettings, round_index: int) -> float:
    """η_r of round ``round_index`` (0-based) under the settings' schedule."""
    if settings.schedule == "constant":
        return settings.lr
    return settings.lr * 0.5 * (1 + math.cos(math.pi * round_index / settings.rounds))


def federated_training(
    client: VictimClient,
    settings: UtilitySettings,
    data_root: str | None = None,
    on_round: RoundCallback | None = None,
) -> UtilityMeasurement:
    """Train the victim's global model for ``settings.rounds`` rounds; return the utility record.

    ``on_round(r, text)`` is called after every round. The test split is that of the data set
    the victim describes.
    """
    started = time.perf_counter()
    described = client.describe()
    if is_text_victim(described):
        secure = any(d.name == "secagg" for d in described.defenses)
        return text_federated_training(
            client, settings, described, lambda r: learning_rate(settings, r),
            lambda p, b: aggregated_update(client, p, b) if secure else
            client.compute_update(p, b), on_round, data_root)
    model = server_model(described)
    params, buffers = client.global_model()
    test = load_dataset(described.data.dataset, "test", data_root)
    curve = [(0, _evaluate(model, params, buffers, test))]
    checkpoints = {round(settings.rounds * (i + 1) / settings.evaluations)
                   for i in range(settings.evaluations)}
    metadata: dict[str, str] = {}
    secagg = any(d.name == "secagg" for d in described.defenses)
    for r in range(settings.rounds):
        received = aggregated_update(client, params, buffers) if secagg else \
            client.compute_update(params, buffers)
        metadata = received.metadata
        eta = learning_rate(settings, r)
        if received.update_kind == "delta":
            params = {k: p + u for (k, p), u in zip(params.items(), received.update, strict=True)}
        else:
            params = {k: p - eta * u
                      for (k, p), u in zip(params.items(), received.update, strict=True)}
        text = f"round {r + 1}/{settings.rounds}"
        if r + 1 in checkpoints:
            curve.append((r + 1, _evaluate(model, params, buffers, test)))
            text += f", test accuracy {curve[-1][1]:.1%}"
        if on_round is not None:
            on_round(r, text)
    return UtilityMeasurement(
        test_accuracy=curve[-1][1],
        initial_accuracy=curve[0][1],
        curve=curve,
        rounds=settings.rounds,
        batch_size=settings.batch_size,
        lr=settings.lr,
        schedule=settings.schedule,
        protocol=described.protocol.kind,
        epsilon=float_or_none(metadata.get("epsilon_total")),
        delta=float_or_none(metadata.get("delta")),
        defenses=defense_specs(described),
        test_images=len(test),
        training_time_s=time.perf_counter() - started,
    )


def aggregated_update(client: VictimClient, params: dict[str, torch.Tensor],
                      buffers: dict[str, torch.Tensor]) -> ReceivedUpdate:
    """One secure-aggregation round among the victim's users: the mean of the survivors'
    updates (their unmasked sum over their number)."""
    aggregation = run_secagg(client, params, buffers)
    received = as_received_update(aggregation, list(params),
                                  [tuple(t.shape) for t in params.values()], "sum")
    survivors = max(len(received.user_ids), 1)
    received.update = [u / survivors for u in received.update]
    return received


def measure_utility(
    point: Point,
    checkpoint: str | None = None,
    on_round: RoundCallback | None = None,
    token: str | None = None,
) -> UtilityMeasurement:
    """Start the utility victim for ``point`` (or use ``point.victim``) and train against it."""
    settings = point.utility_settings
    if point.victim:
        with VictimClient(point.victim, token=token) as client:
            client.wait_ready(timeout=15)
            return federated_training(client, settings, point.data_root, on_round)
    with VictimProcess(utility_victim_settings(point, checkpoint)) as process, \
            VictimClient(process.address) as client:
        return federated_training(client, settings, point.data_root, on_round)


def _evaluate(model: torch.nn.Module, params: dict[str, torch.Tensor],
              buffers: dict[str, torch.Tensor], test: Any) -> float:
    model.load_state_dict({**params, **buffers}, strict=True)
    return accuracy(model, test)
