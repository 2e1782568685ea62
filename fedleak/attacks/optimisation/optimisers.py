"""Optimisers of the optimisation attacks, as small registered parts.

- ``signed-adam``: Adam (β = (0.9, 0.999), ε = 1e-8) fed the *sign* of the gradient, the step
  size multiplied by 0.1 from iterations ⌊3T/8⌋, ⌊5T/8⌋, ⌊7T/8⌋ (Geiping et al. 2020, Sec. 4
  and supplement Sec. C): ``m ← β₁m + (1−β₁)s``, ``v ← β₂v + (1−β₂)s²``,
  ``x ← x − lr_t/(1−β₁ᵗ) · m/(√v/√(1−β₂ᵗ) + ε)``, ``s = sign(∇)``.
- ``adam``: the same with ``s = ∇`` (``torch.optim.Adam``'s maths), constant step unless
  ``decay`` is on (Qian & Hansen 2021, Sec. 4.2: first-order Adam for image-sized inputs).
- ``sgd``: ``x ← x − lr_t ∇`` (Qian & Hansen, Algorithm 2, line 13).
- ``lbfgs``: PyTorch's L-BFGS, up to ``inner`` evaluations of the objective per step, no line
  search unless asked (Zhu et al. 2019's DLG); not first order: the attack runs it through a
  closure, keeping the best finite iterate it evaluated.

First-order parts give an eager stepper (:meth:`OptimiserPart.eager`) and a graph-safe one with
its whole state on the device (:meth:`OptimiserPart.device`, :mod:`fedleak.attacks.capture`);
both take the same steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch

from fedleak.attacks.capture import ADAM_BETAS, ADAM_EPS, DeviceSGD, DeviceSignedAdam
from fedleak.attacks.parts import AttackPart, PartError
from fedleak.registry import Registry

DECAY_FRACTIONS = (3 / 8, 5 / 8, 7 / 8)
DECAY_FACTOR = 0.1
LINE_SEARCHES = ("none", "strong_wolfe")


def decay_milestones(iterations: int) -> tuple[int, ...]:
    """Return the 0-based iterations where the step size decays: ⌊3T/8⌋, ⌊5T/8⌋, ⌊7T/8⌋."""
    return tuple(int(iterations * f) for f in DECAY_FRACTIONS)


def step_size(iteration: int, iterations: int, lr: float, decay: bool = True) -> float:
    """Step size used at ``iteration`` (0-based), as ``MultiStepLR`` stepped once per iteration."""
    if not decay:
        return lr
    passed = sum(iteration >= m for m in decay_milestones(iterations))
    return lr * DECAY_FACTOR**passed


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


class PlainSGD:
    """``x ← x − lr ∇`` in place (``torch.optim.SGD`` without momentum)."""

    def __init__(self, images: torch.Tensor) -> None:
        self.images = images

    def step(self, grad: torch.Tensor, lr: float) -> None:
        """Take one step ``x ← x − lr ∇`` in place."""
        self.images.add_(grad, alpha=-lr)


class Stepper(Protocol):
    """An eager optimiser step on the images, with the step size passed in."""

    def step(self, grad: torch.Tensor, lr: float) -> None:
        """Take one step along ``grad`` with step size ``lr``, in place."""


class DeviceStepper(Protocol):
    """An optimiser step whose state and step-size schedule live on the device (CUDA capture)."""

    def step(self, grad: torch.Tensor) -> None:
        """Take the next scheduled step along ``grad``, in place."""


class OptimiserPart(AttackPart):
    """A registered optimiser of the images."""

    #: steps on the gradient alone (False: needs a closure, L-BFGS)
    first_order: ClassVar[bool] = True

    def evaluations_per_step(self) -> int:
        """Return at most how many objective evaluations one step spends.

        At most how many objective evaluations (replay + vector–Jacobian product) one step spends: 1
        for a first-order step.
        """
        return 1

    def rate(self, iteration: int, iterations: int) -> float:
        """Step size at 0-based ``iteration`` of ``iterations``."""
        return step_size(iteration, iterations, self.config.lr, self.config.decay)

    def schedule(self, iterations: int) -> torch.Tensor:
        """Every iteration's step size (float64, for the device steppers)."""
        return torch.tensor([self.rate(i, iterations) for i in range(iterations)],
                            dtype=torch.float64)

    def eager(self, images: torch.Tensor) -> Stepper:
        """Return the eager stepper over ``images``."""
        raise NotImplementedError

    def device(self, images: torch.Tensor, iterations: int) -> DeviceStepper:
        """Return the device stepper over ``images`` for ``iterations`` steps."""
        raise NotImplementedError


OPTIMISERS: Registry[OptimiserPart] = Registry("optimizer", "fedleak.optimizers", PartError)


def register_optimiser(name: str) -> Callable[[type[OptimiserPart]], type[OptimiserPart]]:
    """Class decorator: make an optimiser part available as ``name``."""
    return OPTIMISERS.register(name)


def _check_lr(lr: float) -> None:
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be positive, got {lr}")


@dataclass
class AdamConfig:
    """Options of Adam: the step size and the step decay at 3/8, 5/8 and 7/8 of T."""

    lr: float = field(default=0.1, metadata={"help": "step size"})
    decay: bool = field(default=True, metadata={
        "help": "multiply the step size by 0.1 at 3/8, 5/8 and 7/8 of the iterations"})

    def __post_init__(self) -> None:
        """Refuse a non-positive or infinite step size."""
        _check_lr(self.lr)


@register_optimiser("signed-adam")
class SignedAdamPart(OptimiserPart):
    """Adam on sign(∇) with the 3/8, 5/8, 7/8 step decay (Geiping et al. 2020)."""

    Config = AdamConfig

    def eager(self, images: torch.Tensor) -> Stepper:
        """Return Adam on the sign of the gradient (Geiping et al. 2020), eager."""
        return SignedAdam(images, signed=True)

    def device(self, images: torch.Tensor, iterations: int) -> DeviceStepper:
        """Return Adam on the sign of the gradient on the device, with the step schedule."""
        return DeviceSignedAdam(images, self.schedule(iterations), signed=True)


@dataclass
class ConstantConfig:
    """Options of a plain optimiser: the step size and the optional step decay."""

    lr: float = field(default=0.05, metadata={"help": "step size"})
    decay: bool = field(default=False, metadata={
        "help": "multiply the step size by 0.1 at 3/8, 5/8 and 7/8 of the iterations"})

    def __post_init__(self) -> None:
        """Refuse a non-positive or infinite step size."""
        _check_lr(self.lr)


@register_optimiser("adam")
class AdamPart(OptimiserPart):
    """Adam on ∇ (``torch.optim.Adam``), constant step by default (Qian & Hansen 2021)."""

    Config = ConstantConfig

    def eager(self, images: torch.Tensor) -> Stepper:
        """Return Adam on the raw gradient, eager."""
        return SignedAdam(images, signed=False)

    def device(self, images: torch.Tensor, iterations: int) -> DeviceStepper:
        """Return Adam on the raw gradient on the device, with the step schedule."""
        return DeviceSignedAdam(images, self.schedule(iterations), signed=False)


@register_optimiser("sgd")
class SGDPart(OptimiserPart):
    """Plain gradient descent ``x ← x − lr ∇`` (Qian & Hansen, Algorithm 2)."""

    Config = ConstantConfig

    def eager(self, images: torch.Tensor) -> Stepper:
        """Return plain SGD, eager."""
        return PlainSGD(images)

    def device(self, images: torch.Tensor, iterations: int) -> DeviceStepper:
        """Return plain SGD on the device, with the step schedule."""
        return DeviceSGD(images, self.schedule(iterations))


@dataclass
class LBFGSConfig:
    """Options of L-BFGS: step size, evaluations per step, history and line search."""

    lr: float = field(default=1.0, metadata={"help": "L-BFGS step size (Zhu's code: 1)"})
    inner: int = field(default=20, metadata={
        "help": "objective evaluations per L-BFGS step (max_iter)"})
    history: int = field(default=100, metadata={"help": "L-BFGS memory"})
    line_search: str = field(default="none", metadata={
        "help": "'none' (Zhu's code) or 'strong_wolfe'"})

    def __post_init__(self) -> None:
        """Refuse a bad step size, ``inner`` or ``history`` below 1, an unknown line search."""
        _check_lr(self.lr)
        for name in ("inner", "history"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.line_search not in LINE_SEARCHES:
            raise ValueError(f"line_search must be 'none' or 'strong_wolfe', got "
                             f"{self.line_search!r}")


@register_optimiser("lbfgs")
class LBFGSPart(OptimiserPart):
    """PyTorch's L-BFGS over the images (Zhu et al. 2019)."""

    Config = LBFGSConfig
    config: LBFGSConfig
    first_order = False

    def evaluations_per_step(self) -> int:
        """Return PyTorch's ``max_eval`` for ``inner`` iterations.

        PyTorch's ``max_eval``: ``inner`` (``max_iter``) without a line search, whose every
        iteration evaluates once; ⌊5·inner/4⌋ with one, which may evaluate more often (a step may
        stop earlier on its tolerances either way).
        """
        inner = self.config.inner
        return inner if self.config.line_search == "none" else inner * 5 // 4

    def rate(self, iteration: int, iterations: int) -> float:
        """Return the constant L-BFGS step size."""
        return self.config.lr

    def optimiser(self, images: torch.Tensor) -> torch.optim.LBFGS:
        """``torch.optim.LBFGS`` over ``images``."""
        cfg = self.config
        return torch.optim.LBFGS(
            [images], lr=cfg.lr, max_iter=cfg.inner, history_size=cfg.history,
            line_search_fn=None if cfg.line_search == "none" else cfg.line_search)


def create_optimiser(name: str, options: Mapping[str, Any] | None = None) -> OptimiserPart:
    """Optimiser part ``name`` with ``options``; unknown names list the valid ones."""
    return OPTIMISERS.create(name, options)


def optimiser_names() -> tuple[str, ...]:
    """Every registered optimiser part."""
    return OPTIMISERS.names()
