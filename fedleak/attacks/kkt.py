"""Training-set reconstruction from a released model: the KKT attack of Haim et al. (NeurIPS 2022).

A homogeneous ReLU network Φ(θ; ·) trained with the logistic loss by gradient flow converges in
direction to a KKT point of the max-margin problem min ½‖θ‖² s.t. y_i Φ(θ; x_i) ≥ 1 (their
Theorem 3.1, after Lyu & Li 2019, Ji & Telgarsky 2020). Stationarity, eq. (2), says

    θ = Σ_{i=1}^n λ_i y_i ∇_θ Φ(θ; x_i),   λ_i ≥ 0  (dual feasibility, eq. (4)),

so the trained parameters are a combination of the network's gradients at the training points.
Given θ, the attack looks for m candidates x_1 … x_m with labels fixed to y_i = +1 for the first
m/2 and −1 for the rest (m = 2n, Sec. 5.2) and multipliers λ_i minimising eq. (8),

    L = α₁ ‖θ − Σ_i λ_i y_i ∇_θ Φ(θ; x_i)‖²               (L_stationary, eq. (6))
      + α₂ Σ_i max(−λ_i + λ_min, 0)                        (L_λ, eq. (7) with λ_min of App. B.2)
      + α₃ Σ_i mean_pixels[max(z − 1, 0) + max(−z − 1, 0)]  (L_prior, Sec. 5.2),

with α = (1, 5, 1) in the paper. L_prior's box is the released ``value_range`` ((−1, 1) in the
paper); it is averaged over the pixels of each candidate and summed over candidates, like L_λ.

Details, as in the paper (Sec. 5.2, App. B.2):

- The ReLU's derivative, a step function, is replaced in the *backward* pass by σ(α z) (the
  derivative of a softplus of sharpness α), while the forward stays ReLU
  (:class:`SmoothBackwardReLU`). It acts both inside ∇_θ Φ and when L is differentiated again with
  respect to x. The caller's model is never touched: every ``nn.ReLU`` of a deep copy is swapped.
- x_i ~ N(0, σ_x² I), λ_i ~ U[0, 1]; SGD with momentum 0.9 on (x, λ) with one learning rate.
  Three options leave the paper, their defaults keep to it: ``lambda_lr`` gives λ its own step
  (as the authors' code does), ``lambda_init`` scales λ's init (their code's Σ carries a 1/m),
  and ``optimizer="adam"`` replaces SGD. The objective's curvature grows with ‖θ‖ and with α
  near ReLU kinks, so SGD needs a step matched to the model (App. B.2 samples five decades of
  lr for that); Adam's per-coordinate steps are insensitive to that scale.
- A random search over the four hyperparameters, sampled per run from: lr log-uniform in
  [1e-5, 1], σ_x log-uniform in [1e-6, 1], α uniform in [10, 500], λ_min log-uniform in
  [1e-4, 1] (App. B.2; set low = high to fix one). Candidates of all runs are pooled.

Σ_i λ_i y_i ∇_θ Φ(θ; x_i) for all m candidates is one backward pass: it is ∇_θ of the scalar
Σ_i λ_i y_i Φ(θ; x_i), taken with ``create_graph`` so that L can be differentiated with respect
to x and λ (a double backward per iteration, no per-sample gradients).

A run whose objective stops being finite ends there and returns its last finite state (checked
every ``log_every`` iterations); ``extras["run_diverged"]`` says which runs did. On CUDA
(``capture``) one iteration is recorded as a CUDA graph and replayed
(:meth:`KKT.iterate_graph_safe`, the eager loop's maths with its state on the device).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn
from torch.func import functional_call

from fedleak.attacks.base import Attack, Progress
from fedleak.attacks.capture import (
    DeviceSGD,
    DeviceSignedAdam,
    capturable,
    constant_schedule,
    run_iterations,
)
from fedleak.attacks.kkt_packed import (
    PackedRuns,
    iterate_packed,
    pack_progress,
    packed_objective,
    replace_relus,
    with_detached_smooth_relu,
)
from fedleak.attacks.observation import Reconstruction
from fedleak.attacks.registry import register_attack
from fedleak.attacks.release import ReleasedModel

SGD_MOMENTUM = 0.9


class SmoothBackwardReLU(torch.autograd.Function):
    """ReLU forward, ``grad · σ(α z)`` backward (App. B.2); the backward is twice differentiable."""

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, alpha: float) -> torch.Tensor:
        ctx.save_for_backward(z)
        ctx.alpha = alpha
        return z.clamp_min(0)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        (z,) = ctx.saved_tensors
        return grad_output * torch.sigmoid(ctx.alpha * z), None


class SmoothReLU(nn.Module):
    """Module form of :class:`SmoothBackwardReLU` with sharpness ``alpha``."""

    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.alpha = float(alpha)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return SmoothBackwardReLU.apply(z, self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"


def with_smooth_relu(model: nn.Module, alpha: float) -> tuple[nn.Module, int]:
    """A deep copy of ``model`` with every ``nn.ReLU`` replaced by ``SmoothReLU(alpha)``.

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
    out = functional_call(model, parameters, (x,))
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


def candidate_labels(m: int) -> torch.Tensor:
    """y_i = +1 for the first ⌈m/2⌉ candidates and −1 for the rest (Sec. 3.2)."""
    labels = -torch.ones(m)
    labels[: (m + 1) // 2] = 1
    return labels


@dataclass
class _RunResult:
    x: torch.Tensor
    lambdas: torch.Tensor
    objective: float
    stationarity: float
    diverged: bool
    notice: str | None = None


@register_attack("kkt")
class KKT(Attack[ReleasedModel]):
    """Haim et al.'s reconstruction of a released model's training set from its KKT conditions."""

    Config = KKTConfig
    config: KKTConfig
    threat_model: ClassVar[str] = "release"

    def num_candidates(self, released: ReleasedModel) -> int:
        """m: the config's override, else 2n."""
        if self.config.num_candidates:
            return self.config.num_candidates
        if released.num_train is None:
            raise ValueError(
                "the training-set size n is unknown: set the kkt option num-candidates (m >= 2n)"
            )
        return 2 * released.num_train

    def recover(
        self,
        released: ReleasedModel,
        *,
        device: torch.device,
        seed: int,
        progress: Progress | None,
    ) -> Reconstruction:
        """Run the random search; return every run's candidates x_i (model input space).

        ``images`` is ``[runs·m, *input_shape]`` in the model's input space (``value_range``),
        ``labels`` the fixed y_i ∈ {+1, −1} (int64), ``extras`` holds ``lambdas`` ``[runs·m]``,
        ``run_index`` ``[runs·m]``, and per run ``run_settings``, ``run_objectives``,
        ``run_stationarity`` and ``run_diverged``.
        """
        cfg = self.config
        dtype = torch.float64 if cfg.float64 else torch.float32
        dev = device
        m = self.num_candidates(released)
        model, swapped = with_smooth_relu(released.model, cfg.alpha_low)
        model = model.to(device=dev, dtype=dtype)
        parameters = {
            name: p.detach().to(device=dev, dtype=dtype).requires_grad_(True)
            for name, p in released.parameter_dict().items()
        }
        labels = candidate_labels(m).to(device=dev, dtype=dtype)
        runs = range(cfg.first_run, cfg.first_run + cfg.runs)
        results: list[_RunResult] = []
        graph_safe = cfg.capture and capturable(dev)
        settings = [sample_run_settings(cfg, seed, run) for run in runs]
        generators = [torch.Generator().manual_seed(seed * 1_000_003 + run) for run in runs]
        for k in range(0, len(runs), cfg.pack):
            chunk = slice(k, k + cfg.pack)
            if cfg.pack > 1:
                results += self.run_pack(model, parameters, labels, released, settings[chunk],
                                         generators[chunk], offset=k * cfg.iterations,
                                         progress=progress)
                continue
            set_relu_alpha(model, settings[k].alpha)
            results.append(
                self.run(model, parameters, labels, released, settings[k], generators[k],
                         offset=k * cfg.iterations, progress=progress, graph_safe=graph_safe)
            )
        notices = sorted({r.notice for r in results if r.notice})
        objectives = [r.objective for r in results]
        return Reconstruction(
            images=torch.cat([r.x for r in results]),
            labels=labels.long().repeat(len(results)),
            objective=min(objectives, key=lambda v: v if math.isfinite(v) else math.inf),
            iterations=cfg.iterations * cfg.runs,
            restart_objectives=objectives,
            warnings=notices,
            extras={
                "captured": graph_safe and not notices,
                "lambdas": torch.cat([r.lambdas for r in results]),
                "run_index": torch.tensor(list(runs)).repeat_interleave(m),
                "run_settings": [asdict(s) for s in settings],
                "run_objectives": objectives,
                "run_stationarity": [r.stationarity for r in results],
                "run_diverged": [r.diverged for r in results],
                "num_candidates": m,
                "relu_swapped": swapped,
                "value_range": released.value_range,
            },
        )

    def initial_state(
        self, released: ReleasedModel, settings: RunSettings, generator: torch.Generator,
        labels: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x ~ N(0, σ_x² I) ``[m, *input_shape]``, λ ~ U[0, λ_init] ``[m]``, from ``generator``."""
        dev, dtype = labels.device, labels.dtype
        m = labels.shape[0]
        x = torch.randn((m, *released.input_shape), generator=generator, dtype=dtype)
        lambdas = torch.rand(m, generator=generator, dtype=dtype) * self.config.lambda_init
        return (x * settings.sigma_x).to(dev), lambdas.to(dev)

    def run(
        self,
        model: nn.Module,
        parameters: dict[str, torch.Tensor],
        labels: torch.Tensor,
        released: ReleasedModel,
        settings: RunSettings,
        generator: torch.Generator,
        *,
        offset: int,
        progress: Progress | None,
        graph_safe: bool = False,
    ) -> _RunResult:
        """One random-search run from :meth:`initial_state`, then the iterations.

        Eagerly with ``torch.optim`` or, ``graph_safe``, as a step whose whole state lives on
        the device, captured as a CUDA graph on CUDA (:meth:`iterate_graph_safe`). Both check
        finiteness every ``log_every`` steps and return the last state that passed.
        """
        x, lambdas = self.initial_state(released, settings, generator, labels)
        x.requires_grad_(True)
        lambdas.requires_grad_(True)
        objective = self._objective(model, parameters, labels, released, settings)
        iterate = self.iterate_graph_safe if graph_safe else self.iterate
        last, diverged, notice = iterate(objective, x, lambdas, settings, offset, progress)
        final = (x.detach().clone(), lambdas.detach().clone())
        return self._finish(objective, last, final, diverged, notice, offset, progress)

    def run_pack(
        self,
        model: nn.Module,
        parameters: dict[str, torch.Tensor],
        labels: torch.Tensor,
        released: ReleasedModel,
        settings: list[RunSettings],
        generators: list[torch.Generator],
        *,
        offset: int,
        progress: Progress | None,
    ) -> list[_RunResult]:
        """K runs as one batched computation (:mod:`fedleak.attacks.kkt_packed`).

        Each run draws the init it draws alone and keeps its own settings; the packed step is
        captured as a CUDA graph on CUDA (``capture``). Each run is then finished as a run
        alone is: its final state if that is finite, else its last passing state.
        """
        cfg = self.config
        dev, dtype = labels.device, labels.dtype
        states = [self.initial_state(released, s, g, labels)
                  for s, g in zip(settings, generators, strict=True)]
        model_output(model, parameters, states[0][0][:1])  # one scalar output per input
        packed_model, sharpness = with_detached_smooth_relu(released.model)
        packed_model = packed_model.to(device=dev, dtype=dtype)

        def per_run(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=dev)

        runs = PackedRuns(
            x=torch.stack([x for x, _ in states]),
            lambdas=torch.stack([lam for _, lam in states]),
            lr=per_run([s.lr for s in settings]),
            lambda_lr=per_run([cfg.lambda_lr or s.lr for s in settings]),
            alpha=per_run([s.alpha for s in settings]),
            lambda_min=per_run([s.lambda_min for s in settings]),
        )
        objective = packed_objective(
            packed_model, sharpness, parameters, labels,
            weights=(cfg.alpha1, cfg.alpha2, cfg.alpha3), value_range=released.value_range)
        outcome = iterate_packed(
            objective, runs, iterations=cfg.iterations, optimizer=cfg.optimizer,
            momentum=SGD_MOMENTUM, log_every=cfg.log_every, capture=cfg.capture,
            report=pack_progress(progress, offset, len(settings), cfg.iterations * cfg.runs))
        results = []
        for k, run_settings in enumerate(settings):
            set_relu_alpha(model, run_settings.alpha)
            results.append(self._finish(
                self._objective(model, parameters, labels, released, run_settings),
                (outcome.last[0][k].clone(), outcome.last[1][k].clone()),
                (outcome.final[0][k].clone(), outcome.final[1][k].clone()),
                outcome.diverged[k], outcome.notice, offset + k * cfg.iterations, None))
        if progress is not None:
            finite = [r.objective for r in results if math.isfinite(r.objective)]
            progress(offset + len(settings) * cfg.iterations, cfg.iterations * cfg.runs,
                     min(finite, default=math.inf))
        return results

    def _objective(
        self, model: nn.Module, parameters: dict[str, torch.Tensor], labels: torch.Tensor,
        released: ReleasedModel, settings: RunSettings,
    ) -> Callable[[torch.Tensor, torch.Tensor], KKTTerms]:
        cfg = self.config

        def objective(x: torch.Tensor, lambdas: torch.Tensor) -> KKTTerms:
            return kkt_objective(
                model, parameters, x, lambdas, labels,
                alphas=(cfg.alpha1, cfg.alpha2, cfg.alpha3),
                lambda_min=settings.lambda_min, value_range=released.value_range,
            )

        return objective

    def _finish(
        self,
        objective: Callable[[torch.Tensor, torch.Tensor], KKTTerms],
        last: tuple[torch.Tensor, torch.Tensor],
        final: tuple[torch.Tensor, torch.Tensor],
        diverged: bool,
        notice: str | None,
        offset: int,
        progress: Progress | None,
    ) -> _RunResult:
        """The run's result: its final state when that is finite, else its last passing one."""
        cfg = self.config
        if not diverged:
            terms = objective(*final)
            diverged = not bool(torch.isfinite(terms.total) and torch.isfinite(final[0]).all())
            if not diverged:
                last = final
                if progress is not None:
                    progress(offset + cfg.iterations, cfg.iterations * cfg.runs,
                             float(terms.total.detach()))
        if diverged:
            terms = objective(*last)
        return _RunResult(
            x=last[0],
            lambdas=last[1],
            objective=float(terms.total.detach()),
            stationarity=float(terms.stationarity.detach()),
            diverged=diverged,
            notice=notice,
        )

    def iterate(
        self,
        objective: Callable[[torch.Tensor, torch.Tensor], KKTTerms],
        x: torch.Tensor,
        lambdas: torch.Tensor,
        settings: RunSettings,
        offset: int,
        progress: Progress | None,
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], bool, str | None]:
        """The eager loop: SGD with momentum (or Adam) on (x, λ) from ``torch.optim``.

        Returns the last state that passed a finiteness check, whether a check failed (the
        loop stops there), and no notice.
        """
        cfg = self.config
        groups: list[dict[str, Any]] = [
            {"params": [x]}, {"params": [lambdas], "lr": cfg.lambda_lr or settings.lr}]
        optimiser: torch.optim.Optimizer
        if cfg.optimizer == "adam":
            optimiser = torch.optim.Adam(groups, lr=settings.lr)
        else:
            optimiser = torch.optim.SGD(groups, lr=settings.lr, momentum=SGD_MOMENTUM)
        total = cfg.iterations * cfg.runs
        last = (x.detach().clone(), lambdas.detach().clone())
        for iteration in range(cfg.iterations):
            terms = objective(x, lambdas)
            x.grad, lambdas.grad = torch.autograd.grad(terms.total, [x, lambdas])
            if iteration % cfg.log_every == 0:
                value = float(terms.total.detach())
                if not (math.isfinite(value) and bool(torch.isfinite(x).all())):
                    return last, True, None
                last = (x.detach().clone(), lambdas.detach().clone())
                if progress is not None:
                    progress(offset + iteration + 1, total, value)
            optimiser.step()
        return last, False, None

    def iterate_graph_safe(
        self,
        objective: Callable[[torch.Tensor, torch.Tensor], KKTTerms],
        x: torch.Tensor,
        lambdas: torch.Tensor,
        settings: RunSettings,
        offset: int,
        progress: Progress | None,
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], bool, str | None]:
        """:meth:`iterate`'s maths as a graph-safe step, captured as a CUDA graph on CUDA.

        The optimisers keep their state and step counter on the device
        (:class:`~fedleak.attacks.capture.DeviceSGD`,
        :class:`~fedleak.attacks.capture.DeviceSignedAdam` unsigned); at every ``log_every``-th
        step the device tests finiteness and, when it passes, copies (x, λ) into static
        buffers, so the host needs to read only the objective and that test, at those steps,
        and stops there when it failed. Returns as :meth:`iterate` does, with a notice when
        capture fell back to eager.
        """
        cfg = self.config
        dev, dtype = x.device, x.dtype
        lambda_lr = cfg.lambda_lr or settings.lr
        optimisers: list[DeviceSignedAdam | DeviceSGD]
        if cfg.optimizer == "adam":
            optimisers = [
                DeviceSignedAdam(x, constant_schedule(settings.lr), signed=False),
                DeviceSignedAdam(lambdas, constant_schedule(lambda_lr),
                                 signed=False)]
        else:
            optimisers = [
                DeviceSGD(x, constant_schedule(settings.lr), SGD_MOMENTUM),
                DeviceSGD(lambdas, constant_schedule(lambda_lr), SGD_MOMENTUM)]
        t = torch.zeros((), dtype=torch.int64, device=dev)
        passed = torch.ones((), dtype=torch.bool, device=dev)
        value = torch.zeros((), dtype=dtype, device=dev)
        last = (x.detach().clone(), lambdas.detach().clone())

        def step() -> None:
            terms = objective(x, lambdas)
            grads = torch.autograd.grad(terms.total, [x, lambdas])
            with torch.no_grad():
                check = t.remainder(cfg.log_every) == 0
                finite = torch.isfinite(terms.total) & torch.isfinite(x).all()
                passed.copy_(finite | ~check)
                keep = check & finite
                last[0].copy_(torch.where(keep, x, last[0]))
                last[1].copy_(torch.where(keep, lambdas, last[1]))
                value.copy_(terms.total)
                for optimiser, grad in zip(optimisers, grads, strict=True):
                    optimiser.step(grad)
                t.add_(1)

        diverged = False
        total = cfg.iterations * cfg.runs

        def on_step(done: int) -> bool:
            nonlocal diverged
            if (done - 1) % cfg.log_every != 0:
                return False
            if not bool(passed):
                diverged = True
                return True
            if progress is not None:
                progress(offset + done, total, float(value))
            return False

        notice = run_iterations(step, cfg.iterations, dev, capture=capturable(dev),
                                on_step=on_step)
        return last, diverged, notice
