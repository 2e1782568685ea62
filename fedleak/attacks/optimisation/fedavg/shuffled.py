"""Inverting a shuffled FedAvg delta: the user's order unknown, and modelled.

Dimitrov et al. ("Data Leakage in Federated Averaging", TMLR 2022) attack a FedAvg client that
takes E epochs of shuffled mini-batches by *simulating* its local training on candidate data
(the replay of :mod:`fedleak.attacks.optimisation.fedavg.unrolled`, momentum and weight decay
included), with

- one copy x^(e) of the n images per epoch, each replayed as that epoch, tied together by an
  epoch-order-invariant prior and matched across epochs at the end
  (:mod:`fedleak.attacks.optimisation.fedavg.epochs`, the ``epoch`` prior);
- labels recovered from the delta (:mod:`fedleak.attacks.labels`; with momentum the delta's
  first-order scale is τ Σ_s w_s, not τ·L).

Their code fixes which labels share a mini-batch at random. Here the visiting order of every
epoch is a variable of the attack (:mod:`fedleak.attacks.optimisation.fedavg.batch_order`): it
starts with every label spread evenly over the batches and is revised ``revisions`` times in the
first 3/8 of the iterations (before the first step-size decay) from the output layer's bias residual
— which tells the batches apart when the steps weigh differently, as momentum makes them — each
revision kept only when the replayed output bias at the current images comes closer to the
observed one. The minimised
problem is eq. (1) of :mod:`fedleak.attacks.optimisation.composed` over x and π:

    (x̂, π̂) = argmin_{x, π}  J(u(x, ŷ; π), Δ*) + Σ_k λ_k R_k(x)

**The budget.** ``iterations`` counts objective evaluations per restart: each revision costs
two replays (before and after the exchanges), taken from the optimiser's steps, so the attack
does no more work than ``fedavg`` at the same ``iterations``; at most one revision per 8
iterations (a quarter of the budget), none below 8 iterations (the order then stays the even
guess: a lower bound).

**When it is a measurement.** The replay family contains the user's update (for its images at
the slots and its order as π), so where the bias can identify the batches' label make-up — a
bias in the last layer and step weights that differ within an epoch — the round is "order
unknown, modelled" (``extras["order_model"]``). With plain SGD (equal weights) the bias cannot
tell the batches apart; the order stays the even guess and the round is a lower bound, as a
fixed-order replay is. Where the user's order does not matter (no shuffling, or one batch per
epoch), this is the ``fedavg`` attack.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from fedleak.attacks.attack_registry import register_attack
from fedleak.attacks.base import Progress
from fedleak.attacks.labels import last_layer_indices
from fedleak.attacks.observation import Observation, Reconstruction
from fedleak.attacks.optimisation.adaptive import Parts
from fedleak.attacks.optimisation.engine.problem import ProgressSpan
from fedleak.attacks.optimisation.fedavg.batch_order import OrderModel
from fedleak.attacks.optimisation.fedavg.epochs import merge_epochs
from fedleak.attacks.optimisation.fedavg.unrolled import FedAvgConfig, FedAvgInversion
from fedleak.attacks.optimisation.optimisers import LBFGSPart
from fedleak.attacks.replay_contract import OrderedReplay, RestartsUpdateFn

#: iterations per revision of the order at most (a revision costs two replays)
REVISION_SPACING = 8
#: ``extras["order_model"]`` of a round whose order the attack modelled
MODELLED = "modelled"
#: ... and of one where the output layer could not tell the batches apart
GUESSED = "guessed"


@dataclass
class ShuffledFedAvgConfig(FedAvgConfig):
    """The ``fedavg`` options, plus how often the visiting order is revised."""

    revisions: int = field(default=4, metadata={
        "help": "revisions of the modelled visiting order in the first 3/8 of the "
                "iterations (2 objective evaluations each, out of the budget); 0: keep the "
                "even guess"})

    def __post_init__(self) -> None:
        """Refuse ``revisions`` that is not an integer >= 0."""
        super().__post_init__()
        if isinstance(self.revisions, bool) or not isinstance(self.revisions, int) or \
                self.revisions < 0:
            raise ValueError(f"revisions must be an integer >= 0, got {self.revisions!r}")


@register_attack("fedavg-shuffled")
class ShuffledFedAvg(FedAvgInversion):
    """The FedAvg inversion with the user's shuffled order modelled (module docstring)."""

    Config = ShuffledFedAvgConfig
    config: ShuffledFedAvgConfig

    def recover_with(self, observation: Observation, parts: Parts, *, device: torch.device,
                     seed: int, progress: Progress | None) -> Reconstruction:
        """Invert the update with the visiting order modelled, revised ``revisions`` times."""
        simulate = observation.simulate
        if not isinstance(simulate, OrderedReplay) or \
                not simulate.order_matters(observation.num_images):
            return super().recover_with(observation, parts, device=device, seed=seed,
                                        progress=progress)
        cfg = self.config
        recovered, copies, target, labels, priors, observed, single = self.setup(
            observation, parts, device)
        lbfgs = isinstance(self.optimiser_part(), LBFGSPart)
        # at most one revision per REVISION_SPACING iterations: the revisions' replays come out
        # of the budget and never take more than a quarter of it
        revisions = 0 if lbfgs else min(cfg.revisions, cfg.iterations // REVISION_SPACING)
        steps = cfg.iterations - 2 * revisions
        schedule = tuple(sorted({(j * 3 * steps) // (8 * max(revisions, 1))
                                 for j in range(revisions)}))

        def objective(update: list[torch.Tensor]) -> torch.Tensor:
            value: torch.Tensor = single.value([u.unsqueeze(0) for u in update])
            return value

        def revising(model: OrderModel) -> Callable[[torch.Tensor], None]:
            return lambda images: model.revise(images[0])

        candidates, finals, models, notices = [], [], [], []
        for restart in range(cfg.restarts):
            model = OrderModel.start(observation, simulate, recovered, objective, copies,
                                     device)
            replay = parts.replay.wrap(_one_restart(model), observation)
            problem = replace(self.problem(labels, replay, single, priors,
                                           target.image_bounds(device), rows=False),
                              iterations=steps, revise=revising(model),
                              revise_at=schedule)
            images = self.initial(target, seed + restart, device).unsqueeze(0)
            if lbfgs and cfg.revisions and cfg.iterations >= REVISION_SPACING:
                model.revise(images[0])
            notice, optimised = self.optimise(
                problem, images, ProgressSpan(progress, restart * steps, steps * cfg.restarts))
            notices.append(notice)
            candidates.append(optimised[0].detach())
            finals.append(problem.final_value(optimised[0], cfg.select))
            models.append(model)
        best = min(range(len(finals)), key=finals.__getitem__)
        chosen = models[best]
        result = Reconstruction(
            images=merge_epochs(candidates[best], recovered, copies), labels=recovered,
            objective=finals[best], iterations=cfg.iterations * cfg.restarts,
            restart_objectives=finals,
            extras={"vectorised_restarts": False, "captured": False, **parts.describe(),
                    **order_extras(observation, simulate, chosen, steps, revisions)},
            warnings=sorted({n for n in notices if n}))
        if copies > 1:
            result.extras["epoch_copies"] = copies
        self.describe(result, target, priors)
        return result


def _one_restart(model: OrderModel) -> RestartsUpdateFn:
    """Return the modelled replay in restart form (one restart): ``[1, rows, C, H, W]``."""
    def replay(images: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        return [u.unsqueeze(0) for u in model.replay(images[0], labels)]

    return replay


def identifiable(observation: Observation, replay: OrderedReplay) -> bool:
    """Whether the output bias can tell an epoch's batches apart.

    The layer has a bias and the steps of one epoch weigh differently per image (momentum, or
    unequal batches).
    """
    if last_layer_indices(observation)[1] is None:
        return False
    batches = replay.epoch_batches(observation.num_images)
    weights = replay.step_weights(observation.num_images)
    per_image = [w / (batches[s % len(batches)].stop - batches[s % len(batches)].start)
                 for s, w in enumerate(weights)]
    k = len(batches)
    return any(len({round(v, 12) for v in per_image[e * k:(e + 1) * k]}) > 1
               for e in range(len(per_image) // k))


def order_extras(observation: Observation, replay: OrderedReplay, model: OrderModel,
                 steps: int, revisions: int) -> dict[str, Any]:
    """Return what ``metrics.json`` records of the modelled order (``attack_extras``)."""
    modelled = revisions > 0 and identifiable(observation, replay)
    return {"order_model": MODELLED if modelled else GUESSED,
            "order_revisions": revisions, "order_revisions_kept": model.kept,
            "order_exchanges": model.exchanges,
            "objective_evaluations": steps + model.evaluations,
            "order_history": "; ".join(model.history)}
