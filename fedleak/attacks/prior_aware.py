"""The prior-aware informed adversary (Hayes, Mahloujifar & Balle 2023, §4; Balle et al. 2022).

Threat model: the server knows every record of the user's batch but the target (D⁻), a finite
public candidate set {z_1, …, z_N} that contains the target, the global parameters θ and the
mechanism (protocol and defense chain, Kerckhoffs); it observes the user's update o. It
replays the user's noise-free update u_j = U_θ(D⁻ ∪ {z_j}) for every candidate — the same local
update the user ran, with the published clipping and without the noise — and guesses

    ĵ = argmin_j ‖o − u_j‖²,

the candidate whose simulated update best explains the observed one. Under Gaussian noise of
one covariance for every candidate this is the maximum-likelihood guess, the one that meets
reconstruction robustness most closely (Hayes et al.: it nearly attains 1 − f(κ)). Under
Poisson sampling the batch the user drew is not seen; the replay is its expectation (every
record included), and the guess is still the nearest expectation.

Plain torch: the replay arrives as a callable (:attr:`InformedObservation.simulate`); nothing
here knows of the wire.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

#: ``simulate(images, labels) -> update``: the user's noise-free update on a batch (images in
#: the model's normalised space), one tensor per parameter.
BatchUpdate = Callable[[torch.Tensor, torch.Tensor], list[torch.Tensor]]


@dataclass
class InformedObservation:
    """What the informed adversary holds after one trial (normalised images)."""

    update: list[torch.Tensor]
    candidates: torch.Tensor          # [N, C, H, W]
    candidate_labels: torch.Tensor    # [N]
    known_images: torch.Tensor        # [m, C, H, W]
    known_labels: torch.Tensor        # [m]
    simulate: BatchUpdate


@dataclass
class PriorAwareGuess:
    """The guessed candidate and every candidate's squared distance ‖o − u_j‖²."""

    candidate: int
    distances: list[float]

    @property
    def margin(self) -> float:
        """How much farther the runner-up is than the guess (0 with one candidate)."""
        ordered = sorted(self.distances)
        return ordered[1] - ordered[0] if len(ordered) > 1 else 0.0


class PriorAwareAttack:
    """Choose the candidate whose simulated update is nearest the observed one."""

    def guess(self, observation: InformedObservation) -> PriorAwareGuess:
        """Guess ``ĵ = argmin_j ‖o − u_j‖²`` over the candidates (module docstring).

        ``u_j`` is the noise-free replay on the known records plus candidate j (Hayes et al.
        2023, §4).

        Raises
        ------
        ValueError
            With no candidate, a label count that does not match, or a replay whose size
            differs from the observed update's.
        """
        o = observation
        if o.candidates.shape[0] < 1:
            raise ValueError("the informed adversary needs at least one candidate")
        if o.candidates.shape[0] != o.candidate_labels.shape[0]:
            raise ValueError("one label per candidate is needed")
        observed = torch.cat([u.detach().flatten() for u in o.update]).double()
        distances = []
        for j in range(o.candidates.shape[0]):
            images = torch.cat([o.known_images, o.candidates[j:j + 1]])
            labels = torch.cat([o.known_labels, o.candidate_labels[j:j + 1]])
            simulated = torch.cat([u.detach().flatten()
                                   for u in o.simulate(images, labels)]).double()
            if simulated.shape != observed.shape:
                raise ValueError(f"the replay gives {simulated.numel()} values, the observed "
                                 f"update has {observed.numel()}")
            distances.append(float((observed - simulated).square().sum()))
        best = min(range(len(distances)), key=distances.__getitem__)
        return PriorAwareGuess(best, distances)
