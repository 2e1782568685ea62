"""The KKT attack's loss (Haim et al., NeurIPS 2022, eq. (8)) and its maths.

A homogeneous ReLU network Φ(θ; ·) trained with the logistic loss by gradient flow converges in
direction to a KKT point of min ½‖θ‖² s.t. y_i Φ(θ; x_i) ≥ 1, whose stationarity, eq. (2),
reads θ = Σ_i λ_i y_i ∇_θ Φ(θ; x_i), λ_i ≥ 0 (dual feasibility, eq. (4)). For candidates
x_1 … x_m with labels y_i (:func:`candidate_labels`) and multipliers λ_i the attack minimises

    L = α₁ ‖θ − Σ_i λ_i y_i ∇_θ Φ(θ; x_i)‖²               (L_stationary, eq. (6))
      + α₂ Σ_i max(−λ_i + λ_min, 0)                        (L_λ, eq. (7) with λ_min of App. B.2)
      + α₃ Σ_i mean_pixels[max(z − hi, 0) + max(lo − z, 0)]  (L_prior, Sec. 5.2),

(:func:`kkt_objective`; α = (1, 5, 1) in the paper, the box [lo, hi] the released
``value_range``, (−1, 1) in the paper).

Σ_i λ_i y_i ∇_θ Φ(θ; x_i) for all m candidates is one backward pass: it is ∇_θ of the scalar
Σ_i λ_i y_i Φ(θ; x_i) (:func:`combined_gradient`), taken with ``create_graph`` so that L can be
differentiated with respect to x and λ (a double backward per iteration, no per-sample
gradients).

The ReLU's derivative, a step function, is replaced in the *backward* pass by σ(α z) (the
derivative of a softplus of sharpness α), the forward staying ReLU (App. B.2,
:class:`SmoothBackwardReLU`), inside ∇_θ Φ and when L is differentiated again with respect to
x; every ``nn.ReLU`` of a deep copy of the caller's model is swapped (:func:`with_smooth_relu`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from fedleak.attacks.kkt.packed_search import replace_relus


class SmoothBackwardReLU(torch.autograd.Function):
    """ReLU forward, ``grad · σ(α z)`` backward (App. B.2); the backward is twice differentiable."""

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, alpha: float) -> torch.Tensor:
        """Return ``max(z, 0)``, saving ``z`` and ``alpha`` for the backward."""
        ctx.save_for_backward(z)
        ctx.alpha = alpha
        return z.clamp_min(0)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        """Return ``grad_output · σ(α z)``, the softplus derivative in place of the step."""
        (z,) = ctx.saved_tensors
        return grad_output * torch.sigmoid(ctx.alpha * z), None


class SmoothReLU(nn.Module):
    """Module form of :class:`SmoothBackwardReLU` with sharpness ``alpha``."""

    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.alpha = float(alpha)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """Apply ReLU, with the smooth backward of :class:`SmoothBackwardReLU`."""
        out: torch.Tensor = SmoothBackwardReLU.apply(z, self.alpha)  # type: ignore[no-untyped-call]
        return out

    def extra_repr(self) -> str:
        """Return ``alpha=…`` for the module's repr."""
        return f"alpha={self.alpha}"


def with_smooth_relu(model: nn.Module, alpha: float) -> tuple[nn.Module, int]:
    """Copy ``model`` deeply with every ``nn.ReLU`` replaced by ``SmoothReLU(alpha)``.

    Returns the copy and how many modules were swapped. ReLUs called functionally
    (``torch.relu`` inside ``forward``) cannot be swapped and keep the step derivative.
    """
    return replace_relus(model, lambda: SmoothReLU(alpha))


def set_relu_alpha(model: nn.Module, alpha: float) -> None:
    """Set the sharpness of every :class:`SmoothReLU` in ``model``."""
    for module in model.modules():
        if isinstance(module, SmoothReLU):
            module.alpha = float(alpha)


def model_output(
    model: nn.Module, parameters: dict[str, torch.Tensor], x: torch.Tensor
) -> torch.Tensor:
    """Φ(θ; x) as a vector ``[n]``; the model must give one output per input."""
    out: torch.Tensor = functional_call(model, parameters, (x,))
    out = out.reshape(x.shape[0], -1)
    if out.shape[1] != 1:
        raise ValueError(f"the KKT attack needs a scalar output per input, got {out.shape[1]}")
    return out[:, 0]


def combined_gradient(
    model: nn.Module,
    parameters: dict[str, torch.Tensor],
    x: torch.Tensor,
    lambdas: torch.Tensor,
    labels: torch.Tensor,
) -> list[torch.Tensor]:
    """Σ_i λ_i y_i ∇_θ Φ(θ; x_i) = ∇_θ Σ_i λ_i y_i Φ(θ; x_i), differentiable in x and λ.

    ``parameters`` must require grad (they are only differentiated against, never updated).
    """
    weighted = (lambdas * labels * model_output(model, parameters, x)).sum()
    return list(torch.autograd.grad(weighted, list(parameters.values()), create_graph=True))


def stationarity_loss(
    model: nn.Module,
    parameters: dict[str, torch.Tensor],
    x: torch.Tensor,
    lambdas: torch.Tensor,
    labels: torch.Tensor,
) -> torch.Tensor:
    """L_stationary of eq. (6): ‖θ − Σ_i λ_i y_i ∇_θ Φ(θ; x_i)‖² over all parameter tensors."""
    grads = combined_gradient(model, parameters, x, lambdas, labels)
    return torch.stack(
        [(p.detach() - g).square().sum() for p, g in zip(parameters.values(), grads, strict=True)]
    ).sum()


def dual_loss(lambdas: torch.Tensor, lambda_min: float) -> torch.Tensor:
    """L_λ of eq. (7) with App. B.2's λ_min: Σ_i max(−λ_i + λ_min, 0)."""
    return (lambda_min - lambdas).clamp_min(0).sum()


def prior_loss(x: torch.Tensor, value_range: tuple[float, float]) -> torch.Tensor:
    """L_prior of Sec. 5.2 on the box [lo, hi]: pixel mean per candidate, summed over candidates."""
    low, high = value_range
    outside = (x - high).clamp_min(0) + (low - x).clamp_min(0)
    return outside.flatten(1).mean(1).sum()


@dataclass
class KKTTerms:
    """The terms of eq. (8) at one iterate; ``total`` is differentiable."""

    total: torch.Tensor
    stationarity: torch.Tensor
    dual: torch.Tensor
    prior: torch.Tensor


def kkt_objective(
    model: nn.Module,
    parameters: dict[str, torch.Tensor],
    x: torch.Tensor,
    lambdas: torch.Tensor,
    labels: torch.Tensor,
    *,
    alphas: tuple[float, float, float] = (1.0, 5.0, 1.0),
    lambda_min: float = 0.0,
    value_range: tuple[float, float] = (-1.0, 1.0),
) -> KKTTerms:
    """Eq. (8): α₁ L_stationary + α₂ L_λ + α₃ L_prior (a zero α skips its term)."""
    stationarity = stationarity_loss(model, parameters, x, lambdas, labels)
    zero = stationarity.new_zeros(())
    dual = dual_loss(lambdas, lambda_min) if alphas[1] else zero
    prior = prior_loss(x, value_range) if alphas[2] else zero
    total = alphas[0] * stationarity + alphas[1] * dual + alphas[2] * prior
    return KKTTerms(total, stationarity, dual, prior)


def candidate_labels(m: int) -> torch.Tensor:
    """y_i = +1 for the first ⌈m/2⌉ candidates and −1 for the rest (Sec. 3.2)."""
    labels = -torch.ones(m)
    labels[: (m + 1) // 2] = 1
    return labels
