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

The loss and its maths, the ReLU whose backward is smoothed (App. B.2), are
:mod:`fedleak.attacks.kkt.loss`. x_i ~ N(0, σ_x² I), λ_i ~ U[0, 1]; SGD with momentum 0.9 on
(x, λ) with one learning rate, in a random search over four hyperparameters sampled per run
(App. B.2, :mod:`fedleak.attacks.kkt.random_search`); the candidates of all runs are pooled. Runs
go one after the other or ``pack`` at a time as one batched computation
(:mod:`fedleak.attacks.kkt.packed_search`).

A run whose objective stops being finite ends there and returns its last finite state (checked
every ``log_every`` iterations); ``extras["run_diverged"]`` says which runs did. On CUDA
(``capture``) one iteration is recorded as a CUDA graph and replayed
(:mod:`fedleak.attacks.kkt.graph_safe`, the eager loop's maths with its state on the device).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import ClassVar

import torch
from torch import nn

from fedleak.attacks.attack_registry import register_attack
from fedleak.attacks.base import Attack, Progress
from fedleak.attacks.capture import capturable
from fedleak.attacks.kkt.graph_safe import iterate_graph_safe
from fedleak.attacks.kkt.loss import (
    KKTTerms,
    candidate_labels,
    kkt_objective,
    model_output,
    set_relu_alpha,
    with_smooth_relu,
)
from fedleak.attacks.kkt.packed_search import (
    PackedRuns,
    iterate_packed,
    pack_progress,
    packed_objective,
    with_detached_smooth_relu,
)
from fedleak.attacks.kkt.random_search import (
    SGD_MOMENTUM,
    KKTConfig,
    RunLoop,
    RunSettings,
    iterate_eager,
    sample_run_settings,
)
from fedleak.attacks.observation import Reconstruction
from fedleak.attacks.release import ReleasedModel


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
        """Draw the start: x ~ N(0, σ_x² I) ``[m, *input_shape]``, λ ~ U[0, λ_init] ``[m]``.

        Both from ``generator``.
        """
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

        Eagerly with ``torch.optim`` (:func:`~fedleak.attacks.kkt.random_search.iterate_eager`) or,
        ``graph_safe``, as a step whose whole state lives on the device, captured as a CUDA
        graph on CUDA (:func:`~fedleak.attacks.kkt.graph_safe.iterate_graph_safe`). Both check
        finiteness every ``log_every`` steps and return the last state that passed.
        """
        x, lambdas = self.initial_state(released, settings, generator, labels)
        x.requires_grad_(True)
        lambdas.requires_grad_(True)
        objective = self._objective(model, parameters, labels, released, settings)
        loop = RunLoop(objective, settings, self.config, offset, progress)
        iterate = iterate_graph_safe if graph_safe else iterate_eager
        last, diverged, notice = iterate(loop, x, lambdas)
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
        """K runs as one batched computation (:mod:`fedleak.attacks.kkt.packed_search`).

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
            objective, runs, iterations=cfg.iterations, optimiser=cfg.optimizer,
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
        """Return the run's result: its final state when finite, else its last passing one."""
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
