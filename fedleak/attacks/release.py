"""What an attacker holds when the user releases a trained model: the threat model as a data type.

In the update threat model (:class:`fedleak.attacks.observation.Observation`) the server sees one
round's update. Here the user instead trains a model to completion on its private set and
publishes it (Haim et al., NeurIPS 2022, "Reconstructing training data from trained neural
networks"). The attacker knows the architecture Φ(θ; ·), the trained parameters θ, the input
shape and the input scaling the model was trained on, and perhaps the training-set size n. It
never sees the images or their labels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

#: Input scaling of the paper (Sec. 5.2): images live in [-1, 1] and L_prior penalises the rest.
PAPER_VALUE_RANGE = (-1.0, 1.0)


@dataclass
class ReleasedModel:
    """A released binary classifier Φ(θ; x) and the public facts about its training.

    ``model`` is the architecture: ``model(x)`` for ``x`` of shape ``[n, *input_shape]`` gives
    Φ(θ; x) of shape ``[n]`` or ``[n, 1]`` (the sign is the predicted label y ∈ {±1}). Attacks
    evaluate it at ``parameters`` (in the order of ``parameter_names``, the names of
    ``model.named_parameters()``) through ``torch.func.functional_call``, so ``model``'s own
    parameter values do not matter and it is never modified. ``num_train`` is the training-set
    size n when the attacker knows it (else an attack's config decides how many candidates to
    look for). ``value_range`` is the box the training inputs were scaled to, e.g. (-1, 1).
    """

    model: nn.Module
    parameters: list[torch.Tensor]
    parameter_names: list[str]
    input_shape: tuple[int, ...]
    num_train: int | None = None
    value_range: tuple[float, float] = PAPER_VALUE_RANGE
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Check names and shapes against the model, and the ranges; raise ``ValueError``."""
        if len(self.parameters) != len(self.parameter_names):
            raise ValueError(
                f"{len(self.parameters)} parameters but {len(self.parameter_names)} names"
            )
        expected = [name for name, _ in self.model.named_parameters()]
        if list(self.parameter_names) != expected:
            raise ValueError(
                f"parameter names {list(self.parameter_names)} do not match the model's {expected}"
            )
        for name, value, (_, own) in zip(
            self.parameter_names, self.parameters, self.model.named_parameters(), strict=True
        ):
            if tuple(value.shape) != tuple(own.shape):
                raise ValueError(
                    f"parameter {name} has shape {tuple(value.shape)}, "
                    f"the model expects {tuple(own.shape)}"
                )
        low, high = self.value_range
        if not low < high:
            raise ValueError(f"value_range must be (low, high), low < high; got {self.value_range}")
        if self.num_train is not None and self.num_train < 1:
            raise ValueError(f"num_train must be >= 1 when known, got {self.num_train}")

    @classmethod
    def from_module(
        cls,
        model: nn.Module,
        input_shape: tuple[int, ...],
        *,
        num_train: int | None = None,
        value_range: tuple[float, float] = PAPER_VALUE_RANGE,
        metadata: dict[str, Any] | None = None,
    ) -> ReleasedModel:
        """Release ``model`` as it is: its parameters are detached and copied."""
        named = list(model.named_parameters())
        return cls(
            model=model,
            parameters=[p.detach().clone() for _, p in named],
            parameter_names=[name for name, _ in named],
            input_shape=tuple(input_shape),
            num_train=num_train,
            value_range=(float(value_range[0]), float(value_range[1])),
            metadata=dict(metadata or {}),
        )

    def parameter_dict(self) -> dict[str, torch.Tensor]:
        """``{name: θ_name}`` as ``functional_call`` takes it."""
        return dict(zip(self.parameter_names, self.parameters, strict=True))
