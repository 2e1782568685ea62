"""Label recovery from the last linear layer of an observed update, usable by every attack.

Let the classifier end in a linear layer ``z = W h + b`` (``W`` of shape [K, d], K classes)
followed by softmax cross-entropy, and let the user average the loss over n images. With
``p_i = softmax(z_i)`` and one-hot ``e_{y_i}``,

    ∂L/∂b   = (1/n) Σ_i (p_i − e_{y_i})                       (a K-vector)
    ∂L/∂W_c = (1/n) Σ_i (p_ic − 1[y_i = c]) · h_iᵀ             (row c, a d-vector)

**One image (iDLG, Zhao et al. 2020).** ``p_ic − 1[y = c]`` is negative only for the true
class ``c = y`` (``p_iy − 1 < 0`` while ``p_ic > 0`` for every other class). So the true class
is the argmin of the bias gradient; without a bias, the features ``h`` after a sigmoid or ReLU
are non-negative, row ``c`` of ``∂L/∂W`` is ``(p_c − 1[y = c])·h`` and its sum has the sign of
``p_c − 1[y = c]``: the argmin of the row sums is the true class.

**n images (a counting estimate, after Wainakh et al.'s LLG "impact").** Write ``k_c`` for the
number of images of class c and assume the model predicts roughly the same probabilities
``s_c ≈ p_ic`` for every image (true for an untrained model, approximate otherwise). Then

    g_c := ∂L/∂b_c ≈ s_c − k_c / n.

Absent classes (``k_c = 0``) have ``g_c = s_c > 0``; a class with ``g_c < 0`` is certainly
present. Taking the mean ``s̄`` of the positive entries as the estimate of ``s_c`` for every
class gives ``k_c ≈ n (s̄ − g_c)``. Every class with ``g_c < 0`` gets at least one label, and the
remaining ``n − (#negative)`` labels go one at a time to the class with the largest remaining
estimate ``k_c − assigned_c`` (largest remainder), so exactly n labels come back, most
frequent first. Without a bias the same is done on the row sums of ``∂L/∂W``, which are
``g_c`` scaled by the (positive) feature sums — a rougher estimate. A FedAvg delta is turned
into a gradient direction first (:meth:`Observation.gradient_direction`); several local steps
make all of this approximate. This is the honest simple baseline; it is exact for n = 1 and
for n distinct classes whose probabilities are all below 1/n.

**n images, expected probabilities from dummy data (``method="dummy"``, the default with a
bias).** The server knows θ, so instead of assuming equal ``s_c`` it can measure the model's
mean prediction: it replays the user's update (``observation.simulate``, the same code the user
ran) on n dummy images drawn from U(0, 1) in pixel space, all labelled 0. Their bias gradient
is ``g̃_c = p̃_c − 1[c = 0]``, so ``p̃ = g̃ + e_0`` is the model's mean softmax on dummy data,
and ``k_c ≈ n (p̃_c − g_c)``. For an untrained network — BatchNorm in training mode normalises
every batch the same way — the mean prediction hardly depends on the input, and this estimate
is much sharper than the equal-``s`` one; for a trained network neither is reliable (the model
predicts the true classes confidently, so ``g_c ≈ 0`` for every class), and
``bench/label_accuracy.py`` measures by how much. For a FedAvg delta both gradients are divided
by ``τ · steps`` first (``τ Σ_s w_s`` under momentum, :func:`update_scale`; a first-order
approximation).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from fedleak.attacks.observation import Observation
from fedleak.attacks.replay_contract import OrderedReplay


class LabelRecoveryError(ValueError):
    """The update has no last linear layer to read labels from."""


def last_layer_gradients(
    observation: Observation,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gradient direction of the last linear layer: weight ``[K, d]`` and bias ``[K]`` or None.

    The weight is the last 2-D parameter whose first dimension is ``num_classes``; its bias is
    the parameter named like it with ``bias`` for ``weight``, else the next parameter when that
    is a K-vector.
    """
    grads = observation.gradient_direction()
    weight, bias = last_layer_indices(observation)
    return grads[weight], None if bias is None else grads[bias]


def last_layer_indices(observation: Observation) -> tuple[int, int | None]:
    """Return where the last linear layer's weight and bias sit in the update.

    The bias index is None when the layer has none (see :func:`last_layer_gradients`).

    Raises
    ------
    LabelRecoveryError
        When no 2-D parameter has one row per class.
    """
    update = observation.update
    k = observation.num_classes
    for index in range(len(update) - 1, -1, -1):
        if update[index].dim() == 2 and update[index].shape[0] == k:
            return index, _bias_of(observation, index, k)
    raise LabelRecoveryError(
        f"no 2-D parameter with {k} rows (one per class) in the update; cannot read labels"
    )


def _bias_of(observation: Observation, index: int, k: int) -> int | None:
    update = observation.update
    names = observation.parameter_names
    name = names[index] if index < len(names) else ""
    if name.endswith("weight"):
        bias_name = name[: -len("weight")] + "bias"
        if bias_name in names:
            bias = observation.index_of(bias_name)
            return bias if update[bias].shape == (k,) else None
        if names:
            return None
    if index + 1 < len(update) and update[index + 1].shape == (k,):
        return index + 1
    return None


def class_scores(observation: Observation) -> torch.Tensor:
    """Per-class score ``g_c`` whose sign says whether class c is present (negative: present).

    The bias gradient when the layer has a bias, else the row sums of the weight gradient.
    """
    weight, bias = last_layer_gradients(observation)
    scores = bias if bias is not None else weight.sum(dim=1)
    return scores.detach().double()


def idlg_label(observation: Observation) -> int:
    """Return the label of a single image (iDLG): argmin of the last layer's bias gradient.

    The row sums of the weight gradient stand in for a layer without a bias
    (:func:`class_scores`).
    """
    return int(torch.argmin(class_scores(observation)).item())


def count_labels(
    scores: torch.Tensor, n: int, expected: torch.Tensor | None = None
) -> torch.Tensor:
    """Count n labels from per-class scores ``g_c ≈ s_c − k_c/n`` (see the module docstring).

    ``expected`` is the model's mean prediction ``s_c`` per class when the caller measured it
    (dummy data); without it every ``s_c`` is taken as the mean ``s̄`` of the positive scores.
    Classes with negative scores come first (most negative first), then the remaining labels by
    largest remainder of the estimated counts ``k_c ≈ n (s_c − g_c)``. Returns int64 ``[n]``.
    """
    scores = scores.detach().double().cpu()
    order = torch.argsort(scores)
    present = [int(c) for c in order if scores[c] < 0][:n]
    if expected is not None:
        baseline = expected.detach().double().cpu()
    else:
        positive = scores[scores > 0]
        baseline = positive.mean() if positive.numel() else scores.new_zeros(())
    estimate = n * (baseline - scores)
    assigned = torch.zeros_like(scores)
    for c in present:
        assigned[c] += 1
    labels = list(present)
    while len(labels) < n:
        c = int(torch.argmax(estimate - assigned))
        assigned[c] += 1
        labels.append(c)
    return torch.tensor(labels, dtype=torch.long)


def update_scale(observation: Observation) -> float:
    """Return the update's first-order size: ``1`` for a gradient, ``τ Σ_s w_s`` for a delta.

    For a FedAvg delta that is τ · steps for plain SGD; momentum weighs early steps more
    (:meth:`OrderedReplay.step_weights
    <fedleak.attacks.replay_contract.OrderedReplay.step_weights>`, when the replay says).
    """
    if observation.update_kind != "delta":
        return 1.0
    rate = float(observation.learning_rate or 1.0)
    simulate = observation.simulate
    if isinstance(simulate, OrderedReplay):
        return rate * float(sum(simulate.step_weights(observation.num_images)))
    return rate * max(observation.local_steps, 1)


def dummy_probabilities(observation: Observation, seed: int = 0) -> torch.Tensor | None:
    """Measure the model's mean softmax ``p̃`` [K] on n U(0, 1) dummy images, by a replay.

    All dummy images are labelled 0, so ``p̃ = g̃ + e_0`` with ``g̃`` the replayed last-layer
    bias gradient. None when the last layer has no bias.
    """
    shape = (observation.num_images, *observation.image_shape)
    device = observation.update[0].device if observation.update else torch.device("cpu")
    low, high = observation.image_bounds(device)
    pixels = torch.rand(shape, generator=torch.Generator().manual_seed(seed)).to(device)
    dummy = low + pixels * (high - low)
    labels = torch.zeros(observation.num_images, dtype=torch.long, device=device)
    with torch.enable_grad():
        update = [u.detach() for u in observation.simulate(dummy, labels)]
    replayed = replace(observation, update=update)
    _, bias = last_layer_gradients(replayed)
    if bias is None:
        return None
    probabilities = bias.detach().double().cpu() / update_scale(observation)
    probabilities[0] += 1.0
    return probabilities


def recover_labels(observation: Observation, method: str = "dummy") -> torch.Tensor:
    """Return the n labels an attack should use, int64 ``[n]`` on the update's device.

    ``observation.labels`` when the threat model supplies them; iDLG for one image; the counting
    estimate of :func:`count_labels` for several, with the expected probabilities measured on
    dummy data (``method="dummy"``, when the last layer has a bias) or assumed equal
    (``method="uniform"``).
    """
    if method not in ("dummy", "uniform"):
        raise ValueError(f"label recovery method must be 'dummy' or 'uniform', got {method!r}")
    device = observation.update[0].device if observation.update else torch.device("cpu")
    n = observation.num_images
    if observation.labels is not None:
        labels = observation.labels.to(device=device, dtype=torch.long).reshape(-1)
        if labels.numel() != n:
            raise LabelRecoveryError(f"observation has {labels.numel()} labels for {n} images")
        return labels
    if n == 1:
        return torch.tensor([idlg_label(observation)], dtype=torch.long, device=device)
    expected = dummy_probabilities(observation) if method == "dummy" else None
    scores = class_scores(observation) / update_scale(observation)
    return count_labels(scores, n, expected).to(device)
