"""Packed attacks: P observations × R restarts optimised as one batch of P·R rows.

Row p·R + r is restart r of observation p: its own candidates x_pr, replayed on observation p's
own θ_p (the harness's packed replay, :func:`~fedleak.attacks.optimisation.restarts.packed_replay`,
one ``torch.func.vmap`` computation over all rows) and compared with observation p's own update
u*_p through observation p's own objective part. F of eq. (1) is a sum over rows, so

    ∂(Σ_{p,r} F_p(x_pr))/∂x_pr = ∂F_p/∂x_pr,

and the first-order loops (:mod:`~fedleak.attacks.optimisation.engine.eager`,
:mod:`~fedleak.attacks.optimisation.engine.captured`) run the pack as R = P·R restarts of one
problem: every observation gets what it gets alone, up to float rounding.

The per-row objective (:func:`packed_objective`): when every part is a weighted cosine with a
diagonal D alone (eq. (1) of :mod:`fedleak.attacks.optimisation.objectives`), one per-row cosine
over D_p ⊙ u and D_p ⊙ u*_p; otherwise (a hinge, a data-term weight, the euclidean distance) row
blocks, each through its own observation's objective (:class:`BlockObjective`).

What packs (:func:`pack_replay`): more than one observation, ``vectorised`` on, one
architecture and protocol (the harness's ``pack`` refuses others), the same image count and
shape, no shuffled epoch copies, replay parts that pack (not ``dp-clipped``), priors that
pack (``tv``, ``box``: not per observation and not coupling restarts) and a first-order
optimiser (not L-BFGS).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from fedleak.attacks.labels import recover_labels
from fedleak.attacks.observation import Observation
from fedleak.attacks.optimisation.adaptive import Parts
from fedleak.attacks.optimisation.fedavg.epochs import epoch_copies
from fedleak.attacks.optimisation.gradient_matching import GradientObjective, WeightedObjective
from fedleak.attacks.optimisation.optimisers import OptimiserPart
from fedleak.attacks.optimisation.priors import PriorPart
from fedleak.attacks.optimisation.restarts import RestartsCosineObjective, packed_replay
from fedleak.attacks.replay_contract import PackedUpdateFn, RestartsUpdateFn


def pack_replay(targets: Sequence[Observation], parts: Sequence[Parts],
                priors: Sequence[PriorPart], optimiser: OptimiserPart, *,
                vectorised: bool) -> PackedUpdateFn | None:
    """Return the packed replay of ``targets``, or None when they cannot be packed.

    The packed replay of ``targets``, or None when they cannot be packed (module docstring): the
    caller then attacks them one after the other.
    """
    packed = packed_replay(targets) if vectorised and len(targets) > 1 else None
    if packed is None or len({(o.num_images, o.image_shape) for o in targets}) > 1 or \
            any(epoch_copies(o) > 1 for o in targets) or \
            not all(p.replay.packable for p in parts) or \
            not all(p.packable for p in priors) or \
            not optimiser.first_order:
        return None
    return packed


@dataclass(frozen=True)
class Pack:
    """P observations × R restarts as rows.

    The labels ``[P, n]``, the init of every row ``[P·R, n, C, H, W]``, the per-row objective and
    the replay of all rows.
    """

    labels: torch.Tensor
    images: torch.Tensor
    objective: GradientObjective
    replay: RestartsUpdateFn

    @property
    def count(self) -> int:
        """P, the observations packed."""
        return int(self.labels.shape[0])


def pack(targets: Sequence[Observation], parts: Sequence[Parts], packed: PackedUpdateFn,
         initial: Callable[[Observation, int], torch.Tensor], seeds: Sequence[int],
         restarts: int, device: torch.device) -> Pack:
    """Return the rows of a packed attack.

    Observation p's restart r starts from ``initial(targets[p], seeds[p] + r)``, where
    ``reconstruct(targets[p], seed=seeds[p])`` starts it.
    """
    first = targets[0]
    count = len(targets)
    labels = torch.stack([recover_labels(o).to(device) for o in targets])
    shape = (first.num_images, *first.image_shape)
    images = torch.stack([
        torch.stack([initial(o, s) for s in range(seeds[p], seeds[p] + restarts)])
        for p, o in enumerate(targets)])
    flat = images.view(count * restarts, *shape)
    observed = [torch.stack([o.update[i].to(device) for o in targets])
                .repeat_interleave(restarts, dim=0) for i in range(len(first.update))]
    diagonal = all(p.objective.cosine_family and p.objective.packs(o)
                   for p, o in zip(parts, targets, strict=True))
    objective = packed_objective(targets, parts, observed, restarts, device) if diagonal \
        else BlockObjective([p.objective.build(RestartsCosineObjective,
                                               [u.to(device) for u in o.update], o,
                                               rows=True)
                             for p, o in zip(parts, targets, strict=True)], restarts)

    def replay(x: torch.Tensor, _: torch.Tensor) -> list[torch.Tensor]:
        updates = packed(x.view(count, restarts, *shape), labels)
        return [u.reshape(count * restarts, *u.shape[2:]) for u in updates]

    return Pack(labels=labels, images=flat, objective=objective, replay=replay)


class BlockObjective:
    """A packed batch's objective as row blocks.

    Rows p·R … p·R + R − 1 are compared by observation p's own objective (any part: hinges,
    data-term weights, the euclidean distance), and the values, cotangents and scales are
    concatenated back.
    """

    def __init__(self, blocks: Sequence[GradientObjective], rows: int) -> None:
        self.blocks = list(blocks)
        self.rows = rows

    def value(self, candidate: Sequence[torch.Tensor]) -> torch.Tensor:
        """Every block's value on its own rows, concatenated ([P·R])."""
        return torch.cat([
            block.value([u[index * self.rows:(index + 1) * self.rows] for u in candidate])
            .reshape(-1).expand(self.rows) for index, block in enumerate(self.blocks)])

    def value_and_output_grads(
        self, candidate: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """Every block's value, cotangents and scale on its own rows, concatenated."""
        values, scales, grads = [], [], []
        for index, block in enumerate(self.blocks):
            rows = slice(index * self.rows, (index + 1) * self.rows)
            value, output_grads, scale = block.value_and_output_grads(
                [u[rows] for u in candidate])
            values.append(value.reshape(-1).expand(self.rows))
            scales.append(scale.reshape(-1).expand(self.rows))
            grads.append(output_grads)
        return (torch.cat(values), [torch.cat(g) for g in zip(*grads, strict=True)],
                torch.cat(scales))


def packed_objective(
    targets: Sequence[Observation],
    parts: Sequence[Parts],
    observed: list[torch.Tensor],
    restarts: int,
    device: torch.device,
) -> RestartsCosineObjective | WeightedObjective:
    """Return the per-row objective of a packed attack.

    Row p·R + r compares with observation p's update through observation p's own objective part (its
    own D of eq. (1) in :mod:`fedleak.attacks.optimisation.objectives`); the plain per-row cosine
    when every D is 1.
    """
    diagonals = [part.objective.diagonal([u.to(device) for u in o.update], o, False)
                 for o, part in zip(targets, parts, strict=True)]
    if all(d is None for d in diagonals):
        return RestartsCosineObjective(observed, per_row=True)
    stacked = []
    for i, like in enumerate(observed):
        rows = [(d[i] if d is not None else torch.ones((), dtype=like.dtype, device=device))
                .expand(like.shape[1:]) for d in diagonals]
        stacked.append(torch.stack(rows).repeat_interleave(restarts, dim=0))
    return WeightedObjective(RestartsCosineObjective, observed, stacked, per_row=True)
