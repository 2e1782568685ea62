"""The KKT attack's random search (Haim et al. 2022, App. B.2): its options and each run's draw.

The attack optimises (x, λ) by SGD with momentum 0.9 (:data:`SGD_MOMENTUM`, or Adam) on eq. (8)
of :mod:`fedleak.attacks.kkt.loss` from x_i ~ N(0, σ_x² I), λ_i ~ U[0, λ_init], in ``runs``
runs whose four hyperparameters are sampled per run (:func:`sample_run_settings`):

- the learning rate lr, log-uniform in [1e-5, 1];
- the init scale σ_x, log-uniform in [1e-6, 1];
- the ReLU's backward sharpness α, uniform in [10, 500];
- λ_min of L_λ, log-uniform in [1e-4, 1]

(set low = high to fix one). Run r draws its settings from (seed, r) alone, so a search can be
split into chunks (``first_run``) and packed (``pack``) with the same runs. Three options leave
the paper, their defaults keep to it: ``lambda_lr`` gives λ its own step (as the authors' code
does), ``lambda_init`` scales λ's init (their code's Σ carries a 1/m), and ``optimizer="adam"``
replaces SGD: the objective's curvature grows with ‖θ‖ and with α near ReLU kinks, so SGD
needs a step matched to the model (App. B.2 samples five decades of lr for that); Adam's
per-coordinate steps are insensitive to that scale.

One run's loop (:class:`RunLoop`) runs eagerly here (:func:`iterate_eager`, ``torch.optim``) or as
its graph-safe twin (:func:`fedleak.attacks.kkt.graph_safe.iterate_graph_safe`); both check
finiteness every ``log_every`` steps, stop at a failed check and return the last state that
passed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fedleak.attacks.base import Progress
from fedleak.attacks.kkt.loss import KKTTerms

SGD_MOMENTUM = 0.9


@dataclass
class KKTConfig:
    """Hyperparameters of the KKT attack; ranges default to the random search of App. B.2."""

    iterations: int = field(
        default=10000, metadata={"help": "SGD steps per run (paper: 100,000)"}
    )
    runs: int = field(
        default=1,
        metadata={"help": "random-search runs, candidates of all runs pooled (paper: 100)"},
    )
    first_run: int = field(
        default=0,
        metadata={"help": "index of the first run: run r draws its settings and init from "
                  "(seed, r), so a search can be split into chunks"},
    )
    lr_low: float = field(default=1e-5, metadata={"help": "learning rate, log-uniform from"})
    lr_high: float = field(default=1.0, metadata={"help": "learning rate, log-uniform to"})
    optimizer: str = field(
        default="sgd",
        metadata={"help": "'sgd' (paper: SGD, momentum 0.9) or 'adam' (not in the paper: "
                  "per-coordinate steps, robust to the model's scale)"},
    )
    lambda_init: float = field(
        default=1.0,
        metadata={"help": "lambda_i ~ U[0, lambda_init] (paper: 1; the authors' code scales "
                  "the sum by 1/m, i.e. U[0, 1/m] in eq. (6)'s units)"},
    )
    lambda_lr: float = field(
        default=0.0,
        metadata={"help": "learning rate of the multipliers; 0 = the run's lr (paper). The "
                  "authors' code steps lambda with its own lr"},
    )
    sigma_x_low: float = field(default=1e-6, metadata={"help": "init scale of x, log-uniform from"})
    sigma_x_high: float = field(default=1.0, metadata={"help": "init scale of x, log-uniform to"})
    alpha_low: float = field(
        default=10.0, metadata={"help": "sharpness of the ReLU's sigmoid derivative, uniform from"}
    )
    alpha_high: float = field(default=500.0, metadata={"help": "ReLU sigmoid sharpness, to"})
    lambda_min_low: float = field(
        default=1e-4, metadata={"help": "lambda_min of L_lambda, log-uniform from"}
    )
    lambda_min_high: float = field(default=1.0, metadata={"help": "lambda_min, log-uniform to"})
    alpha1: float = field(default=1.0, metadata={"help": "weight of L_stationary, eq. (8)"})
    alpha2: float = field(default=5.0, metadata={"help": "weight of L_lambda, eq. (8)"})
    alpha3: float = field(
        default=1.0, metadata={"help": "weight of L_prior (0 = no prior), eq. (8)"}
    )
    num_candidates: int = field(
        default=0, metadata={"help": "m, candidates per run; 0 = 2n (needs n known)"}
    )
    float64: bool = field(
        default=False,
        metadata={"help": "optimise in double precision (the authors' default; float32 with a "
                  "tiny sigma_x meets subnormal numbers, slow on CPUs)"},
    )
    log_every: int = field(
        default=100, metadata={"help": "report progress and check finiteness every k steps"}
    )
    capture: bool = field(
        default=True,
        metadata={"help": "on CUDA, record one step as a CUDA graph and replay it "
                  "(falls back to eager with a notice when capture fails)"},
    )
    pack: int = field(
        default=1,
        metadata={"help": "runs optimised side by side as one batched computation (each "
                  "with its own settings and result); 1 = one run after another"},
    )

    def __post_init__(self) -> None:
        """Check the budget, optimiser and ranges; raise ``ValueError`` naming the bad one."""
        for name in ("iterations", "runs", "log_every", "pack"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.first_run < 0 or self.num_candidates < 0 or not self.lambda_lr >= 0:
            raise ValueError("first_run, num_candidates and lambda_lr must be >= 0")
        if self.optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer must be 'sgd' or 'adam', got {self.optimizer!r}")
        if not self.lambda_init > 0:
            raise ValueError(f"lambda_init must be positive, got {self.lambda_init}")
        for name in ("lr", "sigma_x", "alpha", "lambda_min"):
            low, high = getattr(self, f"{name}_low"), getattr(self, f"{name}_high")
            if not (math.isfinite(low) and math.isfinite(high) and 0 < low <= high):
                raise ValueError(f"{name} range must satisfy 0 < low <= high, got [{low}, {high}]")
        for name in ("alpha1", "alpha2", "alpha3"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class RunSettings:
    """The four hyperparameters of one random-search run (App. B.2)."""

    lr: float
    sigma_x: float
    alpha: float
    lambda_min: float


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return low if low == high else math.exp(rng.uniform(math.log(low), math.log(high)))


def sample_run_settings(config: KKTConfig, seed: int, run: int) -> RunSettings:
    """Draw run ``run``'s settings from the config's ranges, reproducibly from (seed, run)."""
    rng = random.Random(f"kkt-settings-{seed}-{run}")
    return RunSettings(
        lr=_log_uniform(rng, config.lr_low, config.lr_high),
        sigma_x=_log_uniform(rng, config.sigma_x_low, config.sigma_x_high),
        alpha=config.alpha_low
        if config.alpha_low == config.alpha_high
        else rng.uniform(config.alpha_low, config.alpha_high),
        lambda_min=_log_uniform(rng, config.lambda_min_low, config.lambda_min_high),
    )


@dataclass(frozen=True)
class RunLoop:
    """What one run's loop needs: eq. (8) at (x, λ), the run's settings and the options.

    Also where the run's iterations fall in the search (``offset``, for progress).
    """

    objective: Callable[[torch.Tensor, torch.Tensor], KKTTerms]
    settings: RunSettings
    config: KKTConfig
    offset: int
    progress: Progress | None

    @property
    def total(self) -> int:
        """The search's iterations: T per run × runs."""
        return self.config.iterations * self.config.runs

    @property
    def lambda_lr(self) -> float:
        """λ's step: ``lambda_lr``, or the run's lr when 0 (the paper)."""
        return self.config.lambda_lr or self.settings.lr


def iterate_eager(loop: RunLoop, x: torch.Tensor, lambdas: torch.Tensor
            ) -> tuple[tuple[torch.Tensor, torch.Tensor], bool, str | None]:
    """Run the eager loop: SGD with momentum (or Adam) on (x, λ) from ``torch.optim``.

    Returns the last state that passed a finiteness check, whether a check failed (the loop
    stops there), and no notice.
    """
    cfg, settings = loop.config, loop.settings
    groups: list[dict[str, Any]] = [
        {"params": [x]}, {"params": [lambdas], "lr": loop.lambda_lr}]
    optimiser: torch.optim.Optimizer
    if cfg.optimizer == "adam":
        optimiser = torch.optim.Adam(groups, lr=settings.lr)
    else:
        optimiser = torch.optim.SGD(groups, lr=settings.lr, momentum=SGD_MOMENTUM)
    last = (x.detach().clone(), lambdas.detach().clone())
    for iteration in range(cfg.iterations):
        terms = loop.objective(x, lambdas)
        x.grad, lambdas.grad = torch.autograd.grad(terms.total, [x, lambdas])
        if iteration % cfg.log_every == 0:
            value = float(terms.total.detach())
            if not (math.isfinite(value) and bool(torch.isfinite(x).all())):
                return last, True, None
            last = (x.detach().clone(), lambdas.detach().clone())
            if loop.progress is not None:
                loop.progress(loop.offset + iteration + 1, loop.total, value)
        optimiser.step()
    return last, False, None
