"""Inverting Gradients (Geiping et al., NeurIPS 2020): cosine gradient matching with signed Adam.

The attack solves eq. (4) of the paper (eq. (2) of its supplement for FedAvg updates),

    x̂ = argmin_{x ∈ [0,1]^n}  1 − ⟨u(x, ŷ), u*⟩ / (‖u(x, ŷ)‖ ‖u*‖)  +  α TV(x),

where ``u*`` is the observed update (FedSGD: ∇_θ L(x*, y); FedAvg: the parameter delta) and
``u(x, ŷ)`` the user's update replayed on candidate images (``observation.simulate``), both
taken over the *whole* parameter vector (all layers concatenated). TV is the anisotropic total
variation of the authors' code: the mean absolute difference of horizontally plus vertically
adjacent pixels. The box [0, 1] is, in the normalised space the attack works in,
[(0 − mean)/std, (1 − mean)/std] per channel.

Optimisation, as in the paper (Sec. 4), its supplement (Sec. C) and the authors' code:
Gaussian N(0, 1) init in normalised space (not projected: the projection follows each step);
Adam (β = (0.9, 0.999), ε = 1e-8) fed the *sign* of the objective's gradient; step size ``lr``
(0.1) multiplied by 0.1 from iterations ⌊3T/8⌋, ⌊5T/8⌋ and ⌊7T/8⌋ on (``MultiStepLR`` stepped
once per iteration); after every step the images are projected onto the box. Each restart ends
with eq. (4) evaluated once more at its last iterate; the restart with the lowest value wins.
Labels come from :func:`fedleak.attacks.labels.recover_labels`. With ``vectorised`` (default)
and a replay that offers it (models without BatchNorm), the R restarts run as one batched
computation with the same result per restart (:mod:`fedleak.attacks.restarts`).

How one iteration is computed (the speed of the attack is the speed of this loop): the outer
gradient is formed analytically rather than by autograd through a concatenated vector. With
``a = ⟨u, u*⟩``, ``b = ‖u‖²`` and ``c = ‖u*‖`` (precomputed once), the cosine term is
``1 − a / (√b c)`` and

    ∂/∂u [1 − a/(√b c)] = −u*/(√b c) + a·u/(b^{3/2} c) = s · (u* − (a/b) u),  s = −1/(√b c),

so one vector–Jacobian product ``s · autograd.grad(u + [TV], x, [u* − (a/b) u, α/s])`` gives
the whole gradient with respect to the images: the same maths as autograd on eq. (4), without
the multi-megabyte temporaries of a concatenated copy (the cotangent is written into the
replayed update's own memory in one pass). Adam's moments are two image-sized tensors updated
in place; the objective is read back to the host only when progress is reported.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from fedleak.attacks.adaptive import AUTO, Parts, check_spec, choose_parts
from fedleak.attacks.base import Attack, Progress
from fedleak.attacks.batch_statistics import SOURCES, batch_norm_prior, target_statistics
from fedleak.attacks.capture import DeviceSignedAdam, capturable, run_iterations
from fedleak.attacks.labels import recover_labels
from fedleak.attacks.objectives import (
    GradientObjective,
    PartError,
    WeightedObjective,
    build_objective,
)
from fedleak.attacks.observation import Observation, Reconstruction
from fedleak.attacks.registry import register_attack
from fedleak.attacks.restarts import (
    RestartsCosineObjective,
    RestartsUpdateFn,
    batched_replay,
    packed_replay,
    restart_total_variation,
    stacked_inits,
)

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
DECAY_FRACTIONS = (3 / 8, 5 / 8, 7 / 8)
DECAY_FACTOR = 0.1


@dataclass
class InvertingGradientsConfig:
    """Hyperparameters of Inverting Gradients; defaults are the paper's LeNet/ResNet setting."""

    iterations: int = field(
        default=4800, metadata={"help": "signed-Adam steps per restart (paper: 4800 or 24000)"}
    )
    restarts: int = field(
        default=1, metadata={"help": "independent random inits; the lowest objective wins"}
    )
    lr: float = field(
        default=0.1, metadata={"help": "Adam step size, decayed x0.1 at 3/8, 5/8, 7/8"}
    )
    tv: float = field(default=1e-2, metadata={"help": "total-variation weight alpha of eq. (4)"})
    signed: bool = field(
        default=True, metadata={"help": "feed Adam the sign of the gradient (paper: true)"}
    )
    boxed: bool = field(
        default=True, metadata={"help": "project images onto [0, 1] after every step"}
    )
    lr_decay: bool = field(
        default=True, metadata={"help": "multiply lr by 0.1 at 3/8, 5/8, 7/8 of the iterations"}
    )
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
    objective: str = field(
        default=AUTO,
        metadata={"help": "objective part (cosine, masked-cosine, gaussian[:masked=on|off]) or "
                          "auto: the one modelling the victim's published defenses"},
    )
    bn: float = field(
        default=0.0,
        metadata={"help": "weight of the BatchNorm-statistics prior (Yin et al. 2021); needs a "
                          "model with BatchNorm; 0: off. Runs the restarts one by one"},
    )
    bn_source: str = field(
        default="auto",
        metadata={"help": "statistics the prior pulls towards: returned (inferred from the "
                          "buffers the user sent), global (the global model's running "
                          "statistics) or auto (returned when sent, else global)"},
    )
    replay: str = field(
        default=AUTO,
        metadata={"help": "replay part (plain, dp-clipped[:max-norm=C;clipping=flat]) or auto: "
                          "the one modelling the published defenses"},
    )

    def __post_init__(self) -> None:
        for name in ("iterations", "restarts", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not (self.tv >= 0 and math.isfinite(self.tv)):
            raise ValueError(f"tv must be >= 0, got {self.tv}")
        if not (self.bn >= 0 and math.isfinite(self.bn)):
            raise ValueError(f"bn must be >= 0, got {self.bn}")
        if self.bn_source not in SOURCES:
            raise ValueError(f"bn-source must be one of {', '.join(SOURCES)}, got "
                             f"{self.bn_source!r}")
        try:
            check_spec(self.objective, "objective")
            check_spec(self.replay, "replay")
        except PartError as err:
            raise ValueError(str(err)) from None


def total_variation(images: torch.Tensor) -> torch.Tensor:
    """Anisotropic TV of the authors' code: mean |horizontal| plus mean |vertical| differences.

    ``TV(x) = mean |x[..., :, 1:] − x[..., :, :-1]| + mean |x[..., 1:, :] − x[..., :-1, :]|``.
    """
    dx = (images[:, :, :, 1:] - images[:, :, :, :-1]).abs().mean()
    dy = (images[:, :, 1:, :] - images[:, :, :-1, :]).abs().mean()
    return dx + dy


def decay_milestones(iterations: int) -> tuple[int, ...]:
    """Iterations (0-based) from which the step size is decayed: ⌊3T/8⌋, ⌊5T/8⌋, ⌊7T/8⌋."""
    return tuple(int(iterations * f) for f in DECAY_FRACTIONS)


def step_size(iteration: int, iterations: int, lr: float, decay: bool = True) -> float:
    """Step size used at ``iteration`` (0-based), as ``MultiStepLR`` stepped once per iteration."""
    if not decay:
        return lr
    passed = sum(iteration >= m for m in decay_milestones(iterations))
    return lr * DECAY_FACTOR**passed


class CosineObjective:
    """``1 − cos(u, u*)`` over the whole update (eq. 4) with its gradient with respect to ``u``.

    ``u*`` is fixed for the whole attack: its squared norm is computed once.
    """

    def __init__(self, observed: Sequence[torch.Tensor]) -> None:
        self.observed = [t.detach() for t in observed]
        squares = torch.stack([t.double().square().sum() for t in self.observed]).sum()
        self.observed_norm = squares.sqrt().to(self.observed[0].dtype)

    def dots(self, candidate: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``a = ⟨u, u*⟩`` and ``b = ‖u‖²`` (0-dim tensors, no synchronisation).

        Both per tensor, one right after the other, so the second read of ``u_l`` hits the cache.
        """
        cross, square = [], []
        for u, o in zip(candidate, self.observed, strict=True):
            flat = u.reshape(-1)
            cross.append(torch.vdot(flat, o.reshape(-1)))
            square.append(torch.vdot(flat, flat))
        return torch.stack(cross).sum(), torch.stack(square).sum()

    def value(self, candidate: Sequence[torch.Tensor]) -> torch.Tensor:
        """``1 − a / (√b ‖u*‖)``."""
        a, b = self.dots([u.detach() for u in candidate])
        return 1 - a / (b.sqrt() * self.observed_norm)

    def value_and_output_grads(
        self, candidate: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """The objective and its gradient with respect to ``u`` as ``scale · g`` (c = ‖u*‖):

            ∂/∂u = −u*/(√b c) + a u/(b^{3/2} c) = scale · g,  scale = −1/(√b c),  g = u* − (a/b) u.

        ``g`` is written into the memory of ``candidate`` in one pass (the replayed update is
        consumed: it is used once), so no update-sized tensor is allocated per iteration.
        """
        detached = [u.detach() for u in candidate]
        a, b = self.dots(detached)
        root_b = b.sqrt()
        value = 1 - a / (root_b * self.observed_norm)
        scale = -1 / (root_b * self.observed_norm)
        ratio = -a / b
        for u, o in zip(detached, self.observed, strict=True):
            torch.addcmul(o, u, ratio, out=u)
        return value, detached, scale


class SignedAdam:
    """Adam on one tensor, fed ``sign(∇)``: in-place, identical to ``torch.optim.Adam`` maths.

    ``m ← β₁m + (1−β₁)s``, ``v ← β₂v + (1−β₂)s²``, ``x ← x − lr/(1−β₁ᵗ) · m/(√v/√(1−β₂ᵗ) + ε)``
    with ``s = sign(∇)`` (or ``∇`` when not ``signed``).
    """

    def __init__(self, images: torch.Tensor, signed: bool = True) -> None:
        self.images = images
        self.signed = signed
        self.m = torch.zeros_like(images)
        self.v = torch.zeros_like(images)
        self.t = 0

    def step(self, grad: torch.Tensor, lr: float) -> None:
        """One update of ``images`` in place; ``grad`` is overwritten."""
        beta1, beta2 = ADAM_BETAS
        self.t += 1
        s = grad.sign_() if self.signed else grad
        self.m.lerp_(s, 1 - beta1)
        self.v.mul_(beta2).addcmul_(s, s, value=1 - beta2)
        bias1 = 1 - beta1**self.t
        bias2 = 1 - beta2**self.t
        denom = (self.v.sqrt() / math.sqrt(bias2)).add_(ADAM_EPS)
        self.images.addcdiv_(self.m, denom, value=-lr / bias1)


@register_attack("inverting-gradients")
class InvertingGradients(Attack[Observation]):
    """Geiping et al.'s attack: cosine similarity + TV, signed Adam, box constraint (eq. 4)."""

    Config = InvertingGradientsConfig
    config: InvertingGradientsConfig

    def recover(
        self,
        observation: Observation,
        *,
        device: torch.device,
        seed: int,
        progress: Progress | None,
    ) -> Reconstruction:
        """Run ``restarts`` × ``iterations`` signed-Adam steps on eq. (4); keep the best restart.

        The random init is drawn on the CPU from ``seed`` (restart r uses ``seed + r``), so a
        seed gives the same starting images on every device. With ``vectorised`` and a replay
        that offers it, the restarts are optimised as one batch ``[R, n, C, H, W]``; otherwise
        one after the other, each as a batch of one — the same loop either way.
        """
        cfg = self.config
        parts = self.parts(observation)
        prior, source = self.batch_norm_prior(observation)
        labels = recover_labels(observation).to(device)
        observed = [u.to(device) for u in observation.update]
        objective = build_objective(parts.objective, CosineObjective, observed, observation)
        bounds = observation.image_bounds(device)
        shape = (observation.num_images, *observation.image_shape)
        total = cfg.iterations * cfg.restarts
        replay = batched_replay(observation) if cfg.vectorised and cfg.restarts > 1 \
            and prior is None else None
        one_by_one = parts.replay.wrap(alone(observation), observation)
        notices: list[str | None] = []
        if replay is not None:
            stacked = stacked_inits(gaussian_init, shape, range(seed, seed + cfg.restarts),
                                    device)
            batched = build_objective(parts.objective, RestartsCosineObjective, observed,
                                      observation)
            notices.append(self.optimise(stacked, labels, parts.replay.wrap(replay, observation),
                                         batched, restart_total_variation, bounds, offset=0,
                                         total=total, progress=progress))
            candidates = list(stacked)
        else:
            candidates = []
            for restart in range(cfg.restarts):
                images = gaussian_init(shape, seed + restart, device).unsqueeze(0)
                notices.append(self.optimise(images, labels, one_by_one, objective,
                                             lambda x: total_variation(x[0]), bounds,
                                             offset=restart * cfg.iterations, total=total,
                                             progress=progress, prior=prior))
                candidates.append(images[0])
        finals = [self.evaluate(images, labels, one_by_one, objective, prior)
                  for images in candidates]
        best = min(range(len(finals)), key=finals.__getitem__)
        return Reconstruction(
            images=candidates[best].detach(),
            labels=labels.detach(),
            objective=finals[best],
            iterations=total,
            restart_objectives=finals,
            extras={"vectorised_restarts": replay is not None,
                    "captured": capturable(device) and cfg.capture and not any(notices),
                    **parts.describe(), **({"bn_source": source} if source else {})},
            warnings=sorted({n for n in notices if n}),
        )

    def batch_norm_prior(self, observation: Observation
                         ) -> tuple[Callable[[torch.Tensor], torch.Tensor] | None, str | None]:
        """The BatchNorm-statistics prior R_BN and its source when ``bn`` > 0
        (:mod:`fedleak.attacks.batch_statistics`), refused before the first iteration when
        the model has no BatchNorm or the asked-for statistics are missing."""
        if self.config.bn == 0:
            return None, None
        targets, source = target_statistics(observation, self.config.bn_source)
        return batch_norm_prior(observation, targets), source

    def parts(self, observation: Observation) -> Parts:
        """The objective and replay parts for ``observation`` (``auto``: from its published
        defenses), checked against it before the first iteration."""
        return choose_parts(observation, self.config.objective, self.config.replay)

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
        them and each row is optimised against its own observed update at its own θ_p
        (:class:`~fedleak.attacks.restarts.RestartsCosineObjective` per row, the harness's
        packed replay), so every observation gets the result it would get alone, up to float
        rounding. Falls back to one after the other when the observations cannot be packed
        (training-mode BatchNorm, different architectures or protocols, ``vectorised`` off).
        """
        cfg = self.config
        parts = [self.parts(o) for o in targets]
        packed = packed_replay(targets) if cfg.vectorised and len(targets) > 1 else None
        if packed is None or len({(o.num_images, o.image_shape) for o in targets}) > 1 or \
                not all(p.replay.packable for p in parts) or cfg.bn > 0:
            return super().recover_many(targets, device=device, seeds=seeds, progress=progress)
        first = targets[0]
        count, restarts = len(targets), cfg.restarts
        labels = torch.stack([recover_labels(o).to(device) for o in targets])
        shape = (first.num_images, *first.image_shape)
        images = torch.stack([
            stacked_inits(gaussian_init, shape, range(seeds[p], seeds[p] + restarts), device)
            for p in range(count)])
        flat = images.view(count * restarts, *shape)
        observed = [torch.stack([o.update[i].to(device) for o in targets])
                    .repeat_interleave(restarts, dim=0) for i in range(len(first.update))]
        objective = packed_objective(targets, parts, observed, restarts, device)

        def replay(x: torch.Tensor, _: torch.Tensor) -> list[torch.Tensor]:
            updates = packed(x.view(count, restarts, *shape), labels)
            return [u.reshape(count * restarts, *u.shape[2:]) for u in updates]

        notice = self.optimise(flat, labels, replay, objective, restart_total_variation,
                               first.image_bounds(device), offset=0,
                               total=count * restarts * cfg.iterations, progress=progress)
        results = []
        for p, observation in enumerate(targets):
            single = build_objective(parts[p].objective, CosineObjective,
                                     [u.to(device) for u in observation.update], observation)
            finals = [self.evaluate(candidate, labels[p], alone(observation), single)
                      for candidate in images[p]]
            best = min(range(len(finals)), key=finals.__getitem__)
            results.append(Reconstruction(
                images=images[p, best].detach().clone(), labels=labels[p].detach(),
                objective=finals[best], iterations=cfg.iterations * restarts,
                restart_objectives=finals,
                extras={"vectorised_restarts": True, "packed_with": count,
                        "captured": capturable(device) and cfg.capture and not notice,
                        **parts[p].describe()},
                warnings=[notice] if notice else []))
        return results

    def evaluate(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        replay: RestartsUpdateFn,
        objective: CosineObjective | WeightedObjective,
        prior: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> float:
        """Eq. (4) at ``images`` (the objective part's term plus α TV, plus ``bn`` R_BN when a
        prior is given; ``replay`` in restart form, called on one restart); +inf when not
        finite."""
        leaf = images.detach().requires_grad_(True)
        value = objective.value(replay(leaf.unsqueeze(0), labels))
        if prior is not None:
            with torch.no_grad():
                value = value + self.config.bn * prior(leaf.detach())
        value = value + self.config.tv * total_variation(leaf.detach())
        result = float(value.item())
        return result if math.isfinite(result) else math.inf

    def optimise(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        replay: RestartsUpdateFn,
        objective: GradientObjective,
        tv: Callable[[torch.Tensor], torch.Tensor],
        bounds: tuple[torch.Tensor, torch.Tensor],
        *,
        offset: int,
        total: int,
        progress: Progress | None,
        graph_safe: bool | None = None,
        prior: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> str | None:
        """Signed Adam on ``images`` ``[R, n, C, H, W]`` in place: R restarts side by side.

        Each step replays the update of every restart (``replay``), forms the cosine term's
        gradient with respect to the updates as ``s_r · (u* − (a_r/b_r) u_r)`` (``objective``,
        one scale per restart; a 0-dim scale when R restarts are one), adds α TV, takes one
        vector–Jacobian product back to the images, scales each restart's gradient by its own
        ``s_r``, steps signed Adam at the shared step size and projects onto the box. See
        :mod:`fedleak.attacks.restarts` for why the restarts stay independent. Progress counts
        restart-iterations from ``offset`` out of ``total`` and reports the lowest objective.

        On a GPU (``graph_safe`` None: when ``capture`` is on and CUDA is there) the step keeps
        all its state on the device and one step is captured as a CUDA graph
        (:mod:`fedleak.attacks.capture`); returns a notice when capture fell back to eager.
        """
        cfg = self.config
        width = images.shape[0]
        if graph_safe is None:
            graph_safe = cfg.capture and capturable(images.device)
        images.requires_grad_(True)
        per_restart = (-1, *[1] * (images.dim() - 1))

        def gradient() -> tuple[torch.Tensor, torch.Tensor]:
            update = replay(images, labels)
            value, output_grads, scale = objective.value_and_output_grads(update)
            outputs = list(update)
            if cfg.tv > 0:
                variation = tv(images)
                value = value + variation.detach() * cfg.tv
                outputs.append(variation)
                output_grads.append(cfg.tv / scale)
            if prior is not None:  # one restart at a time: images [1, n, C, H, W]
                statistics = prior(images[0])
                value = value + statistics.detach() * cfg.bn
                outputs.append(statistics)
                output_grads.append(cfg.bn / scale)
            (grad,) = torch.autograd.grad(outputs, images, output_grads)
            return grad.mul_(scale.view(per_restart)), value

        def report(done_steps: int, value: float) -> None:
            if progress is not None:
                progress(offset + done_steps * width, total, value)

        notice = None
        if graph_safe:
            notice = self._optimise_graph_safe(images, gradient, bounds, offset, width, report)
        else:
            optimiser = SignedAdam(images, signed=cfg.signed)
            for iteration in range(cfg.iterations):
                grad, value = gradient()
                with torch.no_grad():
                    optimiser.step(grad, step_size(iteration, cfg.iterations, cfg.lr,
                                                   cfg.lr_decay))
                    if cfg.boxed:
                        images.clamp_(bounds[0], bounds[1])
                reported = offset // width + iteration + 1
                if reported % cfg.log_every == 0 or iteration == 0:
                    report(iteration + 1, float(value.min().item()))
        images.requires_grad_(False)
        return notice

    def _optimise_graph_safe(
        self,
        images: torch.Tensor,
        gradient: Callable[[], tuple[torch.Tensor, torch.Tensor]],
        bounds: tuple[torch.Tensor, torch.Tensor],
        offset: int,
        width: int,
        report: Callable[[int, float], None],
    ) -> str | None:
        """The loop with device-side state, captured as a CUDA graph where possible."""
        cfg = self.config
        schedule = torch.tensor([step_size(i, cfg.iterations, cfg.lr, cfg.lr_decay)
                                 for i in range(cfg.iterations)], dtype=torch.float64)
        optimiser = DeviceSignedAdam(images, schedule, signed=cfg.signed)
        objective = torch.zeros(width, device=images.device)

        def step() -> None:
            grad, value = gradient()
            with torch.no_grad():
                optimiser.step(grad)
                if cfg.boxed:
                    images.clamp_(bounds[0], bounds[1])
                objective.copy_(value.detach().reshape(-1).expand(width))

        first = offset // width

        def on_step(done: int) -> None:
            if (first + done) % cfg.log_every == 0 or done == 1:
                report(done, float(objective.min().item()))

        return run_iterations(step, cfg.iterations, images.device,
                              capture=capturable(images.device), on_step=on_step)


def alone(observation: Observation) -> RestartsUpdateFn:
    """The observation's own replay in restart form (one restart)."""
    def replay(images: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        return [u.unsqueeze(0) for u in observation.simulate(images[0], y)]

    return replay


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


def gaussian_init(shape: tuple[int, ...], seed: int, device: torch.device) -> torch.Tensor:
    """N(0, 1) images in normalised space, drawn on the CPU from ``seed``, moved to ``device``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator).to(device)
