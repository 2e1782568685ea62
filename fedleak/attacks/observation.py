"""What the honest-but-curious server holds after one round: the threat model as a data type.

An attack sees only an :class:`Observation`: the global parameters it sent, the update it
received, the public protocol settings and data description, and a callable that replays the
user's local update (the same code the user ran; what else an attack may ask of it is the
:class:`~fedleak.attacks.replay_contract.Replay` protocol). Never the private images or labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fedleak.attacks.published import PublishedDefense
from fedleak.attacks.replay_contract import Replay, UpdateFn


@dataclass
class Observation:
    """One observed update and the public facts a server knows about it.

    ``update_kind`` is ``gradient`` (FedSGD: ∇_θ L) or ``delta`` (FedAvg: θ_{k+l} − θ_k, which
    points along −∇_θ L). ``mean``/``std`` are the per-channel normalisation, so the image box
    [0, 1] is [(0 − mean)/std, (1 − mean)/std] in the normalised space attacks work in. ``defenses``
    is the user's defense chain as the victim publishes it (names, public parameters, stages;
    empty when undefended), for attacks that model the defense. ``returned_buffers`` are the
    buffers (BatchNorm running statistics) the user's local training left, when it sends them
    with the update (a FedAvg client's ``state_dict``), by name; None when it does not.
    """

    parameter_names: list[str]
    parameters: list[torch.Tensor]
    update: list[torch.Tensor]
    update_kind: str
    num_images: int
    image_shape: tuple[int, int, int]
    num_classes: int
    mean: Sequence[float]
    std: Sequence[float]
    #: the user's local update replayed on candidate images: the harness's :class:`Replay`,
    #: or any plain ``simulate(images, labels) -> update`` (:data:`UpdateFn`)
    simulate: Replay | UpdateFn
    local_steps: int = 1
    learning_rate: float | None = None
    labels: torch.Tensor | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    #: earlier rounds a malicious server ran for this same reconstruction (probe rounds at
    #: other crafted parameters, oldest first); empty for an honest server
    probes: list[Observation] = field(default_factory=list)
    defenses: tuple[PublishedDefense, ...] = ()
    returned_buffers: dict[str, torch.Tensor] | None = None

    def image_bounds(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """Lower and upper bounds of valid images in normalised space, shaped [1, C, 1, 1]."""
        mean = torch.as_tensor(self.mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        std = torch.as_tensor(self.std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        return (0 - mean) / std, (1 - mean) / std

    def gradient_direction(self) -> list[torch.Tensor]:
        """Return the update oriented like a loss gradient (a FedAvg delta is negated)."""
        if self.update_kind == "delta":
            return [-u for u in self.update]
        return list(self.update)

    def index_of(self, name: str) -> int:
        """Return the index of the parameter ``name``.

        The same in ``parameter_names``, ``parameters`` and ``update``.

        Raises
        ------
        KeyError
            When the model has no parameter of that name.
        """
        try:
            return self.parameter_names.index(name)
        except ValueError:
            raise KeyError(f"no parameter {name!r} in the observation (it has "
                           f"{', '.join(self.parameter_names) or 'no names'})") from None

    def parameter(self, name: str) -> torch.Tensor:
        """Return the global parameter named ``name`` (θ as the server sent it)."""
        return self.parameters[self.index_of(name)]

    def gradient(self, name: str) -> torch.Tensor:
        """Return the update of the parameter ``name``, oriented like a loss gradient.

        Entry ``index_of(name)`` of :meth:`gradient_direction`.
        """
        update = self.update[self.index_of(name)]
        return -update if self.update_kind == "delta" else update

    def named_parameters(self) -> dict[str, torch.Tensor]:
        """Return the global parameters by name, in model order."""
        return dict(zip(self.parameter_names, self.parameters, strict=True))


@dataclass
class Reconstruction:
    """An attack's answer: images in normalised space, labels, and how it got there.

    An attack that recovers a layer's input rather than the image (analytic inversion of a
    CNN's classifier) returns ``images`` with zero rows, the recovered vectors ``[m, d]`` as
    ``features`` and the layer's module name as ``feature_layer``; ``warnings`` are messages
    a person must see (the harness prints them and writes them to metrics.json). ``padding``
    lists the image slots that hold a placeholder (the mean image where the attack recovered
    nothing), not a reconstruction: the victim never counts them as exact nor as the best
    image. ``truncated`` says, when set, that a safety time limit cut the attack before it
    spent its work budget (:mod:`~fedleak.attacks.safety_limit`): the harness then records the
    round as truncated, never as a measurement.
    """

    images: torch.Tensor
    labels: torch.Tensor
    objective: float
    iterations: int
    restart_objectives: list[float] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)
    features: torch.Tensor | None = None
    feature_layer: str = ""
    warnings: list[str] = field(default_factory=list)
    padding: list[int] = field(default_factory=list)
    #: why a safety time limit cut the attack short (None: it was not cut); a truncated result
    #: is not a measurement (:mod:`~fedleak.attacks.safety_limit`)
    truncated: str | None = None

    @property
    def has_images(self) -> bool:
        """Whether the attack recovered images (not only a layer's input)."""
        return self.images.shape[0] > 0
