"""What a one-image replay tells the ReLU refinement of the Cocktail Party Attack.

An extension beyond the paper; the attack is
:mod:`~fedleak.attacks.exact.cocktail_party.cpa`, the maths of directions
:mod:`~fedleak.attacks.exact.relu.sparsity`. A replay gives a start for each estimate's
direction, and the form every input's output gradient has when the layer's ReLU feeds a narrow
linear layer.

**Replayed starts.** Input j's direction ``q_j`` is ``L⁺ δ_j``, with ``δ_j = ∂L/∂z`` the layer's
output gradient for that input alone. For an estimate ``x̂_j`` the user's own update replayed
on that one image gives ``δ(x̂_j, y)`` — the bias gradient of the layer, exact for one input —
and ``L⁺ δ(x̂_j, y)`` is a start whose error depends on ``x̂_j``'s error only. The estimated
mixing column (``A = G X̂⁺``, the other start) passes every estimate's error through ``X̂⁺``,
whose norm is the inverse of the batch's smallest singular value: near-duplicate images make
it large. Measured on faces 32–95 (4 × 16 sum, MLP 512): the ICA estimate of a non-face at
40 dB gave a mixing start at cosine 0.29 from its direction, which failed to refine; its
replayed start succeeded. The label is not known: every label the counting estimate
(:func:`~fedleak.attacks.labels.recover_labels`) names is replayed and the one whose ``δ`` lies
nearest ``col(L)`` (where every true ``δ_j`` lies) is kept.

**The next layer's form.** When the ReLU feeds a linear layer ``z₂ = W₂ relu(z) + b₂`` whose
width C is small against the layer's, ``δ_j = m_j ⊙ W₂ᵀ e_j`` lies, on input j's active units,
in the span of W₂'s C columns (:func:`~fedleak.attacks.exact.relu.sparsity.form_residual`) — the
certificate that rejects mixtures of near-duplicate inputs. :func:`next_layer_head` finds W₂
and checks the form on a probe replay (anything between the ReLU and W₂ other than an
elementwise mask — a normalisation, a second nonlinearity — breaks it, and then no head is
used).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedleak.attacks.exact.analytic import LinearLayer, biased_linear_layers
from fedleak.attacks.exact.relu.sparsity import FactoredGradient
from fedleak.attacks.labels import recover_labels
from fedleak.attacks.observation import Observation

#: a head is used when it has at most this fraction of the layer's units as rows (a wider one
#: spans every active pattern and certifies nothing)
NARROW = 0.25
#: the probe replay's largest residual off the head's columns for the form to count as held
PROBE_TOLERANCE = 1e-4
#: at most this many labels are replayed per estimate (the counting estimate's, most frequent
#: first)
MAX_LABELS = 10


def probe_image(observation: Observation, seed: int) -> torch.Tensor:
    """Draw a uniform random image in the box, ``[1, C, H, W]`` (a probe, never private)."""
    device = observation.parameters[0].device
    low, high = observation.image_bounds(device)
    generator = torch.Generator().manual_seed(seed)
    return low + torch.rand((1, *observation.image_shape), generator=generator).to(device) \
        * (high - low)


def replayed_delta(observation: Observation, layer: LinearLayer, image: torch.Tensor,
                   label: int) -> np.ndarray:
    """Return ``δ = ∂L/∂z`` of the layer for one image, float64.

    It is the layer's bias gradient in a one-image replay (a FedAvg delta of one step is −τ
    times it, which no direction minds).
    """
    labels = torch.tensor([label], dtype=torch.long, device=image.device)
    with torch.enable_grad():
        update = observation.simulate(image, labels)
    delta: np.ndarray = update[layer.bias_index].detach().double().cpu().numpy()
    return delta


def next_layer_head(observation: Observation, layer: LinearLayer) -> np.ndarray | None:
    """Return the weight [C, m] of the narrow linear layer the ReLU feeds, if it has the form.

    The form ``δ = m ⊙ W₂ᵀ e`` (module docstring), checked on two probe replays; None when there
    is no such layer, it is not narrow, or a probe breaks the form.
    """
    layers = biased_linear_layers(observation)
    m = observation.update[layer.weight_index].shape[0]
    following = [other for other in layers if other.weight_index > layer.weight_index
                 and observation.update[other.weight_index].shape[1] == m]
    if not following:
        return None
    head_index = following[0].weight_index
    head = observation.parameters[head_index].detach().double().cpu().numpy()
    if head.shape[0] > NARROW * m:
        return None
    weight = observation.parameters[layer.weight_index].detach().double().cpu().numpy()
    bias = observation.parameters[layer.bias_index].detach().double().cpu().numpy()
    for seed in (0, 1):
        image = probe_image(observation, seed)
        delta = replayed_delta(observation, layer, image, seed % observation.num_classes)
        active = weight @ image.detach().double().cpu().numpy().reshape(-1) + bias > 0 \
            if weight.shape[1] == image.numel() else np.abs(delta) > 0
        if not active.any() or np.any(delta[~active] != 0):
            return None
        basis = head.T[active]
        fitted = basis @ np.linalg.lstsq(basis, delta[active], rcond=None)[0]
        scale = max(float(np.linalg.norm(delta[active])), 1e-300)
        if float(np.linalg.norm(delta[active] - fitted)) > PROBE_TOLERANCE * scale:
            return None
    return head


@dataclass
class ReplayStarts:
    """Starts from one-image replays at the estimates (module docstring).

    For a layer over the flattened image.
    """

    observation: Observation
    layer: LinearLayer
    labels: list[int]

    @classmethod
    def of(cls, observation: Observation, layer: LinearLayer) -> ReplayStarts:
        """Build the starts, with the labels to try.

        The labels are the counting estimate's, most frequent first (at most ``MAX_LABELS``).
        """
        counts = torch.bincount(recover_labels(observation).cpu(),
                                minlength=observation.num_classes)
        order = torch.argsort(counts, descending=True, stable=True)
        labels = [int(c) for c in order if counts[c] > 0][:MAX_LABELS]
        return cls(observation, layer, labels or [0])

    def start(self, grad: FactoredGradient, left_pinv: np.ndarray,
              estimate: np.ndarray) -> np.ndarray:
        """Return the start ``L⁺ δ(x̂, y)`` (``left_pinv`` = ``L⁺``) for the estimate ``x̂``.

        ``y`` is the label whose ``δ`` lies nearest ``col(L)`` (relative residual).
        """
        device = self.observation.parameters[0].device
        image = torch.from_numpy(estimate).float().view(1, *self.observation.image_shape)
        image = image.to(device)
        best, best_residual = np.zeros(grad.rank), np.inf
        for label in self.labels:
            delta = replayed_delta(self.observation, self.layer, image, label)
            q = left_pinv @ delta
            residual = float(np.linalg.norm(delta - grad.left @ q)) / \
                max(float(np.linalg.norm(delta)), 1e-300)
            if residual < best_residual:
                best, best_residual = q, residual
        return best
