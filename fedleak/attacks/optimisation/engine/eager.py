"""The eager first-order loop: R restarts side by side, one Python iteration per step.

Iteration i (0-based, of T) on the candidates X ``[R, n, C, H, W]`` of an
:class:`~fedleak.attacks.optimisation.engine.problem.InversionProblem`:

0. the problem's revision of its replay, when i is one it asks for (a modelled visiting
   order, :meth:`~fedleak.attacks.optimisation.engine.problem.InversionProblem.revision`);
1. F and ∇F at X with the priors weighted λ_k(i) (one replay, one vector–Jacobian product:
   :meth:`~fedleak.attacks.optimisation.engine.problem.InversionProblem.value_and_gradient`);
2. a restart whose F is not finite stops: it is frozen where it was (its step is undone) and
   the loop ends when none is left; the others go on;
3. the optimiser steps, x ← step(x, ∇F, lr_i)
   (:meth:`~fedleak.attacks.optimisation.optimisers.OptimiserPart.eager`, the step size ``lr_i``
   from
   :meth:`~fedleak.attacks.optimisation.optimisers.OptimiserPart.rate`);
4. the constraint priors project X onto the box.

Progress is reported at the first step and every ``log_every`` steps with the lowest F of the
restarts, read back to the host only then. Each restart's result is its last iterate, or the
last one with a finite F when that is not finite. On a GPU the same step runs captured
(:mod:`~fedleak.attacks.optimisation.engine.captured`); on a CPU Python is not the bottleneck.
"""

from __future__ import annotations

import torch

from fedleak.attacks.optimisation.engine.problem import (
    GradientFn,
    InversionProblem,
    ProgressSpan,
    finite_or_last,
    per_restart,
)


def optimise_eager(problem: InversionProblem, images: torch.Tensor, span: ProgressSpan,
                   gradient: GradientFn | None = None) -> torch.Tensor:
    """``problem.iterations`` first-order steps on ``images`` ``[R, n, C, H, W]`` in place.

    Returns the result per restart (module docstring). ``gradient`` computes step 1 instead of
    :meth:`~fedleak.attacks.optimisation.engine.problem.InversionProblem.value_and_gradient`
    (the compiled step, :mod:`~fedleak.attacks.optimisation.engine.compiled`).
    """
    iterations = problem.iterations
    width = images.shape[0]
    terms = problem.terms()
    images.requires_grad_(True)
    last = images.detach().clone()
    stepper = problem.optimiser.eager(images)
    alive = torch.ones(width, dtype=torch.bool, device=images.device)
    everyone = True  # every restart alive: known on the host, no read-back per step
    for iteration in range(iterations):
        problem.revision(iteration, images)
        weights = [b.weight(iteration, iterations) for b in terms]
        grad, value = problem.value_and_gradient(images, terms, weights) if gradient is None \
            else gradient(images, weights)
        finite = torch.isfinite(value.detach()).reshape(-1).expand(width)
        with torch.no_grad():
            if not bool(finite.all()):
                alive &= finite
                everyone = False
                if not bool(alive.any()):
                    break
            before = None if everyone else images.detach().clone()
            last.copy_(images)
            stepper.step(grad, problem.optimiser.rate(iteration, iterations))
            problem.project(images)
            if before is not None:
                images.copy_(torch.where(alive.view(per_restart(images)), images, before))
        reported = span.offset // width + iteration + 1
        if reported % problem.log_every == 0 or iteration == 0:
            span.report((iteration + 1) * width, float(value.detach().min().item()))
    return finite_or_last(images, last)
