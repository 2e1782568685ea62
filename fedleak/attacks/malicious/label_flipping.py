"""Dishonest-server parameter manipulation: label flipping (Inverting Gradients supplement A.2).

A trained model is confident on its training distribution, so the user's gradient is small and
carries little signal. A dishonest server permutes two rows a, b of the classifier's weight and
bias before sending θ. The user, unaware, differentiates the loss of

    logits'_k = logits_{π(k)},   π = (a b),

so its label y is scored by the row of the other class: the model is confidently *wrong* for
y ∈ {a, b} and the gradient grows. The attack accounts for the permutation by reconstructing
against the parameters actually sent (the flipped θ'), with labels in the user's own index
space — iDLG on the flipped gradient still finds y, because the gradient row with the negative
sign is the row of the user's label in the model it trained.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def classifier_names(
    parameters: Mapping[str, torch.Tensor], num_classes: int
) -> tuple[str, str | None]:
    """Names of the last 2-D parameter with ``num_classes`` rows and of its bias, if any."""
    names = list(parameters)
    for i in range(len(names) - 1, -1, -1):
        tensor = parameters[names[i]]
        if tensor.dim() == 2 and tensor.shape[0] == num_classes:
            bias = names[i + 1] if i + 1 < len(names) else None
            if bias is not None and parameters[bias].shape != (num_classes,):
                bias = None
            return names[i], bias
    raise ValueError(f"no classifier layer with {num_classes} output rows among the parameters")


def flip_labels(
    parameters: Mapping[str, torch.Tensor], num_classes: int, a: int, b: int
) -> dict[str, torch.Tensor]:
    """Return a copy of ``parameters`` with classifier rows ``a`` and ``b`` swapped.

    Both the weight's rows and the bias's entries are swapped.

    Raises
    ------
    ValueError
        When ``a`` and ``b`` are not two different classes, or there is no classifier layer.
    """
    if not (0 <= a < num_classes and 0 <= b < num_classes) or a == b:
        raise ValueError(f"flip two different classes in [0, {num_classes}), got {a} and {b}")
    weight, bias = classifier_names(parameters, num_classes)
    flipped = {name: tensor.clone() for name, tensor in parameters.items()}
    for name in filter(None, (weight, bias)):
        flipped[name][[a, b]] = parameters[name][[b, a]]
    return flipped
