"""Optimisation attacks composed from registered parts; the named attacks are presets.

An optimisation attack on an observed update u* solves

    x̂ = argmin_x  J(u(x, ŷ), u*)  +  Σ_k λ_k(i) R_k(x)                               (1)

from an init x₀ (Gaussian N(0, 1) in normalised space, or U(0, 1) in pixel space), with

- the **objective** J (:mod:`fedleak.attacks.objectives`: ``cosine``, ``masked-cosine``,
  ``gaussian``, ``euclidean``; ``auto`` models the published defenses,
  :mod:`fedleak.attacks.adaptive`),
- the **replay** u(x, ŷ) (:mod:`fedleak.attacks.replays`: ``plain``, ``dp-clipped``),
- the **priors** R_k with their weights λ_k (:mod:`fedleak.attacks.priors`: ``tv``, ``bn``,
  ``l2``, ``orthogonality``, ``qian``, ``group``, and the constraint ``box``),
- the **optimiser** (:mod:`fedleak.attacks.optimisers`: ``signed-adam``, ``adam``, ``sgd``,
  ``lbfgs``),

and labels ŷ from :func:`fedleak.attacks.labels.recover_labels`. R restarts start from seeds
``seed … seed + R − 1``; each ends with (1) evaluated at its last iterate (``select=total``, the
priors at their last weights; ``select=objective``: J alone) and the lowest wins.

How one first-order iteration is computed (the speed of the attack is the speed of this loop):
the objective part returns J, the cotangent g with ∂J/∂u = s · g and the scalar s (the cosine's
``s = −1/(√b ‖u*‖)``, 1 for the euclidean distance); each prior adds its term R_k with the
cotangent λ_k / s; one vector–Jacobian product back to the images, multiplied by s, is the whole
gradient of (1) (see :mod:`fedleak.attacks.inverting_gradients`). The optimiser steps, the
constraint priors project. A restart whose objective stops being finite is frozen where it
was; its result is its last iterate when finite, else the last one with a finite objective.

Paths, chosen per run: *vectorised* restarts (one batched replay, ``torch.func.vmap``, for models
without BatchNorm), *lockstep* restarts (a prior that couples restarts, ``group``, on a model
that cannot be vectorised: each restart replayed in turn inside one step), *one by one*
otherwise; *packed* observations (:meth:`ComposedInversion.recover_many`) for first-order
optimisers with packable priors (``tv``, ``box``); on CUDA one step (or, for L-BFGS, one
evaluation) is *captured* as a CUDA graph (:mod:`fedleak.attacks.capture`). L-BFGS runs
restarts one by one, keeps the best finite iterate it evaluated, and refuses priors whose
weight changes with the iteration or couples restarts.

The presets ``inverting-gradients``, ``fedavg``, ``dlg``, ``qian`` and ``gradinversion`` are
subclasses that only set defaults and shorthand options (``tv=``, ``bn=``, ``lr=``, …); any
part can be replaced with ``-o objective=…``, ``-o replay=…``, ``-o optimizer=NAME:k=v;k=v``
and ``-o priors=NAME:k=v+NAME…`` (``none``: no priors).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from fedleak.attacks.adaptive import (
    AUTO,
    AWARE,
    BLIND,
    Parts,
    check_spec,
    choose_parts,
    parse_part,
    selects,
)
from fedleak.attacks.base import Attack, Progress
from fedleak.attacks.batch_statistics import SOURCES
from fedleak.attacks.capture import capturable, captured_function, run_iterations
from fedleak.attacks.epochs import epoch_copies, merge_epochs
from fedleak.attacks.explained import better, explain, mechanism_replay
from fedleak.attacks.labels import recover_labels
from fedleak.attacks.objectives import (
    CosineObjective,
    GradientObjective,
    PartError,
    WeightedObjective,
)
from fedleak.attacks.observation import Observation, Reconstruction
from fedleak.attacks.optimisers import OPTIMISERS, LBFGSPart, OptimiserPart
from fedleak.attacks.priors import PRIORS, BoundPrior, PriorPart
from fedleak.attacks.registry import AttackConfigError
from fedleak.attacks.restarts import (
    RestartsCosineObjective,
    RestartsUpdateFn,
    batched_replay,
    packed_replay,
)

INITS = ("gaussian", "uniform")
SELECTS = ("total", "objective")
NO_PRIORS = "none"


@dataclass
class ComposedConfig:
    """The options every optimisation attack has; presets add shorthand options."""

    iterations: int = field(default=4800, metadata={"help": "optimiser steps per restart"})
    restarts: int = field(
        default=1, metadata={"help": "independent random inits; the lowest objective wins"}
    )
    objective: str = field(
        default=AUTO,
        metadata={"help": "objective part (cosine, masked-cosine, gaussian[:masked=on|off], "
                          "euclidean), aware: the one modelling the victim's published "
                          "defenses, or auto (with replay=auto): the aware and the blind "
                          "parts, half the iterations each, keeping the reconstruction that "
                          "better explains the update"},
    )
    replay: str = field(
        default=AUTO,
        metadata={"help": "replay part (plain, dp-clipped[:max-norm=C;clipping=flat]), aware: "
                          "the one modelling the published defenses, or auto (see objective)"},
    )
    optimizer: str = field(
        default="",
        metadata={"help": "optimiser part NAME[:k=v;k=v] (signed-adam, adam, sgd, lbfgs); "
                          "empty: the preset's, from its shorthand options"},
    )
    priors: str = field(
        default="",
        metadata={"help": "prior parts NAME[:k=v;k=v] joined by '+' (tv, bn, l2, "
                          "orthogonality, qian, group, box) or none; empty: the preset's, from "
                          "its shorthand options"},
    )
    init: str = field(default="gaussian", metadata={
        "help": "gaussian: N(0,1) in normalised space; uniform: U(0,1) in pixel space"})
    select: str = field(default="total", metadata={
        "help": "pick the restart by total (objective + priors) or objective alone"})
    log_every: int = field(
        default=50, metadata={"help": "report progress (and read the objective) every k steps"}
    )
    vectorised: bool = field(
        default=True,
        metadata={"help": "run the restarts as one batched computation (torch.func.vmap) when "
                          "the model allows it (no BatchNorm); same result per restart"},
    )
    capture: bool = field(
        default=True,
        metadata={"help": "on a GPU, record one iteration as a CUDA graph and replay it "
                          "(falls back to eager with a notice when capture fails)"},
    )

    def __post_init__(self) -> None:
        check_numbers(self, at_least_one=("iterations", "restarts", "log_every"))
        if self.init not in INITS:
            raise ValueError(f"init must be one of {', '.join(INITS)}, got {self.init!r}")
        if self.select not in SELECTS:
            raise ValueError(f"select must be one of {', '.join(SELECTS)}, got {self.select!r}")
        try:
            check_spec(self.objective, "objective")
            check_spec(self.replay, "replay")
            if self.optimizer:
                name, options = parse_part(self.optimizer)
                OPTIMISERS.create(name, options)
            for spec in prior_specs(self.priors):
                PRIORS.create(*parse_part(spec))
        except PartError as err:
            raise ValueError(str(err)) from None


def check_numbers(config: Any, positive: Sequence[str] = (),
                  non_negative: Sequence[str] = (), at_least_one: Sequence[str] = ()) -> None:
    """Refuse shorthand numbers out of range (ValueError naming the option)."""
    for name in positive:
        value = getattr(config, name)
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be positive, got {value}")
    for name in non_negative:
        value = getattr(config, name)
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be >= 0, got {value}")
    for name in at_least_one:
        if getattr(config, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(config, name)}")


def check_source(source: str) -> None:
    """Refuse an unknown BatchNorm statistics source."""
    if source not in SOURCES:
        raise ValueError(f"bn-source must be one of {', '.join(SOURCES)}, got {source!r}")


def prior_specs(priors: str) -> list[str]:
    """``tv:weight=0.01+box`` → [``tv:weight=0.01``, ``box``]; ``none`` → []."""
    if priors.strip() == NO_PRIORS:
        return []
    return [p.strip() for p in priors.split("+") if p.strip()]


def fitting(part: type[Any], options: dict[str, Any]) -> dict[str, Any]:
    """The shorthand ``options`` that part class ``part``'s Config has."""
    names = {f.name for f in fields(part.Config)}
    return {k: v for k, v in options.items() if k in names}


def gaussian_init(shape: tuple[int, ...], seed: int, device: torch.device) -> torch.Tensor:
    """N(0, 1) images in normalised space, drawn on the CPU from ``seed``, moved to ``device``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator).to(device)


def uniform_init(observation: Observation, seed: int, device: torch.device) -> torch.Tensor:
    """U(0, 1) images in pixel space, drawn on the CPU from ``seed``, in normalised space."""
    shape = (observation.num_images, *observation.image_shape)
    pixels = torch.rand(shape, generator=torch.Generator().manual_seed(seed)).to(device)
    mean = torch.as_tensor(observation.mean, dtype=torch.float32, device=device)
    std = torch.as_tensor(observation.std, dtype=torch.float32, device=device)
    return (pixels - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)


def with_epoch_copies(observation: Observation, labels: torch.Tensor, copies: int
                      ) -> tuple[Observation, torch.Tensor]:
    """What the optimiser works on when the replay takes ``copies`` per-epoch copies
    (:mod:`fedleak.attacks.epochs`): the observation with ``copies × n`` images to draw, and
    the labels of every copy (the recovered ones, in the same order in each)."""
    if copies == 1:
        return observation, labels
    return (dataclasses.replace(observation, num_images=copies * observation.num_images),
            labels.repeat(copies))


def alone(observation: Observation) -> RestartsUpdateFn:
    """The observation's own replay in restart form (one restart)."""
    def replay(images: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        return [u.unsqueeze(0) for u in observation.simulate(images[0], y)]

    return replay


def lockstep(one: RestartsUpdateFn) -> RestartsUpdateFn:
    """R restarts replayed one after the other inside one call: ``[R, n, …] → [R, *θ_l]``."""
    def replay(images: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        updates = [one(images[r:r + 1], y) for r in range(images.shape[0])]
        return [torch.cat(parts) for parts in zip(*updates, strict=True)]

    return replay


class ComposedInversion(Attack[Observation]):
    """Eq. (1) of the module docstring with the configured parts (the presets' engine)."""

    Config = ComposedConfig

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

    def shorthand_optimizer(self) -> tuple[str, dict[str, Any]]:
        """The preset's optimiser and the shorthand options it fills in when unset."""
        return "signed-adam", {}

    def shorthand_priors(self) -> list[tuple[str, dict[str, Any]]]:
        """The preset's priors from its shorthand options."""
        return []

    def optimiser_part(self) -> OptimiserPart:
        """The optimiser, built once from the config."""
        return self._optimiser

    def budget(self) -> int:
        """iterations × restarts × the optimiser's evaluations per step (L-BFGS: ``inner``):
        the objective evaluations one target may cost, each a replay and one vector–Jacobian
        product (the priors' cost is not counted)."""
        cfg = self.config
        return cfg.iterations * cfg.restarts * self._optimiser.evaluations_per_step()

    def prior_parts(self) -> list[PriorPart]:
        """The priors, built once from the config."""
        return list(self._priors)

    def _build_optimiser(self) -> OptimiserPart:
        """The optimiser: ``optimizer=`` (its options over the preset's shorthand) or the
        preset's."""
        name, shorthand = self.shorthand_optimizer()
        options: dict[str, Any] = {}
        if self.config.optimizer:
            name, options = parse_part(self.config.optimizer)
        part_class = OPTIMISERS.get(name)
        return OPTIMISERS.create(name, {**fitting(part_class, shorthand), **options})

    def _build_priors(self) -> list[PriorPart]:
        """The priors: ``priors=`` or the preset's shorthand ones."""
        if self.config.priors:
            return [PRIORS.create(*parse_part(spec)) for spec in prior_specs(self.config.priors)]
        return [PRIORS.create(name, options) for name, options in self.shorthand_priors()]

    def parts(self, observation: Observation) -> Parts:
        """The objective and replay parts for ``observation`` (``auto``: from its published
        defenses), checked against it before the first iteration."""
        return choose_parts(observation, self.config.objective, self.config.replay)

    def bind_priors(self, observation: Observation) -> list[BoundPrior]:
        """The priors checked against ``observation`` and bound to it."""
        bound = []
        parts = self.prior_parts()
        if epoch_copies(observation) > 1 and not any(p.name == "epoch" for p in parts):
            parts.append(PRIORS.create("epoch"))  # the copies need tying together
        for part in parts:
            part.check(observation)
            bound.append(part.bind(observation, self.config.restarts))
        return bound

    def initial(self, observation: Observation, seed: int, device: torch.device) -> torch.Tensor:
        """The init x₀ [n, C, H, W] drawn from ``seed``."""
        if self.config.init == "uniform":
            return uniform_init(observation, seed, device)
        return gaussian_init((observation.num_images, *observation.image_shape), seed, device)

    def describe(self, result: Reconstruction, observation: Observation,
                 bound: Sequence[BoundPrior]) -> None:
        """Add what metrics.json records of the parts to ``result.extras``."""
        result.extras.update(optimizer=self.optimiser_part().name,
                             priors=[b.part.name for b in bound])
        for b in bound:
            if b.source is not None:
                result.extras["bn_source"] = b.source

    # ----- one observation -----------------------------------------------------------------

    def recover(
        self,
        observation: Observation,
        *,
        device: torch.device,
        seed: int,
        progress: Progress | None,
    ) -> Reconstruction:
        """Run ``restarts`` × ``iterations`` steps of the optimiser on eq. (1); keep the best
        restart. Restart r starts from ``initial(observation, seed + r)``, drawn on the CPU.
        With the default ``objective=auto``, ``replay=auto`` and a published defense that makes
        the aware parts differ from the blind ones, half the iterations go to each and the
        reconstruction that better explains the update is kept (:meth:`select`)."""
        parts = self.parts(observation)
        if selects(observation, self.config.objective, self.config.replay, parts) and \
                self.config.iterations >= 2:
            return self.select(observation, device=device, seed=seed, progress=progress)
        return self.recover_with(observation, parts, device=device, seed=seed,
                                 progress=progress)

    def select(self, observation: Observation, *, device: torch.device, seed: int,
               progress: Progress | None) -> Reconstruction:
        """The aware parts (⌈T/2⌉ iterations) and the blind ones (⌊T/2⌋), same seed; the
        reconstruction that better explains the observed update under the published mechanism
        wins (:func:`~fedleak.attacks.explained.better`), a tie going to the blind one."""
        runs: dict[str, Reconstruction] = {}
        offset = 0
        for name, clone in self.variants().items():
            torch.manual_seed(seed)
            runs[name] = clone.recover(observation, device=device, seed=seed,
                                       progress=self.shifted(progress, offset))
            offset += clone.config.iterations * clone.config.restarts
        return self.kept(observation, runs["aware"], runs["blind"])

    def variants(self) -> dict[str, ComposedInversion]:
        """The two attacks the default weighs: the aware parts with ⌈T/2⌉ iterations and the
        blind ones with ⌊T/2⌋ (named parts: they do not weigh again)."""
        cfg = self.config
        half = cfg.iterations // 2
        return {"aware": type(self)(dataclasses.replace(
                    cfg, iterations=cfg.iterations - half, objective=AWARE, replay=AWARE)),
                "blind": type(self)(dataclasses.replace(
                    cfg, iterations=half, objective=BLIND[0], replay=BLIND[1]))}

    def shifted(self, progress: Progress | None, offset: int) -> Progress | None:
        """``progress`` of one variant, counted on from ``offset`` out of the whole budget."""
        if progress is None:
            return None
        grand = self.config.iterations * self.config.restarts

        def report(done: int, total: int, value: float) -> None:
            progress(offset + done, grand, value)

        return report

    def kept(self, observation: Observation, aware: Reconstruction, blind: Reconstruction
             ) -> Reconstruction:
        """Of the two variants' reconstructions of ``observation``, the one that explains the
        update better (by more than the criterion's noise, else the blind one), recording
        which and why."""
        cfg = self.config
        judge = mechanism_replay(alone(observation), observation)
        judged = {"aware": explain(observation, aware.images, aware.labels, judge),
                  "blind": explain(observation, blind.images, blind.labels, judge)}
        chosen = "aware" if better(judged["aware"], judged["blind"]) else "blind"
        result, other = (aware, blind) if chosen == "aware" else (blind, aware)
        result.iterations = aware.iterations + blind.iterations
        rule = "|log ρ| (ρ: residual over the published noise, Morozov's discrepancy " \
            "principle)" if judged["aware"].noise_ratio is not None else \
            "log of the residual of the observed update under the published mechanism"
        rule += f", by more than √(2/d) = {math.sqrt(2 / judged['aware'].coordinates):.3g}"
        half = cfg.iterations // 2
        reasons = [str(r) for r in aware.extras.get("part_reasons", [])]
        result.extras.update(
            selected=chosen, aware_discrepancy=judged["aware"].discrepancy(),
            blind_discrepancy=judged["blind"].discrepancy(),
            part_reasons=[*reasons, f"default auto: the aware parts and the blind ones "
                          f"(cosine, plain), {cfg.iterations - half} + {half} iterations; kept "
                          f"the {chosen} reconstruction, which explains the update better by "
                          f"{rule}: aware {judged['aware'].discrepancy():.6g}, blind "
                          f"{judged['blind'].discrepancy():.6g}"])
        result.warnings = sorted({*result.warnings, *other.warnings})
        return result

    def recover_with(self, observation: Observation, parts: Parts, *, device: torch.device,
                     seed: int, progress: Progress | None) -> Reconstruction:
        """:meth:`recover` with the given objective and replay parts."""
        cfg = self.config
        recovered = recover_labels(observation).to(device)
        copies = epoch_copies(observation)
        # shuffled epochs: optimise one copy of the n images per epoch (Dimitrov et al.)
        target, labels = with_epoch_copies(observation, recovered, copies)
        bound = self.bind_priors(target)
        optimiser = self.optimiser_part()
        observed = [u.to(device) for u in observation.update]
        single = parts.objective.build(CosineObjective, observed, observation, rows=False)
        one_by_one = parts.replay.wrap(alone(observation), observation)
        if isinstance(optimiser, LBFGSPart):
            return self._recover_lbfgs(target, optimiser, parts, bound, labels, single,
                                       one_by_one, device, seed, progress, recovered, copies)
        total = cfg.iterations * cfg.restarts
        coupled = any(b.part.coupled for b in bound)
        replay: RestartsUpdateFn | None = None
        if cfg.restarts > 1 and (cfg.vectorised or coupled):
            batched = batched_replay(observation) if cfg.vectorised else None
            if batched is not None:
                replay = parts.replay.wrap(batched, observation)
            elif coupled:
                replay = lockstep(one_by_one)
        notices: list[str | None] = []
        if replay is not None:
            stacked = torch.stack([self.initial(target, s, device)
                                   for s in range(seed, seed + cfg.restarts)])
            batched_objective = parts.objective.build(RestartsCosineObjective, observed,
                                                      observation, rows=True)
            notice, results = self.optimise(stacked, labels, replay, batched_objective, bound,
                                            target.image_bounds(device), rows=True,
                                            offset=0, total=total, progress=progress)
            notices.append(notice)
            candidates = list(results)
        else:
            candidates = []
            for restart in range(cfg.restarts):
                images = self.initial(target, seed + restart, device).unsqueeze(0)
                notice, optimised = self.optimise(
                    images, labels, one_by_one, single, bound, observation.image_bounds(device),
                    rows=False, offset=restart * cfg.iterations, total=total,
                    progress=progress)
                notices.append(notice)
                candidates.append(optimised[0])
        finals = [self.evaluate(c, labels, one_by_one, single, bound) for c in candidates]
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
        if copies > 1:
            result.extras["epoch_copies"] = copies
        self.describe(result, observation, bound)
        return result

    def evaluate(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        replay: RestartsUpdateFn,
        objective: Any,
        bound: Sequence[BoundPrior] = (),
    ) -> float:
        """Eq. (1) at ``images`` [n, C, H, W]: J, plus (``select=total``) every prior at its
        last weight; +inf when not finite."""
        cfg = self.config
        leaf = images.detach().requires_grad_(True)
        value = objective.value(replay(leaf.unsqueeze(0), labels))
        if cfg.select == "total":
            with torch.no_grad():
                for b in bound:
                    weight = b.weight(cfg.iterations - 1, cfg.iterations)
                    if weight > 0 and not b.part.constraint:
                        value = value + weight * b.single(leaf.detach())
        result = float(value.item())
        return result if math.isfinite(result) else math.inf

    def optimise(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        replay: RestartsUpdateFn,
        objective: GradientObjective,
        bound: Sequence[BoundPrior],
        bounds: tuple[torch.Tensor, torch.Tensor],
        *,
        rows: bool,
        offset: int,
        total: int,
        progress: Progress | None,
        graph_safe: bool | None = None,
    ) -> tuple[str | None, torch.Tensor]:
        """The first-order optimiser on ``images`` ``[R, n, C, H, W]``: R restarts side by side.

        Each step replays the update of every restart, takes J's value, cotangent and scale
        from ``objective`` (one scale per restart when ``rows``, else a 0-dim one and R = 1),
        adds each prior's term with cotangent λ/s, takes one vector–Jacobian product back to
        the images, scales each restart's gradient by its s, steps and projects. Progress
        counts restart-iterations from ``offset`` out of ``total``, reporting the lowest value.
        Returns a notice when CUDA capture fell back to eager, and the result per restart (the
        last iterate, or the last with a finite objective when that one is not finite).
        """
        cfg = self.config
        part = self.optimiser_part()
        iterations = cfg.iterations
        width = images.shape[0]
        if graph_safe is None:
            graph_safe = cfg.capture and capturable(images.device)
        terms = [b for b in bound if not b.part.constraint and b.weight(0, iterations) > 0]
        constraints = [b.part for b in bound if b.part.constraint]
        images.requires_grad_(True)
        per_restart = (-1, *[1] * (images.dim() - 1))

        def gradient(weights: Sequence[float | torch.Tensor]
                     ) -> tuple[torch.Tensor, torch.Tensor]:
            return objective_gradient(images, labels, replay, objective, terms, weights, rows)

        def project() -> None:
            for constraint in constraints:
                constraint.project(images, bounds)

        def report(done_steps: int, value: float) -> None:
            if progress is not None:
                progress(offset + done_steps * width, total, value)

        last = images.detach().clone()
        if graph_safe:
            notice = self._optimise_graph_safe(images, part, terms, gradient, project, last,
                                               offset, width, report)
        else:
            notice = None
            stepper = part.eager(images)
            alive = torch.ones(width, dtype=torch.bool, device=images.device)
            for iteration in range(iterations):
                grad, value = gradient([b.weight(iteration, iterations) for b in terms])
                finite = torch.isfinite(value.detach()).reshape(-1).expand(width)
                with torch.no_grad():
                    if not bool(finite.all()):
                        alive &= finite
                        if not bool(alive.any()):
                            break
                    before = None if bool(alive.all()) else images.detach().clone()
                    last.copy_(images)
                    stepper.step(grad, part.rate(iteration, iterations))
                    project()
                    if before is not None:
                        images.copy_(torch.where(alive.view(per_restart), images, before))
                reported = offset // width + iteration + 1
                if reported % cfg.log_every == 0 or iteration == 0:
                    report(iteration + 1, float(value.detach().min().item()))
        images.requires_grad_(False)
        with torch.no_grad():
            finite = torch.isfinite(images).flatten(1).all(1).view(per_restart)
            result = torch.where(finite, images, last)
        return notice, result

    def _optimise_graph_safe(
        self,
        images: torch.Tensor,
        part: OptimiserPart,
        terms: Sequence[BoundPrior],
        gradient: Callable[[Sequence[float | torch.Tensor]], tuple[torch.Tensor, torch.Tensor]],
        project: Callable[[], None],
        last: torch.Tensor,
        offset: int,
        width: int,
        report: Callable[[int, float], None],
    ) -> str | None:
        """The loop with device-side state (step sizes, weights, optimiser, the per-restart
        stop flag), captured as a CUDA graph where possible (:mod:`fedleak.attacks.capture`)."""
        cfg = self.config
        iterations = cfg.iterations
        device, dtype = images.device, images.dtype
        stepper = part.device(images, iterations)
        per_restart = (-1, *[1] * (images.dim() - 1))
        schedules = [torch.tensor([b.weight(i, iterations) for i in range(iterations)],
                                  dtype=dtype, device=device) if b.part.scheduled()
                     else b.weight(0, iterations) for b in terms]
        t = torch.zeros((), dtype=torch.int64, device=device)
        alive = torch.ones(width, dtype=torch.bool, device=device)
        objective = torch.zeros(width, dtype=dtype, device=device)

        def step() -> None:
            weights = [w.index_select(0, t.view(1)).squeeze(0) if isinstance(w, torch.Tensor)
                       else w for w in schedules]
            grad, value = gradient(weights)
            with torch.no_grad():
                alive.logical_and_(torch.isfinite(value.detach()).reshape(-1).expand(width))
                keep = alive.view(per_restart)
                last.copy_(torch.where(keep, images, last))
                objective.copy_(value.detach().reshape(-1).expand(width))
                before = images.detach().clone()
                stepper.step(grad)
                project()
                images.copy_(torch.where(keep, images, before))
                t.add_(1)

        first = offset // width

        def on_step(done: int) -> bool:
            if (first + done) % cfg.log_every != 0 and done != 1:
                return False
            if not bool(alive.any()):
                return True
            report(done, float(objective.masked_fill(~alive, math.inf).min().item()))
            return False

        return run_iterations(step, iterations, device, capture=capturable(device),
                              on_step=on_step)

    # ----- L-BFGS --------------------------------------------------------------------------

    def _recover_lbfgs(
        self,
        observation: Observation,
        optimiser: LBFGSPart,
        parts: Parts,
        bound: Sequence[BoundPrior],
        labels: torch.Tensor,
        single: Any,
        replay: RestartsUpdateFn,
        device: torch.device,
        seed: int,
        progress: Progress | None,
        recovered: torch.Tensor | None = None,
        copies: int = 1,
    ) -> Reconstruction:
        """L-BFGS trials one by one; each keeps the best finite iterate it evaluated
        (``copies`` per-epoch copies of the n images with labels ``recovered``, merged at the
        end)."""
        cfg = self.config
        total = cfg.iterations * cfg.restarts
        graph_safe = cfg.capture and capturable(device)
        finals: list[float] = []
        notices: list[str] = []
        best = BestIterate()
        for restart in range(cfg.restarts):
            trial = self._trial(self.initial(observation, seed + restart, device).unsqueeze(0),
                                labels, replay, single, bound, optimiser,
                                observation.image_bounds(device),
                                offset=restart * cfg.iterations, total=total,
                                progress=progress, graph_safe=graph_safe)
            notices += [trial.notice] if trial.notice else []
            finals.append(trial.value)
            if trial.images is not None and trial.value < best.value:
                best = trial
        images = best.images[0] if best.images is not None else \
            self.initial(observation, seed, device)
        recovered = labels if recovered is None else recovered
        result = Reconstruction(images=merge_epochs(images, recovered, copies),
                                labels=recovered, objective=best.value,
                                iterations=total, restart_objectives=finals,
                                warnings=sorted(set(notices)),
                                extras={"captured": graph_safe and not notices,
                                        **parts.describe()})
        self.describe(result, observation, bound)
        return result

    def _trial(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        replay: RestartsUpdateFn,
        objective: Any,
        bound: Sequence[BoundPrior],
        optimiser_part: LBFGSPart,
        bounds: tuple[torch.Tensor, torch.Tensor],
        *,
        offset: int,
        total: int,
        progress: Progress | None,
        graph_safe: bool = False,
    ) -> BestIterate:
        cfg = self.config
        images.requires_grad_(True)
        optimiser = optimiser_part.optimizer(images)
        terms = [b for b in bound if not b.part.constraint and b.weight(0, 1) > 0]
        constraints = [b.part for b in bound if b.part.constraint]
        weights = [b.weight(0, 1) for b in terms]
        best = BestIterate()
        value_buffer = torch.zeros((), dtype=images.dtype, device=images.device)
        gradient = torch.zeros_like(images)

        def evaluate() -> None:
            """Objective and gradient at the current images, into static buffers."""
            grad, value = objective_gradient(images, labels, replay, objective, terms, weights,
                                             rows=False)
            with torch.no_grad():
                value_buffer.copy_(value.reshape(()))
                gradient.copy_(grad)

        if graph_safe:
            evaluate, best.notice = captured_function(evaluate, images.device)

        images.grad = gradient  # L-BFGS copies it out (torch.cat) at every evaluation

        def closure() -> torch.Tensor:
            evaluate()
            loss = value_buffer.clone()  # L-BFGS returns its first loss after later evaluations
            best.offer(float(loss.item()), images)
            return loss

        for iteration in range(cfg.iterations):
            loss = optimiser.step(closure)
            if constraints:
                with torch.no_grad():
                    for constraint in constraints:
                        constraint.project(images, bounds)
            value = float(loss.item())
            done = offset + iteration + 1
            if progress is not None and (done % cfg.log_every == 0 or iteration == 0):
                progress(done, total, value)
            if not math.isfinite(value) or not bool(torch.isfinite(images).all()):
                break
        images.requires_grad_(False)
        return best

    # ----- several observations ------------------------------------------------------------

    def select_many(self, targets: Sequence[Observation], weighing: Sequence[bool], *,
                    device: torch.device, seeds: Sequence[int],
                    progress: Progress | None) -> list[Reconstruction]:
        """:meth:`select` for the ``weighing`` targets, each variant packed over them (as
        :meth:`recover_many` packs), the others attacked packed at the full budget: every
        target gets what it gets alone, up to float rounding."""
        results: list[Reconstruction | None] = [None] * len(targets)
        plain = [i for i, w in enumerate(weighing) if not w]
        if plain:
            for i, r in zip(plain, self.recover_many(
                    [targets[i] for i in plain], device=device, seeds=[seeds[i] for i in plain],
                    progress=progress), strict=True):
                results[i] = r
        chosen = [i for i, w in enumerate(weighing) if w]
        runs: dict[str, list[Reconstruction]] = {}
        offset = 0
        for name, clone in self.variants().items():
            runs[name] = clone.recover_many([targets[i] for i in chosen], device=device,
                                            seeds=[seeds[i] for i in chosen],
                                            progress=self.shifted(progress, offset))
            offset += clone.config.iterations * clone.config.restarts * len(chosen)
        for k, i in enumerate(chosen):
            results[i] = self.kept(targets[i], runs["aware"][k], runs["blind"][k])
        return [r for r in results if r is not None]

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
        them and each row is optimised against its own observed update at its own θ_p (per-row
        objective, the harness's packed replay), so every observation gets the result it would
        get alone, up to float rounding. Falls back to one after the other when the
        observations cannot be packed (different architectures or protocols, ``vectorised``
        off, L-BFGS, the ``dp-clipped`` replay, or a prior that is per observation or couples
        restarts: ``bn``, ``group``, ``l2``, ``orthogonality``, ``qian``). Objectives that are a
        diagonal of eq. (1) of :mod:`fedleak.attacks.objectives` are built per row at once;
        any other (a hinge, a data-term weight, the euclidean distance) per observation, as
        row blocks (:class:`BlockObjective`).
        """
        cfg = self.config
        parts = [self.parts(o) for o in targets]
        weighing = [selects(o, cfg.objective, cfg.replay, p) and cfg.iterations >= 2
                    for o, p in zip(targets, parts, strict=True)]
        if any(weighing):
            return self.select_many(targets, weighing, device=device, seeds=seeds,
                                    progress=progress)
        packed = packed_replay(targets) if cfg.vectorised and len(targets) > 1 else None
        priors = self.prior_parts()
        if packed is None or len({(o.num_images, o.image_shape) for o in targets}) > 1 or \
                any(epoch_copies(o) > 1 for o in targets) or \
                not all(p.replay.packable for p in parts) or \
                not all(p.packable for p in priors) or \
                not self.optimiser_part().first_order:
            return super().recover_many(targets, device=device, seeds=seeds, progress=progress)
        first = targets[0]
        bound = [p.bind(first, cfg.restarts) for p in priors]
        count, restarts = len(targets), cfg.restarts
        labels = torch.stack([recover_labels(o).to(device) for o in targets])
        shape = (first.num_images, *first.image_shape)
        images = torch.stack([
            torch.stack([self.initial(o, s, device) for s in range(seeds[p], seeds[p] + restarts)])
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

        notice, flat = self.optimise(flat, labels, replay, objective, bound,
                                     first.image_bounds(device), rows=True, offset=0,
                                     total=count * restarts * cfg.iterations, progress=progress)
        images = flat.view(count, restarts, *shape)
        results = []
        for p, observation in enumerate(targets):
            single = parts[p].objective.build(CosineObjective,
                                              [u.to(device) for u in observation.update],
                                              observation, rows=False)
            finals = [self.evaluate(candidate, labels[p], alone(observation), single, bound)
                      for candidate in images[p]]
            best = min(range(len(finals)), key=finals.__getitem__)
            result = Reconstruction(
                images=images[p, best].detach().clone(), labels=labels[p].detach(),
                objective=finals[best], iterations=cfg.iterations * restarts,
                restart_objectives=finals,
                extras={"vectorised_restarts": True, "packed_with": count,
                        "captured": capturable(device) and cfg.capture and not notice,
                        **parts[p].describe()},
                warnings=[notice] if notice else [])
            self.describe(result, observation, bound)
            results.append(result)
        return results


def objective_gradient(
    images: torch.Tensor,
    labels: torch.Tensor,
    replay: RestartsUpdateFn,
    objective: Any,
    terms: Sequence[BoundPrior],
    weights: Sequence[float | torch.Tensor],
    rows: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (1)'s value and its gradient with respect to ``images`` [R, n, C, H, W].

    The objective gives J, its cotangent g and scale s (∂J/∂u = s g); each prior adds λ R with
    cotangent λ / s; one vector–Jacobian product (∂/∂x only: ``backward`` would also fill the
    replay parameters' ``.grad``), multiplied by each restart's s, is the whole gradient.
    ``rows``: priors per restart ([R]), else on the one restart (0-dim).
    """
    update = replay(images, labels)
    value, output_grads, scale = objective.value_and_output_grads(update)
    outputs = list(update)
    for b, weight in zip(terms, weights, strict=True):
        term = b.rows(images) if rows else b.single(images[0])
        value = value + term.detach() * weight
        outputs.append(term)
        output_grads.append(weight / scale)
    (grad,) = torch.autograd.grad(outputs, images, output_grads)
    return grad.mul_(scale.view(-1, *[1] * (images.dim() - 1))), value


class BlockObjective:
    """A packed batch's objective as row blocks: rows p·R … p·R + R − 1 are compared by
    observation p's own objective (any part: hinges, data-term weights, the euclidean
    distance), and the values, cotangents and scales are concatenated back."""

    def __init__(self, blocks: Sequence[Any], rows: int) -> None:
        self.blocks = list(blocks)
        self.rows = rows

    def value_and_output_grads(
        self, candidate: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
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


class BestIterate:
    """The lowest finite objective seen so far and the images that produced it."""

    def __init__(self) -> None:
        self.value = math.inf
        self.images: torch.Tensor | None = None
        self.notice: str | None = None

    def offer(self, value: float, images: torch.Tensor) -> None:
        if math.isfinite(value) and value < self.value and bool(torch.isfinite(images).all()):
            self.value = value
            self.images = images.detach().clone()


def check_closure(priors: Sequence[PriorPart]) -> None:
    """L-BFGS assumes one fixed objective: refuse priors that change with the iteration or
    couple restarts."""
    for prior in priors:
        if prior.scheduled() or prior.coupled:
            raise PartError(f"prior {prior.name!r} changes with the iteration or couples "
                            "restarts, which L-BFGS (one fixed objective per restart) cannot "
                            "take; use a first-order optimizer (adam, sgd, signed-adam)"
                            + (" or decay=1" if prior.scheduled() else ""))


def packed_objective(
    targets: Sequence[Observation],
    parts: Sequence[Parts],
    observed: list[torch.Tensor],
    restarts: int,
    device: torch.device,
) -> RestartsCosineObjective | WeightedObjective:
    """The per-row objective of a packed attack: row p·R + r compares with observation p's
    update through observation p's own objective part (its own D of eq. (1) in
    :mod:`fedleak.attacks.objectives`); the plain per-row cosine when every D is 1."""
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
