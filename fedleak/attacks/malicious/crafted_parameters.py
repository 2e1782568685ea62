"""The malicious server: an attack that chooses the parameters θ it sends before each round.

An honest-but-curious server sends the real global model and inverts what comes back. A
malicious one (Fowl et al. 2022, Boenisch et al. 2023, Wen et al. 2022) controls θ: it *crafts*
parameter values that make the user's update give its data away, sends them over the same wire
(``ComputeUpdate`` or a secure-aggregation round), and may run several *probe* rounds before it
reconstructs. What it knows before the first round is a :class:`ServerKnowledge`: the
architecture the user runs (public, or designed by the server itself), the honest global θ,
public data of the same kind as the user's, and the public protocol facts.

A :class:`MaliciousAttack` adds two steps to :class:`~fedleak.attacks.base.Attack`:

- :meth:`MaliciousAttack.check` refuses, before any round is spent, a set-up that cannot carry
  the attack (no imprint block, no linear layer to trap, a protocol the attack cannot read),
  with the reason and what to change;
- :meth:`MaliciousAttack.craft` returns θ for the next round given the probe rounds so far, or
  ``None`` when it has what it needs; the harness then hands the last round to
  :meth:`~fedleak.attacks.base.Attack.reconstruct` with the earlier ones in
  :attr:`~fedleak.attacks.observation.Observation.probes`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from fedleak.attacks.base import Attack
from fedleak.attacks.observation import Observation


class AttackRefused(ValueError):
    """The victim's set-up cannot carry this malicious attack.

    The message says why and what to change. Raised before any round is spent.
    """


@dataclass
class ServerKnowledge:
    """What a malicious server knows before it crafts the first θ.

    ``public_images`` are in the model's normalised space, drawn from data the server holds
    (``public_source`` says which: e.g. the bundled data set's other split), never the user's.
    ``images_per_user`` is n, the images behind each user's update; ``users`` how many updates
    are summed (secure aggregation) — the aggregate holds ``users · n`` images.
    ``same_data_each_round`` says whether every round trains on the same private images (a user
    with a fixed local data set): multi-round attacks need it.
    """

    model: nn.Module
    parameters: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    public_images: torch.Tensor
    public_source: str
    image_shape: tuple[int, int, int]
    num_classes: int
    update_kind: str
    images_per_user: int
    users: int = 1
    same_data_each_round: bool = True

    @property
    def images_in_aggregate(self) -> int:
        """How many private images one observed update mixes."""
        return self.images_per_user * self.users


class MaliciousAttack(Attack[Observation]):
    """An attack whose server crafts θ (see the module docstring)."""

    server_role: ClassVar[str] = "malicious-parameters"

    @abstractmethod
    def check(self, knowledge: ServerKnowledge) -> None:
        """Raise :class:`AttackRefused` when the set-up cannot carry this attack."""

    @abstractmethod
    def craft(
        self, knowledge: ServerKnowledge, probes: Sequence[Observation], seed: int
    ) -> dict[str, torch.Tensor] | None:
        """Return θ to send in the next round (every parameter, by name), or None when done.

        ``probes`` are the rounds already received for this reconstruction, oldest first.
        """


def layer_inputs(
    model: nn.Module,
    parameters: Mapping[str, torch.Tensor],
    buffers: Mapping[str, torch.Tensor],
    images: torch.Tensor,
    layer: str,
    batch: int = 256,
) -> torch.Tensor:
    """Return the inputs ``[N, d]`` that module ``layer`` receives for ``images``.

    At ``parameters``, in evaluation mode (public statistics, no batch coupling), without a
    graph, in batches of ``batch`` images.
    """
    from torch.func import functional_call

    module = dict(model.named_modules())[layer]
    seen: list[torch.Tensor] = []

    def keep(_: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        seen.append(args[0].detach().flatten(1))

    handle = module.register_forward_pre_hook(keep)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, images.shape[0], batch):
                functional_call(model, {**parameters, **buffers}, (images[start:start + batch],))
    finally:
        handle.remove()
        model.train(was_training)
    return torch.cat(seen)


CUT_METHODS = ("gaussian", "quantiles")


def cut_offs(values: torch.Tensor, levels: torch.Tensor, method: str = "gaussian") -> torch.Tensor:
    """Where a measurement's distribution reaches probability ``levels`` (float64).

    ``values`` [N] or [N, m] are public measurements (columns measured separately); ``levels``
    [L] in (0, 1). ``gaussian``: the quantiles μ + σ Φ⁻¹(level) of a normal fitted to each
    column (smooth with few public samples; a random projection of many pixels is close to
    normal); ``quantiles``: the empirical ones. Result [L] or [L, m].
    """
    values, levels = values.double(), levels.double()
    if method == "quantiles":
        return torch.quantile(values, levels, dim=0)
    if method != "gaussian":
        raise ValueError(f"cut-off method must be one of {CUT_METHODS}, got {method!r}")
    mean, std = values.mean(0), values.std(0).clamp_min(1e-12)
    z: torch.Tensor = torch.distributions.Normal(0.0, 1.0).icdf(levels)  # type: ignore[no-untyped-call]
    return mean + std * (z[:, None] if values.dim() > 1 else z)
