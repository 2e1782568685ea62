"""Scoring recovered layer inputs ("features") against the true ones, inside the victim.

An attack that inverts a CNN's classifier recovers the classifier's input h, not the image.
Only the victim knows the private batch, so it recomputes the true inputs h*_k of the named
linear layer for the round's images at the round's parameters, in training mode as the local
update ran (BatchNorm with batch statistics), and compares: each submitted vector is matched
one-to-one to a private image (Hungarian assignment maximising the summed cosine similarity;
min(m, n) pairs when m vectors are submitted for n images), and every pair is scored by

    cosine(h, h*) = ⟨h, h*⟩ / (‖h‖ ‖h*‖),    relative error = ‖h − h*‖ / ‖h*‖.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from fedleak.harness.wire.request_errors import quoted


class FeatureScoringError(ValueError):
    """A layer name or feature tensor that cannot be scored; the message says what to change."""


@dataclass
class FeatureScore:
    """Private image ``index`` against submitted vector ``matched_index``."""

    index: int
    matched_index: int
    cosine: float
    relative_error: float


@dataclass
class FeatureBatchScore:
    """Matched pairs and their means."""

    features: list[FeatureScore]
    mean_cosine: float
    mean_relative_error: float


def linear_layer(model: nn.Module, name: str) -> nn.Linear:
    """The ``nn.Linear`` module called ``name`` in ``model``, or a clear error."""
    modules = dict(model.named_modules())
    linears = [n for n, m in modules.items() if isinstance(m, nn.Linear)]
    if name not in modules or not isinstance(modules[name], nn.Linear):
        raise FeatureScoringError(f"feature_layer {quoted(name)} is not a linear layer of this "
                                  f"model; choose one of {', '.join(linears) or 'none'}")
    return modules[name]


def layer_inputs(
    model: nn.Module,
    parameters: dict[str, torch.Tensor],
    buffers: dict[str, torch.Tensor],
    images: torch.Tensor,
    name: str,
) -> torch.Tensor:
    """Inputs ``[n, d]`` of linear layer ``name`` for normalised ``images`` at ``parameters``.

    Training mode, as the user's local update runs; buffers are cloned so BatchNorm's running
    statistics of the caller stay untouched.
    """
    layer = linear_layer(model, name)
    captured: list[torch.Tensor] = []
    handle = layer.register_forward_hook(lambda _m, inputs, _o: captured.append(inputs[0]))
    try:
        model.train()
        state = {**parameters, **{k: v.clone() for k, v in buffers.items()}}
        with torch.no_grad():
            functional_call(model, state, (images,))
    finally:
        handle.remove()
    return captured[0].detach().flatten(1)


def check_features(submitted: torch.Tensor, width: int) -> None:
    """Refuse anything but a finite, non-empty ``[m, width]`` float tensor."""
    if submitted.dim() != 2 or submitted.shape[1] != width:
        raise FeatureScoringError(f"features have shape {list(submitted.shape)}; the layer's "
                                  f"input is [m, {width}] (m vectors of its width)")
    if submitted.shape[0] < 1:
        raise FeatureScoringError("features hold no vector: submit at least one row")
    if not submitted.is_floating_point():
        raise FeatureScoringError(f"features have dtype {submitted.dtype}; send floats")
    if not torch.isfinite(submitted).all():
        raise FeatureScoringError("features contain NaN or infinite values")


def score_features(submitted: torch.Tensor, truth: torch.Tensor) -> FeatureBatchScore:
    """Match ``submitted`` [m, d] to ``truth`` [n, d] one-to-one by cosine and score the pairs."""
    from scipy.optimize import linear_sum_assignment

    check_features(submitted, truth.shape[1])
    h, h_true = submitted.double(), truth.double()
    cosine = (h_true @ h.T) / (h_true.norm(dim=1)[:, None] * h.norm(dim=1)[None, :]).clamp_min(
        1e-30)
    rows, columns = linear_sum_assignment(-cosine.cpu().numpy())
    scores = []
    for i, j in zip(rows.tolist(), columns.tolist(), strict=True):
        error = (h[j] - h_true[i]).norm() / h_true[i].norm().clamp_min(1e-30)
        scores.append(FeatureScore(i, j, float(cosine[i, j]), float(error)))
    return FeatureBatchScore(
        scores,
        sum(s.cosine for s in scores) / len(scores),
        sum(s.relative_error for s in scores) / len(scores),
    )
