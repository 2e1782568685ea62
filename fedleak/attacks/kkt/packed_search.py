"""Packed KKT runs: K runs of the random search as one batched computation.

Run r of Haim et al.'s random search (App. B.2) optimises its own candidates and multipliers
(x_r, λ_r) with its own settings (lr_r, σ_r, α_r, λ_min,r), and its objective L_r of eq. (8)
depends on (x_r, λ_r) alone, so for the sum over the K runs of a pack

    ∂(Σ_r L_r)/∂(x_r, λ_r) = ∂L_r/∂(x_r, λ_r),

and one gradient of the sum gives every run its own. What must stay per run is everything
that is not a sum over runs: the combination Σ_i λ_ri y_i ∇_θ Φ(θ; x_ri) is a gradient with
respect to θ *per run* (one θ-gradient over all K·m candidates would mix the runs), and the
ReLU's backward sharpness α_r differs between runs. So L_r is written for one run and mapped
over the K runs with ``torch.func.vmap``, the θ-gradient inside it taken with
``torch.func.grad``, and the gradient of Σ_r L_r with respect to all (x, λ) with
``torch.func.grad`` around it.

Inside those transforms the sharpness is a per-run tensor, which the autograd ``Function`` of
:class:`~fedleak.attacks.kkt.loss.SmoothBackwardReLU` (a Python float per module) cannot carry, so
the packed model's ReLUs are written from differentiable pieces instead
(:class:`DetachedSmoothReLU`):

    relu(z) = z⁺ (detached) + s(z) − s(z) (detached),   s(z) = log(1 + e^{αz}) / α,

whose value is exactly relu(z) and whose derivative is s'(z) = σ(αz), with the same second
derivative α σ(αz)(1 − σ(αz)) as the ``Function``'s backward — the same objective and the
same gradients, so a packed run lands where the run alone lands (to float rounding; test).

The optimisers (SGD with momentum 0.9, or Adam) step each run at its own learning rate, with
their state on the device, and the finiteness test of every ``log_every``-th step is a per-run
device flag: a run that fails it is frozen and keeps its last passing state, the others go on.
The step is graph-safe, so on CUDA it is captured as a CUDA graph
(:mod:`fedleak.attacks.capture`); off CUDA it runs the same step eagerly.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from fedleak.attacks.base import Progress
from fedleak.attacks.capture import DeviceSGD, DeviceSignedAdam, capturable, run_iterations


class Sharpness:
    """The α every :class:`DetachedSmoothReLU` of one packed model reads (a per-run tensor)."""

    def __init__(self) -> None:
        self.alpha: torch.Tensor | float = 1.0


class DetachedSmoothReLU(nn.Module):
    """ReLU forward, σ(αz) derivative, from pieces ``torch.func`` transforms natively."""

    def __init__(self, sharpness: Sharpness) -> None:
        super().__init__()
        self.sharpness = sharpness

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """Return ``relu(z)`` in value, with the derivative of ``softplus(α z) / α``: σ(α z)."""
        alpha = self.sharpness.alpha
        soft = torch.logaddexp(alpha * z, torch.zeros_like(z)) / alpha
        return z.clamp_min(0).detach() + (soft - soft.detach())


def replace_relus(model: nn.Module, make: Callable[[], nn.Module]) -> tuple[nn.Module, int]:
    """Copy ``model`` deeply with every ``nn.ReLU`` module replaced by ``make()``.

    Returns the copy and how many were replaced (ReLUs called functionally cannot be).
    """
    twin = copy.deepcopy(model)
    replaced = 0
    for parent in list(twin.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, nn.ReLU):
                setattr(parent, child_name, make())
                replaced += 1
    return twin, replaced


def with_detached_smooth_relu(model: nn.Module) -> tuple[nn.Module, Sharpness]:
    """Copy ``model`` deeply so that its ``nn.ReLU`` modules read one shared α (set per run).

    Returns the copy and the :class:`Sharpness` that holds α.
    """
    sharpness = Sharpness()
    twin, _ = replace_relus(model, lambda: DetachedSmoothReLU(sharpness))
    return twin, sharpness


@dataclass(frozen=True)
class PackedRuns:
    """The K runs of one pack: initial states, per-run settings, and the fixed problem."""

    x: torch.Tensor  # [K, m, *input_shape]
    lambdas: torch.Tensor  # [K, m]
    lr: torch.Tensor  # [K], the x step of each run
    lambda_lr: torch.Tensor  # [K], the λ step of each run
    alpha: torch.Tensor  # [K], ReLU sharpness
    lambda_min: torch.Tensor  # [K]


@dataclass
class PackedOutcome:
    """Per run: the last state that passed a finiteness test, the final state, and a failure.

    ``diverged`` says whether a test failed (the run stopped there).
    """

    last: tuple[torch.Tensor, torch.Tensor]  # x [K, m, *input_shape], λ [K, m]
    final: tuple[torch.Tensor, torch.Tensor]
    diverged: list[bool]
    notice: str | None


def packed_objective(
    model: nn.Module,
    sharpness: Sharpness,
    parameters: dict[str, torch.Tensor],
    labels: torch.Tensor,
    *,
    weights: tuple[float, float, float],
    value_range: tuple[float, float],
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
              tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """``f(X, Λ, α, λ_min) -> ((∂/∂X, ∂/∂Λ) of Σ_r L_r, [L_r])`` for K runs at once (eq. (8))."""
    theta = {name: p.detach() for name, p in parameters.items()}
    low, high = value_range

    def one_run(x: torch.Tensor, lambdas: torch.Tensor, alpha: torch.Tensor,
                lambda_min: torch.Tensor) -> torch.Tensor:
        sharpness.alpha = alpha

        def weighted(params: dict[str, torch.Tensor]) -> torch.Tensor:
            out: torch.Tensor = functional_call(model, params, (x,))
            out = out.reshape(x.shape[0], -1)[:, 0]
            return (lambdas * labels * out).sum()

        combined = grad(weighted)(theta)
        stationarity = torch.stack([(theta[name] - combined[name]).square().sum()
                                    for name in theta]).sum()
        total = weights[0] * stationarity
        if weights[1]:
            total = total + weights[1] * (lambda_min - lambdas).clamp_min(0).sum()
        if weights[2]:
            outside = (x - high).clamp_min(0) + (low - x).clamp_min(0)
            total = total + weights[2] * outside.flatten(1).mean(1).sum()
        return total

    def summed(x: torch.Tensor, lambdas: torch.Tensor, alpha: torch.Tensor,
               lambda_min: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        totals = vmap(one_run)(x, lambdas, alpha, lambda_min)
        return totals.sum(), totals

    def evaluate(x: torch.Tensor, lambdas: torch.Tensor, alpha: torch.Tensor,
                 lambda_min: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor],
                                                    torch.Tensor]:
        gradients, totals = grad(summed, argnums=(0, 1), has_aux=True)(
            x, lambdas, alpha, lambda_min)
        return gradients, totals

    return evaluate


def iterate_packed(
    objective: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                        tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]],
    runs: PackedRuns,
    *,
    iterations: int,
    optimiser: str,
    momentum: float,
    log_every: int,
    capture: bool,
    report: Callable[[int, float], None] | None = None,
) -> PackedOutcome:
    """Run ``iterations`` steps of K runs side by side; return each run's last passing state.

    ``report(done, lowest)`` is called every ``log_every`` steps with the lowest objective
    among the runs still going (one host read of the objectives and flags).
    """
    x, lambdas = runs.x.clone(), runs.lambdas.clone()
    dev = x.device
    count = x.shape[0]
    rates = (runs.lr.double().view(1, -1), runs.lambda_lr.double().view(1, -1))  # [1, K]
    optimisers: list[DeviceSignedAdam | DeviceSGD]
    if optimiser == "adam":
        optimisers = [DeviceSignedAdam(x, rates[0], signed=False),
                      DeviceSignedAdam(lambdas, rates[1], signed=False)]
    else:
        optimisers = [DeviceSGD(x, rates[0], momentum), DeviceSGD(lambdas, rates[1], momentum)]
    t = torch.zeros((), dtype=torch.int64, device=dev)
    alive = torch.ones(count, dtype=torch.bool, device=dev)
    totals = torch.zeros(count, dtype=x.dtype, device=dev)
    last = (x.clone(), lambdas.clone())
    per_x = (-1, *[1] * (x.dim() - 1))

    def step() -> None:
        (grad_x, grad_lambdas), values = objective(x, lambdas, runs.alpha, runs.lambda_min)
        check = t.remainder(log_every) == 0
        finite = torch.isfinite(values) & torch.isfinite(x.flatten(1)).all(1)
        alive.logical_and_(finite | ~check)
        keep = alive & check
        last[0].copy_(torch.where(keep.view(per_x), x, last[0]))
        last[1].copy_(torch.where(keep.view(-1, 1), lambdas, last[1]))
        totals.copy_(values)
        before = (x.clone(), lambdas.clone())
        for optimiser, gradient in zip(optimisers, (grad_x, grad_lambdas), strict=True):
            optimiser.step(gradient)
        x.copy_(torch.where(alive.view(per_x), x, before[0]))
        lambdas.copy_(torch.where(alive.view(-1, 1), lambdas, before[1]))
        t.add_(1)

    def on_step(done: int) -> bool:
        if (done - 1) % log_every != 0:
            return False
        going = alive.cpu()
        if not bool(going.any()):
            return True
        if report is not None:
            report(done, float(totals.cpu()[going].min()))
        return False

    notice = run_iterations(step, iterations, dev, capture=capture and capturable(dev),
                            on_step=on_step)
    diverged = [not bool(a) for a in alive.cpu()]
    return PackedOutcome(last, (x.detach(), lambdas.detach()), diverged, notice)


def pack_progress(progress: Progress | None, offset: int, width: int,
                  total: int) -> Callable[[int, float], None] | None:
    """Progress of a pack: ``done`` steps of ``width`` runs count ``done · width`` run-steps."""
    if progress is None:
        return None

    def report(done: int, lowest: float) -> None:
        progress(offset + done * width, total, lowest)

    return report
