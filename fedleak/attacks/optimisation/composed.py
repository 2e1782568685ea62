"""Optimisation attacks composed from registered parts; the named attacks are presets.

An optimisation attack on an observed update u* solves

    x̂ = argmin_x  J(u(x, ŷ), u*)  +  Σ_k λ_k(i) R_k(x)                               (1)

from an init x₀ (Gaussian N(0, 1) in normalised space, or U(0, 1) in pixel space), with the
**objective** J (``cosine``, ``masked-cosine``, ``gaussian``, ``euclidean``; ``auto`` models the
published defenses), the **replay** u(x, ŷ) (``plain``, ``dp-clipped``), the **priors** R_k with
weights λ_k (``tv``, ``bn``, ``l2``, ``orthogonality``, ``qian``, ``group``, the constraint
``box``) and the **optimiser** (``signed-adam``, ``adam``, ``sgd``, ``lbfgs``), each a registered
part of :mod:`fedleak.attacks.optimisation` (``objectives``, ``adaptive``, ``replays``,
``priors``, ``optimisers``), and labels ŷ from :func:`fedleak.attacks.labels.recover_labels`. R
restarts start from seeds ``seed … seed + R − 1``; each ends with (1) evaluated at its last iterate
(``select=total``, the priors at their last weights; ``select=objective``: J alone) and the lowest
wins.

How one first-order iteration is computed (the speed of the attack is the speed of this loop):
the objective part returns J, the cotangent g with ∂J/∂u = s · g and the scalar s (the cosine's
``s = −1/(√b ‖u*‖)``, 1 for the euclidean distance); each prior adds its term R_k with the
cotangent λ_k / s; one vector–Jacobian product back to the images, multiplied by s, is the whole
gradient of (1) (see :mod:`fedleak.attacks.optimisation.presets.inverting_gradients`). The optimiser
steps, the constraint priors project. A restart whose objective stops being finite is frozen where
it was; its result is its last iterate when finite, else the last one with a finite objective.

:class:`ComposedInversion` builds the problem (:mod:`fedleak.attacks.optimisation.engine.problem`)
and picks the loop, per run (:mod:`fedleak.attacks.optimisation.engine`): restarts *vectorised* (one
batched replay, ``torch.func.vmap``, for models without BatchNorm), in *lockstep* (a prior that
couples restarts, ``group``, on a model that cannot be vectorised) or *one by one*
(:func:`~fedleak.attacks.optimisation.restarts.side_by_side`); the *eager* loop, or on CUDA the
*captured* one (a CUDA graph); *L-BFGS* restarts one by one, keeping the best finite iterate each
evaluated and refusing priors whose weight changes with the iteration or couples restarts;
*packed* observations (:meth:`ComposedInversion.recover_many`) for first-order optimisers with
packable priors (``tv``, ``box``); ``workers=N``: restarts split across N processes (``workers``).

The presets ``inverting-gradients``, ``fedavg``, ``dlg``, ``qian`` and ``gradinversion`` are
subclasses that only set defaults and shorthand options (``tv=``, ``bn=``, ``lr=``, …); any
part can be replaced with ``-o objective=…``, ``-o replay=…``, ``-o optimizer=NAME:k=v;k=v``
and ``-o priors=NAME:k=v+NAME…`` (``none``: no priors).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from fedleak.attacks.attack_registry import AttackConfigError
from fedleak.attacks.base import Attack, Progress
from fedleak.attacks.capture import capturable
from fedleak.attacks.labels import recover_labels
from fedleak.attacks.observation import Observation, Reconstruction
from fedleak.attacks.optimisation.adaptive import (
    AWARE,
    BLIND,
    Parts,
    choose_parts,
    parse_part,
    selects,
)
from fedleak.attacks.optimisation.engine.composed_config import (
    ComposedConfig,
    check_numbers,
    check_source,
    fitting,
    prior_specs,
)
from fedleak.attacks.optimisation.engine.first_order import optimise_first_order
from fedleak.attacks.optimisation.engine.initial import gaussian_init, uniform_init
from fedleak.attacks.optimisation.engine.lbfgs import check_closure, lbfgs_restarts
from fedleak.attacks.optimisation.engine.packed import pack, pack_replay, packed_objective
from fedleak.attacks.optimisation.engine.problem import InversionProblem, ProgressSpan
from fedleak.attacks.optimisation.engine.weighing import select, select_many
from fedleak.attacks.optimisation.engine.workers import recover_in_workers, splits
from fedleak.attacks.optimisation.fedavg.epochs import epoch_copies, merge_epochs, with_epoch_copies
from fedleak.attacks.optimisation.gradient_matching import CosineObjective, GradientObjective
from fedleak.attacks.optimisation.optimisers import OPTIMISERS, LBFGSPart, OptimiserPart
from fedleak.attacks.optimisation.priors import PRIORS, BoundPrior, PriorPart
from fedleak.attacks.optimisation.restarts import RestartsCosineObjective, alone, side_by_side
from fedleak.attacks.parts import PartError
from fedleak.attacks.replay_contract import RestartsUpdateFn

__all__ = ["ComposedConfig", "ComposedInversion", "alone", "check_numbers", "check_source",
           "gaussian_init", "packed_objective", "uniform_init"]


class ComposedInversion(Attack[Observation]):
    """Eq. (1) of the module docstring with the configured parts (the presets' engine)."""

    Config = ComposedConfig
    config: ComposedConfig

    def __init__(self, config: Any | None = None) -> None:
        super().__init__(config)
        try:
            self._optimiser = self._build_optimiser()
            self._priors = self._build_priors()
            optimiser, priors = self._optimiser, self._priors
            if not optimiser.first_order:
                check_closure(priors)
            coupled = [p.name for p in priors if p.coupled]
            if coupled and self.config.restarts < 2:
                raise PartError(f"prior {coupled[0]!r} pulls restarts towards each other: it "
                                f"needs restarts >= 2, got {self.config.restarts}; set "
                                "-o restarts=4 or drop the prior")
        except PartError as err:
            raise AttackConfigError(str(err)) from None

    # ----- parts ---------------------------------------------------------------------------

    def shorthand_optimiser(self) -> tuple[str, dict[str, Any]]:
        """Return the preset's optimiser and the shorthand options it fills in when unset."""
        return "signed-adam", {}

    def shorthand_priors(self) -> list[tuple[str, dict[str, Any]]]:
        """Return the preset's priors from its shorthand options."""
        return []

    def optimiser_part(self) -> OptimiserPart:
        """Return the optimiser, built once from the config."""
        return self._optimiser

    def budget(self) -> int:
        """Return the objective evaluations one target may cost: T × R × evaluations per step."""
        cfg = self.config
        return cfg.iterations * cfg.restarts * self._optimiser.evaluations_per_step()

    def prior_parts(self) -> list[PriorPart]:
        """Return the priors, built once from the config."""
        return list(self._priors)

    def _build_optimiser(self) -> OptimiserPart:
        """Build the optimiser: ``optimizer=`` (over the preset's shorthand) or the preset's."""
        name, shorthand = self.shorthand_optimiser()
        options: dict[str, Any] = {}
        if self.config.optimizer:
            name, options = parse_part(self.config.optimizer)
        part_class = OPTIMISERS.get(name)
        return OPTIMISERS.create(name, {**fitting(part_class, shorthand), **options})

    def _build_priors(self) -> list[PriorPart]:
        """Return the priors: ``priors=`` or the preset's shorthand ones."""
        if self.config.priors:
            return [PRIORS.create(*parse_part(spec)) for spec in prior_specs(self.config.priors)]
        return [PRIORS.create(name, options) for name, options in self.shorthand_priors()]

    def parts(self, observation: Observation) -> Parts:
        """Return the objective and replay parts for ``observation``, checked before step 1."""
        return choose_parts(observation, self.config.objective, self.config.replay)

    def bind_priors(self, observation: Observation) -> list[BoundPrior]:
        """Return the priors checked against ``observation`` and bound to it."""
        priors = []
        parts = self.prior_parts()
        if epoch_copies(observation) > 1 and not any(p.name == "epoch" for p in parts):
            parts.append(PRIORS.create("epoch"))  # the copies need tying together
        for part in parts:
            part.check(observation)
            priors.append(part.bind(observation, self.config.restarts))
        return priors

    def initial(self, observation: Observation, seed: int, device: torch.device) -> torch.Tensor:
        """Return the init x₀ [n, C, H, W] drawn from ``seed``."""
        if self.config.init == "uniform":
            return uniform_init(observation, seed, device)
        return gaussian_init((observation.num_images, *observation.image_shape), seed, device)

    def describe(self, result: Reconstruction, observation: Observation,
                 priors: Sequence[BoundPrior]) -> None:
        """Add what metrics.json records of the parts to ``result.extras``."""
        result.extras.update(optimizer=self.optimiser_part().name,
                             priors=[b.part.name for b in priors])
        for b in priors:
            if b.source is not None:
                result.extras["bn_source"] = b.source

    def problem(self, labels: torch.Tensor, replay: RestartsUpdateFn,
                objective: GradientObjective, priors: Sequence[BoundPrior],
                box: tuple[torch.Tensor, torch.Tensor], *, rows: bool,
                coordinates: int = 0) -> InversionProblem:
        """Build eq. (1) over ``replay`` and ``objective`` with this attack's settings."""
        cfg = self.config
        return InversionProblem(labels=labels, replay=replay, objective=objective,
                                priors=tuple(priors), box=box, optimiser=self._optimiser,
                                iterations=cfg.iterations, log_every=cfg.log_every, rows=rows,
                                coordinates=coordinates)

    def graph_safe(self, device: torch.device) -> bool:
        """Whether the loops run their graph-safe step (``capture`` on, on CUDA)."""
        return self.config.capture and capturable(device)

    # ----- one observation -----------------------------------------------------------------

    def recover(
        self,
        observation: Observation,
        *,
        device: torch.device,
        seed: int,
        progress: Progress | None,
    ) -> Reconstruction:
        """Run ``restarts`` × ``iterations`` steps of the optimiser on eq. (1).

        Keep the best restart. Restart r starts from ``initial(observation, seed + r)``, drawn on
        the CPU. With the default ``objective=auto``, ``replay=auto`` and a published defense that
        makes the aware parts differ from the blind ones, half the iterations go to each and the
        reconstruction that better explains the update is kept
        (:func:`~fedleak.attacks.optimisation.engine.weighing.select`).
        """
        parts = self.parts(observation)
        if selects(observation, self.config.objective, self.config.replay, parts) and \
                self.config.iterations >= 2:
            return select(self, observation, device=device, seed=seed, progress=progress)
        return self.recover_with(observation, parts, device=device, seed=seed,
                                 progress=progress)

    def variants(self) -> dict[str, ComposedInversion]:
        """Return the attacks the default weighs: aware at ⌈T/2⌉ iterations, blind at ⌊T/2⌋."""
        cfg = self.config
        half = cfg.iterations // 2
        return {"aware": type(self)(dataclasses.replace(
                    cfg, iterations=cfg.iterations - half, objective=AWARE, replay=AWARE)),
                "blind": type(self)(dataclasses.replace(
                    cfg, iterations=half, objective=BLIND[0], replay=BLIND[1]))}

    def setup(self, observation: Observation, parts: Parts, device: torch.device) -> tuple[
            torch.Tensor, int, Observation, torch.Tensor, Any, list[torch.Tensor], Any]:
        """Return what every recovery starts from.

        The recovered labels, the epoch copies (shuffled epochs: one copy of the n images per epoch,
        Dimitrov et al.), the observation over those copies and its labels, the bound priors, the
        observed update on ``device`` and the one-observation objective.
        """
        recovered = recover_labels(observation).to(device)
        copies = epoch_copies(observation)
        target, labels = with_epoch_copies(observation, recovered, copies)
        priors = self.bind_priors(target)
        observed = [u.to(device) for u in observation.update]
        single = parts.objective.build(CosineObjective, observed, observation, rows=False)
        return recovered, copies, target, labels, priors, observed, single

    def recover_with(self, observation: Observation, parts: Parts, *, device: torch.device,
                     seed: int, progress: Progress | None) -> Reconstruction:
        """:meth:`recover` with the given objective and replay parts (``workers``: split)."""
        if splits(self, device):
            return recover_in_workers(self, observation, parts, device, seed, progress)
        cfg = self.config
        recovered, copies, target, labels, priors, observed, single = self.setup(
            observation, parts, device)
        one_by_one = parts.replay.wrap(alone(observation), observation)
        size = sum(u.numel() for u in observed)
        one = self.problem(labels, one_by_one, single, priors, observation.image_bounds(device),
                           rows=False, coordinates=size)
        if isinstance(self._optimiser, LBFGSPart):
            return self.recover_lbfgs(one, target, parts, recovered, copies, device=device,
                                      seed=seed, progress=progress)
        total = cfg.iterations * cfg.restarts
        replay = side_by_side(observation, one_by_one,
                              lambda batched: parts.replay.wrap(batched, observation),
                              restarts=cfg.restarts, vectorised=cfg.vectorised,
                              coupled=any(b.part.coupled for b in priors),
                              functional=cfg.compile)
        notices: list[str | None] = []
        if replay is not None:
            stacked = torch.stack([self.initial(target, s, device)
                                   for s in range(seed, seed + cfg.restarts)])
            batched = parts.objective.build(RestartsCosineObjective, observed, observation,
                                            rows=True)
            problem = self.problem(labels, replay, batched, priors,
                                   target.image_bounds(device), rows=True, coordinates=size)
            notice, results = self.optimise(problem, stacked, ProgressSpan(progress, 0, total))
            notices.append(notice)
            candidates = list(results)
        else:
            candidates = []
            for restart in range(cfg.restarts):
                images = self.initial(target, seed + restart, device).unsqueeze(0)
                span = ProgressSpan(progress, restart * cfg.iterations, total)
                notice, optimised = self.optimise(one, images, span)
                notices.append(notice)
                candidates.append(optimised[0])
        finals = [one.final_value(c, cfg.select) for c in candidates]
        best = min(range(len(finals)), key=finals.__getitem__)
        result = Reconstruction(
            images=merge_epochs(candidates[best].detach(), recovered, copies),
            labels=recovered.detach(),
            objective=finals[best],
            iterations=total,
            restart_objectives=finals,
            extras={"vectorised_restarts": replay is not None,
                    "captured": capturable(device) and cfg.capture and not any(notices),
                    **parts.describe()},
            warnings=sorted({n for n in notices if n}),
        )
        result.extras.update({"epoch_copies": copies} if copies > 1 else {})
        self.describe(result, observation, priors)
        return result

    def recover_lbfgs(self, problem: InversionProblem, target: Observation, parts: Parts,
                      recovered: torch.Tensor, copies: int, *, device: torch.device,
                      seed: int, progress: Progress | None) -> Reconstruction:
        """Run L-BFGS trials one by one on ``target``; the best trial's best finite iterate wins."""
        cfg, graph_safe = self.config, self.graph_safe(device)
        best, finals, notices = lbfgs_restarts(
            problem, lambda restart: self.initial(target, seed + restart, device),
            cfg.restarts, progress, graph_safe=graph_safe)
        images = best.images[0] if best.images is not None else \
            self.initial(target, seed, device)
        result = Reconstruction(images=merge_epochs(images, recovered, copies),
                                labels=recovered, objective=best.value,
                                iterations=cfg.iterations * cfg.restarts,
                                restart_objectives=finals, warnings=sorted(set(notices)),
                                extras={"captured": graph_safe and not notices,
                                        **parts.describe()})
        self.describe(result, target, problem.priors)
        return result

    def optimise(self, problem: InversionProblem, images: torch.Tensor, span: ProgressSpan,
                 *, graph_safe: bool | None = None) -> tuple[str | None, torch.Tensor]:
        """Run the first-order loop on ``images`` ``[R, n, C, H, W]``.

        R restarts side by side, captured (:mod:`fedleak.attacks.optimisation.engine.captured`) when
        ``graph_safe`` (default: :meth:`graph_safe`), else compiled or eager
        (:mod:`fedleak.attacks.optimisation.engine.first_order`). Returns a notice when a path fell
        back to eager, and the result per restart (the last iterate, or the last with a finite
        objective when that one is not finite).
        """
        if graph_safe is None:
            graph_safe = self.graph_safe(images.device)
        return optimise_first_order(problem, images, span, graph_safe=graph_safe,
                                    compiled=self.config.compile,
                                    kernels=self.config.convolutions)

    # ----- several observations ------------------------------------------------------------

    def recover_many(
        self,
        targets: Sequence[Observation],
        *,
        device: torch.device,
        seeds: Sequence[int],
        progress: Progress | None,
    ) -> list[Reconstruction]:
        """Packed attacks: P observations × R restarts optimised as one batch.

        Observation p's restarts start where ``reconstruct(targets[p], seed=seeds[p])`` starts
        them and each row is optimised against its own observed update at its own θ_p, so
        every observation gets the result it would get alone, up to float rounding
        (:mod:`fedleak.attacks.optimisation.engine.packed`, which says what packs), else one by one.
        """
        cfg = self.config
        parts = [self.parts(o) for o in targets]
        weighing = [selects(o, cfg.objective, cfg.replay, p) and cfg.iterations >= 2
                    for o, p in zip(targets, parts, strict=True)]
        if any(weighing):
            return select_many(self, targets, weighing, device=device, seeds=seeds,
                               progress=progress)
        prior_parts = self.prior_parts()
        packed = pack_replay(targets, parts, prior_parts, self.optimiser_part(),
                             vectorised=cfg.vectorised)
        if packed is None:
            return super().recover_many(targets, device=device, seeds=seeds, progress=progress)
        first = targets[0]
        priors = [p.bind(first, cfg.restarts) for p in prior_parts]
        rows = pack(targets, parts, packed, lambda o, s: self.initial(o, s, device), seeds,
                    cfg.restarts, device)
        problem = self.problem(rows.labels, rows.replay, rows.objective, priors,
                               first.image_bounds(device), rows=True,
                               coordinates=sum(u.numel() for u in first.update))
        span = ProgressSpan(progress, 0, rows.count * cfg.restarts * cfg.iterations)
        notice, flat = self.optimise(problem, rows.images, span)
        images = flat.view(rows.count, cfg.restarts, *flat.shape[1:])
        return [self.unpacked(observation, parts[p], images[p], rows.labels[p], priors, notice,
                              count=rows.count, device=device)
                for p, observation in enumerate(targets)]

    def unpacked(self, observation: Observation, parts: Parts, candidates: torch.Tensor,
                 labels: torch.Tensor, priors: Sequence[BoundPrior], notice: str | None, *,
                 count: int, device: torch.device) -> Reconstruction:
        """One packed observation's result: its best restart by eq. (1) alone."""
        cfg = self.config
        single = parts.objective.build(CosineObjective,
                                       [u.to(device) for u in observation.update],
                                       observation, rows=False)
        alone_problem = self.problem(labels, alone(observation), single, priors,
                                     observation.image_bounds(device), rows=False)
        finals = [alone_problem.final_value(candidate, cfg.select) for candidate in candidates]
        best = min(range(len(finals)), key=finals.__getitem__)
        result = Reconstruction(
            images=candidates[best].detach().clone(), labels=labels.detach(),
            objective=finals[best], iterations=cfg.iterations * cfg.restarts,
            restart_objectives=finals,
            extras={"vectorised_restarts": True, "packed_with": count,
                    "captured": capturable(device) and cfg.capture and not notice,
                    **parts.describe()},
            warnings=[notice] if notice else [])
        self.describe(result, observation, priors)
        return result
