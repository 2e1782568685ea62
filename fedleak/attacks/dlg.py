"""Deep Leakage from Gradients (Zhu et al., NeurIPS 2019), the baseline of Inverting Gradients.

DLG matches the observed update ``u*`` with the replayed update ``u(x, ŷ)`` in the squared
euclidean distance (eq. (3) of Geiping et al.),

    x̂ = argmin_x  Σ_l ‖u_l(x, ŷ) − u*_l‖²     (sum over every parameter tensor l),

with L-BFGS from a Gaussian N(0, 1) init in normalised space and no box constraint. Labels are
recovered analytically (iDLG, :func:`fedleak.attacks.labels.recover_labels`) rather than
optimised jointly. Geiping et al.'s supplement (Sec. C.1) runs 300 L-BFGS steps with 16 (LeNet)
or 8 (ResNet) restarts; each L-BFGS step evaluates the objective up to ``inner_iterations``
times (PyTorch's ``max_iter``, 20 as in Zhu's code). The supplement quotes a step size of 1e-4;
with PyTorch's L-BFGS (no line search, as in Zhu's code) it barely moves the images (measured
on an untrained 32×32 LeNet: after 50 steps the distance is still 160 and the PSNR 7.9 dB,
against 3e-4 and 32 dB with lr = 1), so the default is Zhu's lr = 1; pass ``lr=1e-4`` to
reproduce the quote.

On CUDA (``capture``, the default) the objective and its gradient — the replay's forward and
double backward, the distance, the vector–Jacobian product back to the images — are recorded
once as a CUDA graph and replayed at every evaluation L-BFGS asks for. L-BFGS itself cannot be
captured: its two-loop recursion is cheap, but its stopping tests and line search branch on
the objective in Python (``torch.optim.LBFGS`` reads it to the host at every evaluation), so it
stays eager around the captured evaluation.

L-BFGS on a third-order problem diverges now and then: every evaluated iterate with a finite
objective lower than any before is kept, and a restart stops as soon as the objective or the
images stop being finite; the best finite iterate is its result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from fedleak.attacks.base import Attack, Progress
from fedleak.attacks.capture import capturable, captured_function
from fedleak.attacks.inverting_gradients import gaussian_init
from fedleak.attacks.labels import recover_labels
from fedleak.attacks.observation import Observation, Reconstruction
from fedleak.attacks.registry import register_attack


@dataclass
class DLGConfig:
    """Hyperparameters of DLG with L-BFGS."""

    iterations: int = field(default=300, metadata={"help": "L-BFGS steps per restart"})
    restarts: int = field(
        default=1, metadata={"help": "random inits (paper: 16 LeNet, 8 ResNet); best kept"}
    )
    lr: float = field(default=1.0, metadata={"help": "L-BFGS step size (Zhu's code: 1)"})
    inner_iterations: int = field(
        default=20, metadata={"help": "objective evaluations per L-BFGS step (max_iter)"}
    )
    history_size: int = field(default=100, metadata={"help": "L-BFGS memory"})
    line_search: str = field(
        default="none", metadata={"help": "'none' (Zhu's code) or 'strong_wolfe'"}
    )
    log_every: int = field(default=10, metadata={"help": "report progress every k steps"})
    capture: bool = field(
        default=True,
        metadata={"help": "on CUDA, record the objective and its gradient as a CUDA graph "
                  "(L-BFGS itself stays eager); falls back to eager with a notice"},
    )

    def __post_init__(self) -> None:
        for name in ("iterations", "restarts", "inner_iterations", "history_size", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.line_search not in ("none", "strong_wolfe"):
            raise ValueError(
                f"line_search must be 'none' or 'strong_wolfe', got {self.line_search!r}"
            )


def gradient_distance(candidate: list[torch.Tensor], observed: list[torch.Tensor]) -> torch.Tensor:
    """``Σ_l ‖u_l − u*_l‖²`` over all parameter tensors (DLG's objective)."""
    return torch.stack(
        [(u - o).square().sum() for u, o in zip(candidate, observed, strict=True)]
    ).sum()


class _BestIterate:
    """The lowest finite objective seen so far and the images that produced it."""

    def __init__(self) -> None:
        self.value = math.inf
        self.images: torch.Tensor | None = None
        self.notice: str | None = None

    def offer(self, value: float, images: torch.Tensor) -> None:
        if math.isfinite(value) and value < self.value and bool(torch.isfinite(images).all()):
            self.value = value
            self.images = images.detach().clone()


@register_attack("dlg")
class DLG(Attack[Observation]):
    """Zhu et al.'s DLG: euclidean gradient matching optimised with L-BFGS (iDLG labels)."""

    Config = DLGConfig
    config: DLGConfig

    def recover(
        self,
        observation: Observation,
        *,
        device: torch.device,
        seed: int,
        progress: Progress | None,
    ) -> Reconstruction:
        """Run ``restarts`` L-BFGS trials; return the best finite iterate of the best trial.

        Restart r starts from N(0, 1) drawn on the CPU from ``seed + r``.
        """
        cfg = self.config
        labels = recover_labels(observation).to(device)
        observed = [u.detach().to(device) for u in observation.update]
        shape = (observation.num_images, *observation.image_shape)
        total = cfg.iterations * cfg.restarts
        finals: list[float] = []
        notices: list[str] = []
        best = _BestIterate()
        graph_safe = cfg.capture and capturable(device)
        for restart in range(cfg.restarts):
            trial = self._trial(
                gaussian_init(shape, seed + restart, device), labels, observation, observed,
                offset=restart * cfg.iterations, total=total, progress=progress,
                graph_safe=graph_safe,
            )
            notices += [trial.notice] if trial.notice else []
            finals.append(trial.value)
            if trial.images is not None and trial.value < best.value:
                best = trial
        images = best.images if best.images is not None else gaussian_init(shape, seed, device)
        return Reconstruction(
            images=images,
            labels=labels,
            objective=best.value,
            iterations=total,
            restart_objectives=finals,
            warnings=sorted(set(notices)),
            extras={"captured": graph_safe and not notices},
        )

    def _trial(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        observation: Observation,
        observed: list[torch.Tensor],
        *,
        offset: int,
        total: int,
        progress: Progress | None,
        graph_safe: bool = False,
    ) -> _BestIterate:
        cfg = self.config
        images.requires_grad_(True)
        optimiser = torch.optim.LBFGS(
            [images],
            lr=cfg.lr,
            max_iter=cfg.inner_iterations,
            history_size=cfg.history_size,
            line_search_fn=None if cfg.line_search == "none" else cfg.line_search,
        )
        best = _BestIterate()
        objective = torch.zeros((), dtype=images.dtype, device=images.device)
        gradient = torch.zeros_like(images)

        def evaluate() -> None:
            """Objective and gradient at the current images, into static buffers."""
            loss = gradient_distance(observation.simulate(images, labels), observed)
            # ∂/∂x only: backward() would also fill .grad of the replay's parameters
            (grad,) = torch.autograd.grad(loss, images)
            with torch.no_grad():
                objective.copy_(loss)
                gradient.copy_(grad)

        if graph_safe:
            evaluate, best.notice = captured_function(evaluate, images.device)

        images.grad = gradient  # L-BFGS copies it out (torch.cat) at every evaluation

        def closure() -> torch.Tensor:
            evaluate()
            loss = objective.clone()  # L-BFGS returns its first loss after later evaluations
            best.offer(float(loss.item()), images)
            return loss

        for iteration in range(cfg.iterations):
            loss = optimiser.step(closure)
            value = float(loss.item())
            done = offset + iteration + 1
            if progress is not None and (done % cfg.log_every == 0 or iteration == 0):
                progress(done, total, value)
            if not math.isfinite(value) or not bool(torch.isfinite(images).all()):
                break
        images.requires_grad_(False)
        return best
