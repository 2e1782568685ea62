"""Vectorised restarts: R random restarts of an optimisation attack as one batched computation.

Restart r of an attack optimises its own candidate batch x_r (n images) from its own random
init, and its objective depends on x_r alone: J(x_1, …, x_R) = Σ_r J_r(x_r), so

    ∂J/∂x_r = ∂J_r/∂x_r,

and one backward pass through the stacked candidates X = [x_1; …; x_R] (shape [R, n, C, H, W])
gives every restart its own gradient, exactly as R separate runs would. What must stay per
restart is everything that is *not* a sum over restarts:

- the user's update u(x_r), replayed for each restart as if it were its own user (the harness
  does it with ``torch.func.vmap``; see ``UpdateSimulator.restarts``), never one update over the
  R·n images;
- the cosine term of eq. (4): ``a_r = ⟨u(x_r), u*⟩``, ``b_r = ‖u(x_r)‖²`` and its gradient
  ``s_r (u* − (a_r/b_r) u(x_r))`` with ``s_r = −1/(√b_r ‖u*‖)`` (see ``inverting_gradients``);
- total variation, a mean over each restart's own pixels.

Element-wise optimiser steps (signed Adam, the box projection, a step size shared by all
restarts at the same iteration) are per restart by construction. The attack receives the
batched replay as ``observation.simulate.restarts`` when the observation's replay is a
vectorisable :class:`~fedleak.attacks.replay_contract.Replay`; attacks never import the
harness.

Three forms of the replay of R restarts, chosen per run by :func:`side_by_side`: *vectorised*
(that batched replay, one ``torch.func.vmap`` computation), *lockstep* (each restart replayed
in turn inside one call, for a prior that couples restarts on a model that cannot be
vectorised, :func:`lockstep`), or none: the restarts run one by one, each replayed
:func:`alone`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from fedleak.attacks.observation import Observation
from fedleak.attacks.replay_contract import PackedUpdateFn, Replay, RestartsUpdateFn


def batched_replay(observation: Observation) -> RestartsUpdateFn | None:
    """Return the observation's replay over a leading restart dimension, or None if it has none."""
    simulate = observation.simulate
    if not isinstance(simulate, Replay) or not simulate.vectorisable:
        return None
    return simulate.restarts


def alone(observation: Observation) -> RestartsUpdateFn:
    """Return the observation's own replay in restart form (one restart)."""
    def replay(images: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        return [u.unsqueeze(0) for u in observation.simulate(images[0], y)]

    return replay


def lockstep(one: RestartsUpdateFn) -> RestartsUpdateFn:
    """R restarts replayed one after the other inside one call: ``[R, n, …] → [R, *θ_l]``."""
    def replay(images: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        updates = [one(images[r:r + 1], y) for r in range(images.shape[0])]
        return [torch.cat(parts) for parts in zip(*updates, strict=True)]

    return replay


def side_by_side(
    observation: Observation,
    one_by_one: RestartsUpdateFn,
    wrap: Callable[[RestartsUpdateFn], RestartsUpdateFn],
    *,
    restarts: int,
    vectorised: bool,
    coupled: bool,
    functional: bool = False,
) -> RestartsUpdateFn | None:
    """Return the replay of all ``restarts`` in one call, or None to run them one by one.

    Vectorised when asked for and the observation offers a batched replay (``wrap`` adds the
    replay part's mechanism around it, as it did around ``one_by_one``); else in lockstep when
    a prior couples the restarts (``coupled``); None for a single restart.
    """
    if restarts < 2 and functional:
        one = batched_replay(observation)
        return None if one is None else wrap(one)
    if restarts < 2 or not (vectorised or coupled):
        return None
    batched = batched_replay(observation) if vectorised else None
    if batched is not None:
        return wrap(batched)
    return lockstep(one_by_one) if coupled else None


def restart_total_variation(images: torch.Tensor) -> torch.Tensor:
    """TV of each restart's batch: ``images`` [R, n, C, H, W] → [R].

    Entry r equals ``total_variation(images[r])``: mean ``|horizontal|`` plus mean ``|vertical|``
    differences over restart r's own pixels.
    """
    dims = tuple(range(1, images.dim()))
    dx = (images[..., :, 1:] - images[..., :, :-1]).abs().mean(dim=dims)
    dy = (images[..., 1:, :] - images[..., :-1, :]).abs().mean(dim=dims)
    return dx + dy


class RestartsCosineObjective:
    """``1 − cos(u(x_r), u*_r)`` of eq. (4) for every restart r at once, with its gradients.

    Candidates are stacked updates (one ``[R, *θ_l.shape]`` tensor per parameter). The observed
    update ``u*`` is shared by all restarts, or, with ``per_row``, given per row
    (``[R, *θ_l.shape]``: packed attacks on several observations, each row against its own).
    """

    def __init__(self, observed: Sequence[torch.Tensor], per_row: bool = False) -> None:
        self.observed = [t.detach() for t in observed]
        self.per_row = per_row
        if per_row:
            squares = torch.stack([t.double().reshape(t.shape[0], -1).square().sum(1)
                                   for t in self.observed]).sum(0)
        else:
            squares = torch.stack([t.double().square().sum() for t in self.observed]).sum()
        self.observed_norm = squares.sqrt().to(self.observed[0].dtype)

    def dots(self, candidate: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``a_r = ⟨u_r, u*_r⟩`` and ``b_r = ‖u_r‖²``, each shaped [R]."""
        cross, square = [], []
        for u, o in zip(candidate, self.observed, strict=True):
            flat = u.reshape(u.shape[0], -1)
            if self.per_row:
                cross.append(torch.linalg.vecdot(flat, o.reshape(o.shape[0], -1)))
            else:
                cross.append(flat @ o.reshape(-1))
            square.append(torch.linalg.vecdot(flat, flat))
        return torch.stack(cross).sum(0), torch.stack(square).sum(0)

    def value(self, candidate: Sequence[torch.Tensor]) -> torch.Tensor:
        """Per-restart objective ``1 − a_r / (√b_r ‖u*_r‖)`` [R]."""
        a, b = self.dots([u.detach() for u in candidate])
        return 1 - a / (b.sqrt() * self.observed_norm)

    def value_and_output_grads(
        self, candidate: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """Return the per-restart objective [R], cotangents and scales.

        Per-restart objective [R], the cotangents ``g_r = u*_r − (a_r/b_r) u_r`` (stacked) and the
        scales ``s_r = −1/(√b_r ‖u*_r‖)`` [R]: ∂J_r/∂u_r = s_r g_r.
        """
        detached = [u.detach() for u in candidate]
        a, b = self.dots(detached)
        root_b = b.sqrt()
        value = 1 - a / (root_b * self.observed_norm)
        scale = -1 / (root_b * self.observed_norm)
        ratio = -a / b
        grads = []
        for u, o in zip(detached, self.observed, strict=True):
            grads.append(torch.addcmul(o, u, ratio.view(-1, *[1] * (u.dim() - 1))))
        return value, grads, scale


def packed_replay(observations: Sequence[Observation]) -> PackedUpdateFn | None:
    """Return one replay for several observations' candidates at once, or None.

    One replay for several observations' candidates at once, or None when they cannot be packed (a
    vectorisable :class:`~fedleak.attacks.replay_contract.Replay` offers ``pack(others)`` for models
    of one architecture and protocol).
    """
    replays = [o.simulate for o in observations]
    vectorisable = [r for r in replays if isinstance(r, Replay) and r.vectorisable]
    if len(vectorisable) < len(replays):
        return None
    try:
        return vectorisable[0].pack(vectorisable[1:])
    except ValueError:
        return None


def stacked_inits(
    init: Callable[[tuple[int, ...], int, torch.device], torch.Tensor],
    shape: tuple[int, ...],
    seeds: Sequence[int],
    device: torch.device,
) -> torch.Tensor:
    """``init(shape, seed, device)`` for every seed, stacked.

    Restart r starts where the sequential run with ``seeds[r]`` starts.
    """
    return torch.stack([init(shape, seed, device) for seed in seeds])
