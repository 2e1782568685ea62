"""The shuffled FedAvg attack: the user's visiting order a variable of the replay.

The replay visiting the user's true order is the user's update; momentum's step weights
make the batches' label make-up readable from the output bias (the exchange search finds the
true make-up from the truth's residual, and from random candidates'); plain SGD's equal weights
do not (no exchange, the round stays a lower bound); the attack runs the iterations asked,
revisions included, and says the order was modelled.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fedleak.attacks import create_attack
from fedleak.attacks.labels import last_layer_indices
from fedleak.attacks.optimisation.fedavg.batch_order import exchange, stratified_order
from fedleak.attacks.optimisation.fedavg.shuffled import identifiable
from fedleak.harness.federated.local_update import draw_order, local_update
from fedleak.harness.federated.observe import observe
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.federated.replay_fidelity import INEXACT, MODELLED, replay_status
from fedleak.harness.zoo.datasets import load_dataset, normalize
from fedleak.harness.zoo.models import build_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
MLP = "mlp:width=32,depth=1"


def shuffled_user(momentum: float, n: int = 16, batch: int = 4, epochs: int = 1
                  ) -> tuple[object, torch.Tensor, torch.Tensor, torch.Tensor, Protocol]:
    data = load_dataset("digits", "train")
    torch.manual_seed(0)
    model = build_model(MLP, data.info.shape, data.info.num_classes)
    protocol = Protocol("fedavg", epochs, batch, 0.1, momentum=momentum, shuffle=True)
    images, labels = data.images[:n], data.labels[:n]
    observation = observe(model, images, labels, data.info, protocol,
                          generator=torch.Generator().manual_seed(1))
    order = draw_order(protocol, n, torch.Generator().manual_seed(1))
    assert order is not None
    return observation, images, labels, order, protocol


def make_up(order: torch.Tensor, labels: torch.Tensor, batches: list[slice]) -> list[list[int]]:
    n = labels.numel()
    return [sorted(labels[order[0, b] % n].tolist()) for b in batches]


def test_step_weights_are_torch_sgds() -> None:
    assert Protocol("fedavg", 1, 1, 0.1).step_weights(2) == [1.0, 1.0]
    assert Protocol("fedavg", 1, 1, 0.1, momentum=0.9).step_weights(2) == \
        pytest.approx([1.9, 1.0])
    assert Protocol("fedavg", 1, 1, 0.1, momentum=0.9, nesterov=True).step_weights(2) == \
        pytest.approx([1 + 0.9 * 1.9, 1.9])


def test_the_replay_visiting_the_true_order_is_the_users_update() -> None:
    observation, images, labels, order, protocol = shuffled_user(0.9)
    x = normalize(images, load_dataset("digits", "train").info)
    replayed = observation.simulate.visiting(order)(x, labels)  # type: ignore[union-attr]
    # float32 sums over the same steps in the same order: equal to rounding
    for u, v in zip(replayed, observation.update, strict=True):
        assert torch.allclose(u.detach(), v, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(("n", "batch"), [(16, 4), (64, 32)], ids=["4x4", "2x32"])
def test_momentum_lets_the_output_bias_find_the_batches_label_make_up(n: int, batch: int
                                                                     ) -> None:
    """At candidates near the user's images (here: its images, as the later revisions come
    closer to) two revisions find the batches' make-up; random candidates' softmax can differ
    too much from the user's for that (why the attack revises again as it converges)."""
    observation, images, labels, order, _ = shuffled_user(0.9, n, batch)
    replay = observation.simulate
    batches = replay.epoch_batches(n)  # type: ignore[union-attr]
    start = stratified_order(labels, batches, 1, 1)
    counts = [torch.bincount(labels[start[0, b]], minlength=10) for b in batches]
    assert max(int(c.max()) for c in counts) <= -(-int(torch.bincount(labels).max())
                                                 // len(batches))  # spread evenly
    x = normalize(images, load_dataset("digits", "train").info)
    _, bias = last_layer_indices(observation)  # type: ignore[arg-type]
    assert bias is not None
    found = start
    for _ in range(2):  # the attack revises several times: each pass re-linearises
        with torch.enable_grad():
            update = replay.visiting(found.clone())(x, labels)  # type: ignore[union-attr]
        residual = (observation.update[bias]  # type: ignore[attr-defined]
                    - update[bias].detach()) / 0.1
        found, _ = exchange(found, labels, residual,
                            replay.step_weights(n), batches, 10)  # type: ignore[union-attr]
    assert make_up(found, labels, batches) == make_up(order, labels, batches)
    assert make_up(start, labels, batches) != make_up(order, labels, batches)


def test_plain_sgd_cannot_tell_the_batches_apart_and_stays_a_lower_bound() -> None:
    observation, _, labels, _, protocol = shuffled_user(0.0)
    replay = observation.simulate
    assert not identifiable(observation, replay)  # type: ignore[arg-type]
    batches = replay.epoch_batches(16)  # type: ignore[union-attr]
    start = stratified_order(labels, batches, 1, 1)
    _, moves = exchange(start, labels, torch.randn(10), replay.step_weights(16),  # type: ignore[union-attr]
                        batches, 10)
    assert moves == 0
    result = create_attack("fedavg-shuffled", {"iterations": 3}).reconstruct(
        observation, seed=0)  # type: ignore[arg-type]
    assert result.extras["order_model"] == "guessed"
    assert replay_status(protocol, 16, extras=result.extras)[0] == INEXACT


def test_the_attack_models_the_order_within_the_iterations_asked() -> None:
    observation, _, _, _, protocol = shuffled_user(0.9, epochs=2)
    result = create_attack("fedavg-shuffled", {"iterations": 16, "revisions": 4}).reconstruct(
        observation, seed=0)  # type: ignore[arg-type]
    # at most one revision per 8 iterations: 2 revisions, 4 replays, 12 optimiser steps
    assert result.iterations == 16 and result.extras["objective_evaluations"] == 16
    assert result.extras["order_revisions"] == 2
    few = create_attack("fedavg-shuffled", {"iterations": 5}).reconstruct(
        observation, seed=0)  # type: ignore[arg-type]
    assert few.extras["order_model"] == "guessed" and few.extras["objective_evaluations"] == 5
    assert result.extras["order_model"] == "modelled" and result.extras["epoch_copies"] == 2
    assert result.images.shape == (16, 1, 8, 8)
    status, notes = replay_status(protocol, 16, extras=result.extras)
    assert status == MODELLED and notes[0].startswith("order unknown, modelled")
    # an in-order user needs no model: the attack is fedavg's
    plain = dataclasses.replace(observation)
    plain.simulate = observation.simulate.at(  # type: ignore[union-attr]
        dict(zip(observation.parameter_names, observation.parameters, strict=True)))
    plain.simulate.protocol = dataclasses.replace(protocol, shuffle=False)  # type: ignore[union-attr]
    unordered = create_attack("fedavg-shuffled", {"iterations": 3}).reconstruct(plain, seed=0)
    assert "order_model" not in unordered.extras


def test_local_update_with_the_replays_order_is_the_users() -> None:
    """The victim's own draw and the replay's visiting order meet in local_update."""
    observation, images, labels, order, protocol = shuffled_user(0.9)
    data = load_dataset("digits", "train")
    model = observation.simulate.model  # type: ignore[union-attr]
    params = dict(zip(observation.parameter_names, observation.parameters, strict=True))
    direct = local_update(model, params, {}, normalize(images, data.info), labels, protocol,
                          order=order)
    for u, v in zip(direct, observation.update, strict=True):
        assert torch.allclose(u, v, atol=1e-6, rtol=1e-5)
