"""The captured first-order loop.

The eager loop's step with its whole state on the device, recorded once as a CUDA graph and replayed
(:mod:`fedleak.attacks.capture`).

The maths is :mod:`~fedleak.attacks.optimisation.engine.eager`'s; what changes is where the state
lives, so that no Python number varies between replays and nothing reads the device back inside a
step:

- the step size comes from the optimiser's device stepper
  (:meth:`~fedleak.attacks.optimisation.optimisers.OptimiserPart.device`: ``lr_t = schedule[t]``,
  its step counter a device tensor);
- a scheduled prior weight is read from a precomputed device tensor, λ_k(t) = schedule_k[t],
  at the device step counter t; a constant one stays a number;
- the per-restart stop flag is a device tensor ``alive``: a restart whose F stops being finite
  keeps its last iterate with a finite F (``last``) and its images stop moving, the others go
  on; the host reads the flag and the lowest F of the live restarts only at the first step and
  every ``log_every`` steps, and ends the loop there when no restart is alive.

Off CUDA, or when capture fails (then with a one-line notice), the same graph-safe step runs
eagerly (:func:`~fedleak.attacks.capture.run_iterations`), which is how the CPU tests check it
against the eager loop.
"""

from __future__ import annotations

import math

import torch

from fedleak.attacks.capture import capturable, run_iterations
from fedleak.attacks.optimisation.engine.problem import (
    InversionProblem,
    ProgressSpan,
    Weight,
    finite_or_last,
    per_restart,
)


def optimise_captured(problem: InversionProblem, images: torch.Tensor, span: ProgressSpan
                      ) -> tuple[str | None, torch.Tensor]:
    """Run the graph-safe steps on ``images`` in place, captured on CUDA.

    ``problem.iterations`` graph-safe steps on ``images`` ``[R, n, C, H, W]`` in place, captured on
    CUDA; returns the notice when capture fell back to eager, and the result per restart (as
    :func:`~fedleak.attacks.optimisation.engine.eager.optimise_eager`).
    """
    iterations = problem.iterations
    width = images.shape[0]
    terms = problem.terms()
    images.requires_grad_(True)
    last = images.detach().clone()
    device, dtype = images.device, images.dtype
    stepper = problem.optimiser.device(images, iterations)
    shape = per_restart(images)
    schedules: list[Weight] = [
        torch.tensor([b.weight(i, iterations) for i in range(iterations)],
                     dtype=dtype, device=device) if b.part.scheduled()
        else b.weight(0, iterations) for b in terms]
    t = torch.zeros((), dtype=torch.int64, device=device)
    alive = torch.ones(width, dtype=torch.bool, device=device)
    objective = torch.zeros(width, dtype=dtype, device=device)

    def step() -> None:
        weights = [w.index_select(0, t.view(1)).squeeze(0) if isinstance(w, torch.Tensor)
                   else w for w in schedules]
        grad, value = problem.value_and_gradient(images, terms, weights)
        with torch.no_grad():
            alive.logical_and_(torch.isfinite(value.detach()).reshape(-1).expand(width))
            keep = alive.view(shape)
            last.copy_(torch.where(keep, images, last))
            objective.copy_(value.detach().reshape(-1).expand(width))
            before = images.detach().clone()
            stepper.step(grad)
            problem.project(images)
            images.copy_(torch.where(keep, images, before))
            t.add_(1)

    first = span.offset // width

    problem.revision(0, images)

    def on_step(done: int) -> bool:
        problem.revision(done, images)  # between graph replays: the replay reads it in place
        if (first + done) % problem.log_every != 0 and done != 1:
            return False
        if not bool(alive.any()):
            return True
        span.report(done * width, float(objective.masked_fill(~alive, math.inf).min().item()))
        return False

    notice = run_iterations(step, iterations, device, capture=capturable(device),
                            on_step=on_step)
    return notice, finite_or_last(images, last)
