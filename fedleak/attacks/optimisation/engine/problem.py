"""The problem an inversion loop solves, frozen.

Eq. (1) of :mod:`fedleak.attacks.optimisation.composed`.

For R candidate batches side by side, ``X = [x_1; …; x_R]`` (``[R, n, C, H, W]``), every loop
(:mod:`~fedleak.attacks.optimisation.engine.eager`,
:mod:`~fedleak.attacks.optimisation.engine.captured`,
:mod:`~fedleak.attacks.optimisation.engine.lbfgs`) minimises, for each restart r on its own,

    F(x_r) = J(u(x_r, ŷ), u*) + Σ_k λ_k(i) R_k(x_r),    x_r in the box,

and needs for it only what an :class:`InversionProblem` holds: the labels ŷ, the replay u in
restart form (:data:`~fedleak.attacks.optimisation.restarts.RestartsUpdateFn`), the objective J
(:class:`~fedleak.attacks.optimisation.gradient_matching.GradientObjective`), the *priors* R_k bound
to the observation with their weights λ_k(i) (the constraint priors project instead), the pixel
*box* [(0 − mean)/std, (1 − mean)/std] per channel in normalised space, the optimiser, T
iterations and how often to report. Where its iterations fall in the attack's whole budget,
for progress reports, is a :class:`ProgressSpan`.

The gradient (:meth:`InversionProblem.value_and_gradient`): J returns its value, a cotangent g
and a scale s with ∂J/∂u = s·g; each prior adds λ_k R_k with cotangent λ_k / s; one
vector–Jacobian product back to X, multiplied by each restart's s, is the whole gradient,

    ∇_{x_r} F = s_r (∂u/∂x_r)ᵀ g_r + Σ_k λ_k ∇R_k(x_r).

``rows``: J and the priors give one value per restart ([R]); otherwise R = 1 and they are
0-dim (the priors evaluated on the one batch).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from fedleak.attacks.base import Progress
from fedleak.attacks.optimisation.gradient_matching import GradientObjective
from fedleak.attacks.optimisation.optimisers import OptimiserPart
from fedleak.attacks.optimisation.priors import BoundPrior
from fedleak.attacks.replay_contract import RestartsUpdateFn

#: a prior's weight λ at one iteration: a number, or (captured loop) a device tensor
Weight = float | torch.Tensor
#: F's value and ∇F at the images, for the prior weights of one iteration (a compiled step)
GradientFn = Callable[[torch.Tensor, Sequence[Weight]], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class InversionProblem:
    """Eq. (1) for one set of candidates: everything an inversion loop reads."""

    #: ŷ: ``[n]`` (packed observations: ``[P, n]``, read by the packed replay)
    labels: torch.Tensor
    #: u(X, ŷ): ``[R, n, C, H, W]`` → one ``[R, *θ_l.shape]`` tensor per parameter
    replay: RestartsUpdateFn
    #: J, its cotangent g and scale s (∂J/∂u = s·g), one per restart when ``rows``
    objective: GradientObjective
    #: the priors R_k bound to the observation, the constraint priors among them
    priors: tuple[BoundPrior, ...]
    #: the pixel box (lower, upper) in normalised space, per channel
    box: tuple[torch.Tensor, torch.Tensor]
    #: the optimiser part (first order, or L-BFGS through a closure)
    optimiser: OptimiserPart
    #: T, optimiser steps per restart
    iterations: int
    #: report progress (and read the objective back) every ``log_every`` steps
    log_every: int
    #: J and the priors per restart ([R]); False: one restart, 0-dim values
    rows: bool
    #: a revision of the replay between iterations: ``revise(images)`` runs (outside any
    #: gradient) before each iteration in ``revise_at`` — the modelled visiting order of a
    #: shuffling user (:mod:`fedleak.attacks.optimisation.fedavg.batch_order`); None: the replay is
    #: fixed
    revise: Callable[[torch.Tensor], None] | None = None
    revise_at: tuple[int, ...] = ()
    #: the observed update's size (coordinates of u*), read to choose the convolution kernels
    #: (:mod:`~fedleak.attacks.optimisation.engine.convolutions`); 0: not known
    coordinates: int = 0

    def revision(self, iteration: int, images: torch.Tensor) -> None:
        """Run :attr:`revise` on ``images`` when ``iteration`` is one of :attr:`revise_at`."""
        if self.revise is not None and iteration in self.revise_at:
            self.revise(images.detach())

    def terms(self, iterations: int | None = None) -> list[BoundPrior]:
        """Return the priors that are terms of F.

        Not constraints, with λ(0) > 0 over ``iterations`` (default T).
        """
        total = self.iterations if iterations is None else iterations
        return [b for b in self.priors if not b.part.constraint and b.weight(0, total) > 0]

    def project(self, images: torch.Tensor) -> None:
        """Apply every constraint prior to ``images`` in place (the box projection)."""
        for constraint in [b.part for b in self.priors if b.part.constraint]:
            constraint.project(images, self.box)

    def projects(self) -> bool:
        """Whether any prior is a constraint."""
        return any(b.part.constraint for b in self.priors)

    def value_and_gradient(self, images: torch.Tensor, terms: Sequence[BoundPrior],
                           weights: Sequence[Weight]) -> tuple[torch.Tensor, torch.Tensor]:
        """Return F's value and its gradient with respect to ``images``.

        F's value and its gradient with respect to ``images`` ``[R, n, C, H, W]``, the prior
        ``terms`` weighted by ``weights`` (module docstring). One vector–Jacobian product, ∂/∂x
        only: ``backward`` would also fill the replay parameters' ``.grad``.
        """
        update = self.replay(images, self.labels)
        value, output_grads, scale = self.objective.value_and_output_grads(update)
        outputs = list(update)
        for b, weight in zip(terms, weights, strict=True):
            term = b.rows(images) if self.rows else b.single(images[0])
            value = value + term.detach() * weight
            outputs.append(term)
            output_grads.append(weight / scale)
        (grad,) = torch.autograd.grad(outputs, images, output_grads)
        return grad.mul_(scale.view(-1, *[1] * (images.dim() - 1))), value


    def final_value(self, images: torch.Tensor, select: str) -> float:
        """F at one restart's ``images`` ``[n, C, H, W]``, which picks the restart.

        J, plus (``select`` ``total``) every prior term at its last weight λ_k(T − 1); +inf when not
        finite. For a one-restart problem (``rows`` False).
        """
        leaf = images.detach().requires_grad_(True)
        value = self.objective.value(self.replay(leaf.unsqueeze(0), self.labels))
        if select == "total":
            with torch.no_grad():
                for b in self.priors:
                    weight = b.weight(self.iterations - 1, self.iterations)
                    if weight > 0 and not b.part.constraint:
                        value = value + weight * b.single(leaf.detach())
        result = float(value.item())
        return result if math.isfinite(result) else math.inf


@dataclass(frozen=True)
class ProgressSpan:
    """Where one loop's restart-iterations fall in the attack's whole budget of ``total``.

    It reports ``progress(offset + done, total, value)``.
    """

    progress: Progress | None
    offset: int
    total: int

    def report(self, done: int, value: float) -> None:
        """Report ``done`` restart-iterations of this span, at objective ``value``."""
        if self.progress is not None:
            self.progress(self.offset + done, self.total, value)


def per_restart(images: torch.Tensor) -> tuple[int, ...]:
    """Return the shape broadcasting one entry per restart over ``images`` [R, n, C, H, W]."""
    return (-1, *[1] * (images.dim() - 1))


def finite_or_last(images: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """Return each restart's result, ending the optimisation.

    Each restart's result: its last iterate in ``images`` where finite, else ``last`` (its last
    iterate with a finite objective). Ends the optimisation: ``images`` stops requiring a gradient.
    """
    images.requires_grad_(False)
    with torch.no_grad():
        finite = torch.isfinite(images).flatten(1).all(1).view(per_restart(images))
        return torch.where(finite, images, last)
