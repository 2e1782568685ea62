"""Inverting a FedAvg parameter delta (Geiping et al. 2020, Sec. 6 and supplement eq. 2).

In federated averaging the user takes l = E·⌈n/B⌉ local SGD steps at learning rate τ over its n
images (E epochs, mini-batches of B, in order) and sends the parameter delta

    Δ* = θ_{k+l} − θ_k = −τ Σ_{m=1}^{l} ∇_θ L_{θ_{k+m−1}}(x_{b(m)}, y_{b(m)})      (supp. eq. 1)

The attack applies eq. (4) to the delta itself (supplement eq. 2):

    x̂ = argmin_{x ∈ [0,1]^n}  1 − ⟨Δ(x, ŷ), Δ*⟩ / (‖Δ(x, ŷ)‖ ‖Δ*‖)  +  α TV(x),

where Δ(x, ŷ) is the user's l local steps *replayed* on candidate images from the same θ_k,
with the same E, B and τ: the server knows the protocol (it asked for it, or the user
published it), and the replay must be the very code the user ran, so the attack differentiates
through ``observation.simulate`` (the harness passes its local-update function in; attacks never
import the harness). The optimiser is that of Inverting Gradients — signed Adam, box projection,
step decay at 3/8, 5/8, 7/8, Gaussian init, restarts (vectorised where the model allows) — see
:mod:`fedleak.attacks.optimisation.presets.inverting_gradients`, whose loop this class reuses.

Labels. The user never sends its labels. With ``labels=recover`` (the default, the
honest-but-curious server of the paper) they come from the label-recovery component applied to
the delta turned into a gradient direction (−Δ*/τ ≈ Σ_m ∇_θ L): exact by iDLG for one image
when the steps are small, approximate (counting) for several images or large τ. With
``labels=known`` the observation's labels are used, for in-process studies of a threat model in
which the server knows them (the harness never supplies them over the wire).

Assumption checked before optimising: the replay takes the number of local steps the user
reported (when the replay can say how many it takes); a mismatch, e.g. a user that sampled
its batches at random, would make Δ(x) a different function from the user's, and is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from fedleak.attacks.attack_registry import register_attack
from fedleak.attacks.base import Progress
from fedleak.attacks.observation import Observation, Reconstruction
from fedleak.attacks.optimisation.presets.inverting_gradients import (
    InvertingGradients,
    InvertingGradientsConfig,
)
from fedleak.attacks.replay_contract import Replay

LABEL_SOURCES = ("recover", "known")


@dataclass
class FedAvgConfig(InvertingGradientsConfig):
    """Inverting Gradients' options, plus where the labels come from."""

    labels: str = field(
        default="recover",
        metadata={"help": "recover: from the delta (iDLG / counting on −Δ/τ); known: the "
                          "observation's labels (in-process threat model only)"},
    )

    def __post_init__(self) -> None:
        """Refuse an unknown label source."""
        super().__post_init__()
        if self.labels not in LABEL_SOURCES:
            raise ValueError(f"labels must be one of {LABEL_SOURCES}, got {self.labels!r}")


class FedAvgObservationError(ValueError):
    """The observation is not a FedAvg delta this attack can replay; the message says why."""


@register_attack("fedavg")
class FedAvgInversion(InvertingGradients):
    """Invert θ_{k+l} − θ_k by differentiating through the user's replayed local steps."""

    Config = FedAvgConfig
    config: FedAvgConfig
    #: the update kinds this attack inverts (a sweep's portfolio skips FedSGD points)
    update_kinds: ClassVar[tuple[str, ...]] = ("delta",)

    def recover(
        self,
        observation: Observation,
        *,
        device: torch.device,
        seed: int,
        progress: Progress | None,
    ) -> Reconstruction:
        """Eq. (4) on the delta through the replayed local update; see the module docstring."""
        observation = _prepared(self, observation)
        result = super().recover(observation, device=device, seed=seed, progress=progress)
        self._describe(result, observation)
        return result

    def recover_many(
        self,
        targets: Sequence[Observation],
        *,
        device: torch.device,
        seeds: Sequence[int],
        progress: Progress | None,
    ) -> list[Reconstruction]:
        """Several FedAvg rounds packed, each checked as :meth:`recover` checks it."""
        prepared = [_prepared(self, observation) for observation in targets]
        results = super().recover_many(prepared, device=device, seeds=seeds, progress=progress)
        for result, observation in zip(results, prepared, strict=True):
            self._describe(result, observation)
        return results

    def _describe(self, result: Reconstruction, observation: Observation) -> None:
        result.extras.update(
            local_steps=observation.local_steps,
            local_learning_rate=observation.learning_rate,
            label_source=self.config.labels,
        )


def _prepared(attack: FedAvgInversion, observation: Observation) -> Observation:
    """Return the observation checked and with the labels the config's source allows."""
    check_fedavg_observation(observation)
    if attack.config.labels == "known":
        if observation.labels is None:
            raise FedAvgObservationError(
                "labels=known, but the observation carries no labels (a victim never sends "
                "them); use labels=recover"
            )
        return observation
    return dataclasses.replace(observation, labels=None)


def check_fedavg_observation(observation: Observation) -> None:
    """Refuse what supplement eq. 2 does not describe, saying what to change."""
    if observation.update_kind != "delta":
        raise FedAvgObservationError(
            f"the fedavg attack inverts a FedAvg parameter delta, but this update is a "
            f"{observation.update_kind!r}; attack it with inverting-gradients, or start the "
            "victim (or ask it) with --protocol fedavg"
        )
    if observation.learning_rate is None or not observation.learning_rate > 0:
        raise FedAvgObservationError(
            "the fedavg attack needs the user's local learning rate τ in the observation"
        )
    if observation.local_steps < 1:
        raise FedAvgObservationError(
            f"the user reported {observation.local_steps} local steps; need at least 1"
        )
    if isinstance(observation.simulate, Replay):
        steps = int(observation.simulate.local_steps(observation.num_images))
        if steps != observation.local_steps:
            raise FedAvgObservationError(
                f"the replay takes {steps} local steps over {observation.num_images} images but "
                f"the user reported {observation.local_steps}; the server's protocol settings "
                "(E, B) must be the user's"
            )
