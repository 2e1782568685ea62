"""The L-BFGS loop: restarts one by one, each a trial of PyTorch's L-BFGS through a closure.

L-BFGS (limited-memory BFGS, ``torch.optim.LBFGS``, the optimiser of Zhu et al. 2019's DLG)
builds a quasi-Newton direction from the last ``history`` pairs
(s_k, y_k) = (x_{k+1} − x_k, ∇F_{k+1} − ∇F_k) and takes up to ``inner`` evaluations of F per
step (:class:`~fedleak.attacks.optimisation.optimisers.LBFGSPart`). It assumes one
fixed F: a prior whose weight changes with the iteration, or that couples restarts, is refused
(:func:`check_closure`), and the priors are weighted λ_k(0) throughout.

The closure evaluates F and ∇F at the current images into static buffers (the value, and the
images' ``.grad``, which L-BFGS copies out at every evaluation), so on CUDA one evaluation is
captured as a CUDA graph and replayed (:func:`~fedleak.attacks.capture.captured_function`),
with a notice when capture fails. Every evaluation is offered to a :class:`BestIterate`: a
trial's result is the lowest finite F it evaluated and the images that gave it, since L-BFGS
may step past its best point. A trial ends early when a step's F or images stop being finite;
after each step the constraint priors project onto the box.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from fedleak.attacks.base import Progress
from fedleak.attacks.capture import captured_function
from fedleak.attacks.optimisation.engine.problem import InversionProblem, ProgressSpan
from fedleak.attacks.optimisation.optimisers import LBFGSPart
from fedleak.attacks.optimisation.priors import PriorPart
from fedleak.attacks.parts import PartError


class BestIterate:
    """The lowest finite objective seen so far and the images that produced it."""

    def __init__(self) -> None:
        self.value = math.inf
        self.images: torch.Tensor | None = None
        self.notice: str | None = None

    def offer(self, value: float, images: torch.Tensor) -> None:
        """Keep ``images`` when ``value`` is finite and lower than the best so far."""
        if math.isfinite(value) and value < self.value and bool(torch.isfinite(images).all()):
            self.value = value
            self.images = images.detach().clone()


def check_closure(priors: Sequence[PriorPart]) -> None:
    """L-BFGS assumes one fixed objective.

    Refuse priors that change with the iteration or couple restarts.
    """
    for prior in priors:
        if prior.scheduled() or prior.coupled:
            raise PartError(f"prior {prior.name!r} changes with the iteration or couples "
                            "restarts, which L-BFGS (one fixed objective per restart) cannot "
                            "take; use a first-order optimiser (optimizer=adam, sgd or signed-adam)"
                            + (" or decay=1" if prior.scheduled() else ""))


def optimise_lbfgs(problem: InversionProblem, images: torch.Tensor, span: ProgressSpan, *,
                   graph_safe: bool) -> BestIterate:
    """Run one L-BFGS trial of ``problem.iterations`` steps on ``images``.

    One L-BFGS trial of ``problem.iterations`` steps on ``images`` ``[1, n, C, H, W]``
    (``problem.rows`` False), the evaluation captured when ``graph_safe``; the best finite iterate
    it evaluated, with the capture notice.
    """
    part = problem.optimiser
    if not isinstance(part, LBFGSPart):
        raise TypeError(f"the L-BFGS loop needs the lbfgs optimiser, got {part.name!r}")
    images.requires_grad_(True)
    optimiser = part.optimiser(images)
    terms = problem.terms(1)
    weights = [b.weight(0, 1) for b in terms]
    best = BestIterate()
    value_buffer = torch.zeros((), dtype=images.dtype, device=images.device)
    gradient = torch.zeros_like(images)

    def evaluate() -> None:
        """Objective and gradient at the current images, into static buffers."""
        grad, value = problem.value_and_gradient(images, terms, weights)
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

    for iteration in range(problem.iterations):
        loss: torch.Tensor = optimiser.step(closure)  # type: ignore[no-untyped-call]
        if problem.projects():
            with torch.no_grad():
                problem.project(images)
        value = float(loss.item())
        done = span.offset + iteration + 1
        if span.progress is not None and (done % problem.log_every == 0 or iteration == 0):
            span.progress(done, span.total, value)
        if not math.isfinite(value) or not bool(torch.isfinite(images).all()):
            break
    images.requires_grad_(False)
    return best


def lbfgs_restarts(problem: InversionProblem, initial: Callable[[int], torch.Tensor],
                   restarts: int, progress: Progress | None, *, graph_safe: bool
                   ) -> tuple[BestIterate, list[float], list[str]]:
    """``restarts`` trials one by one, trial r from ``initial(r)`` ``[n, C, H, W]``.

    The best trial, every trial's best objective, and the capture notices.
    """
    total = problem.iterations * restarts
    finals: list[float] = []
    notices: list[str] = []
    best = BestIterate()
    for restart in range(restarts):
        span = ProgressSpan(progress, restart * problem.iterations, total)
        trial = optimise_lbfgs(problem, initial(restart).unsqueeze(0), span,
                               graph_safe=graph_safe)
        notices += [trial.notice] if trial.notice else []
        finals.append(trial.value)
        if trial.images is not None and trial.value < best.value:
            best = trial
    return best, finals, notices
