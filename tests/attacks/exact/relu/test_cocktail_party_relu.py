"""Cocktail-party's ReLU refinement on selections nobody picked: the orthonormal search, starts
from one-image replays, the next layer's form as a certificate, the projection of certified
inputs onto their exact ReLU patterns, and a budget counted in work (the time limit only a
safety cap that marks a cut run ``truncated``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedleak.attacks import create_attack
from fedleak.attacks.exact.analytic import biased_linear_layers
from fedleak.attacks.exact.fc_layer import gradient_of, layer_parameters
from fedleak.attacks.exact.relu.pattern_projection import project_certified
from fedleak.attacks.exact.relu.replay_starts import next_layer_head, replayed_delta
from fedleak.attacks.exact.relu.sparsity import FORM_TOLERANCE, factorise, form_residual
from fedleak.harness.zoo.datasets import normalize
from tests.attacks.exact.cocktail_party.test_cocktail_party import FACES, scored, summed_round

pytestmark = pytest.mark.usefixtures("one_torch_thread")
MLP = "mlp:width=512,depth=1"


def layer_and_deltas(users: int, per_user: int, start: int, spec: str = MLP):  # noqa: ANN201
    """The round, its first layer, ``G``, ``g``, the inputs and every input's own output
    gradient ``δ_j`` (a one-image replay: the direction of input j's column)."""
    observation, images, labels = summed_round(FACES, spec, users, per_user, start=start)
    layer = biased_linear_layers(observation)[0]
    weight_grad, bias_grad = (t.numpy() for t in gradient_of(observation, layer))
    inputs = normalize(images, FACES.info).double().flatten(1).numpy()
    deltas = np.stack([replayed_delta(observation, layer, normalize(images[j:j + 1],
                                                                    FACES.info).float(),
                                      int(labels[j])) for j in range(images.shape[0])], 1)
    return observation, layer, weight_grad, bias_grad, inputs, deltas, images, labels


def test_a_held_out_sum_of_non_faces_comes_back_exactly() -> None:
    """Faces 72–103 (28 background patches, many near-duplicates) as a 2 × 16 sum: every
    image exact (before the replayed starts, the orthonormal search, the next layer's form and
    the consolidation: 0 exact, 11 at ≥ 20 dB)."""
    observation, images, labels = summed_round(FACES, MLP, 2, 16, start=72)
    result = create_attack("cocktail-party", {}).reconstruct(observation, seed=0)
    assert result.extras["solved_exactly"] and result.extras["next_layer_form"]
    assert scored(result, images, labels, FACES.info).exact == 32
    assert result.truncated is None


def test_the_next_layers_form_holds_for_inputs_and_fails_for_their_mixtures() -> None:
    observation, layer, weight_grad, bias_grad, _, deltas, _, _ = layer_and_deltas(1, 4, 96)
    head = next_layer_head(observation, layer)
    assert head is not None and head.shape == (2, 512)
    grad = factorise(weight_grad, bias_grad, 4, left_power=0.0)
    directions = np.linalg.pinv(grad.left) @ deltas
    for j in range(4):
        q = directions[:, j]
        assert form_residual(grad, q, grad.zero_set(q), head) < FORM_TOLERANCE
    for i, j in ((0, 1), (1, 2), (0, 3)):
        mixture = directions[:, i] / np.linalg.norm(directions[:, i]) \
            + 0.6 * directions[:, j] / np.linalg.norm(directions[:, j])
        assert form_residual(grad, mixture, grad.zero_set(mixture), head) > 10 * FORM_TOLERANCE


def test_a_wide_next_layer_is_no_head() -> None:
    """After a 512-unit hidden layer comes another 512-unit one: its columns span every active
    pattern, so the form certifies nothing and no head is used."""
    observation, _, _ = summed_round(FACES, "mlp:width=64,depth=2", 1, 2)
    assert next_layer_head(observation, biased_linear_layers(observation)[0]) is None
    shallow, _, _ = summed_round(FACES, "mlp:width=64,depth=1", 1, 2)
    assert next_layer_head(shallow, biased_linear_layers(shallow)[0]) is not None


def test_projection_onto_a_certificate_never_moves_away_from_the_input() -> None:
    """Projection onto a convex set that holds the input (its exact ReLU pattern, the other
    certified directions' orthogonality, the box) brings every noisy estimate closer."""
    observation, layer, weight_grad, bias_grad, inputs, deltas, _, _ = layer_and_deltas(1, 8, 80)
    grad = factorise(weight_grad, bias_grad, 8, left_power=0.0)
    directions = np.linalg.pinv(grad.left) @ deltas
    weight, bias = (t.numpy() for t in layer_parameters(observation, layer))
    low, high = (float(t.view(-1)[0]) for t in observation.image_bounds())
    box = (np.full(inputs.shape[1], low), np.full(inputs.shape[1], high))
    known = directions[:, :5]
    rng = np.random.default_rng(0)
    others = inputs[5:]                     # the uncertified inputs: the estimate's error
    noisy = inputs[:5] + rng.normal(size=(5, 3)) @ others * 0.3
    projected = project_certified(grad, known, noisy, (weight, bias), box)
    before = np.linalg.norm(noisy - inputs[:5], axis=1)
    after = np.linalg.norm(projected - inputs[:5], axis=1)
    assert np.all(after <= before * (1 + 1e-6))
    assert after.sum() < 0.9 * before.sum()
    for i in range(5):
        zeros = grad.zero_set(known[:, i]) & grad.live
        assert np.all(weight[zeros] @ projected[i] + bias[zeros] <= 1e-6)


def test_the_budget_is_work_and_a_safety_cut_is_marked_truncated() -> None:
    observation, _, _ = summed_round(FACES, MLP, 2, 16, start=96)
    options = {"rounds": 1, "patience": 0}
    first = create_attack("cocktail-party", options).reconstruct(observation, seed=3)
    again = create_attack("cocktail-party", options).reconstruct(observation, seed=3)
    assert first.extras["rounds"] == 1 and first.truncated is None
    assert torch.allclose(first.images, again.images, atol=1e-4)
    cut = create_attack("cocktail-party", {"time_limit": 1e-9}).reconstruct(observation, seed=3)
    assert cut.truncated is not None and "safety limit" in cut.truncated
    assert cut.extras["rounds"] == 0 and any("safety limit" in w for w in cut.warnings)
    with pytest.raises(ValueError, match="time-limit"):
        create_attack("cocktail-party", {"time_limit": 0})
