"""A zoo of broken DP defenses, each written against fedleak's documented plug-in API, each
declaring the correct mechanism and implementing it with one real bug. ``bench/audit_bugs.py``
audits every one with the default ``fedleak audit``; docs/audit.md has the table.

The classes of bug, from the literature and from incident reports:

- **noise on a subset of tensors** (``dp-noise-weights-only``, ``noise-weights-only``): noise
  added to weight matrices only, biases released clean — what a noise loop over "the
  parameters that matter", or over one parameter group of an optimiser, does;
- **scaled (short) noise** (``dp-short-noise``): std 10 % short of σC (a miscalibrated σ);
- **std passed as a variance** (``dp-noise-as-variance``): N(0, σ²C²) drawn with std (σC)²;
- **wrong normalisation** (``dp-noise-over-batch-twice``): the noise divided by the batch size
  twice (once by hand, once by the averaging);
- **clip of the wrong geometry** (``dp-clip-per-tensor``): each tensor clipped to C while the
  accountant assumes one total clip to C (per-layer clipping accounted as flat);
- **clip norm not the declared one** (``dp-clip-norm-default``): the clip uses a hard-coded
  default 1.0 while noise and claim use the configured C;
- **noise reused / fixed seed** (``dp-fixed-seed``): a generator seeded with 0 on every call,
  so every release carries the same noise (and it cancels out of any difference);
- **shuffled batches accounted as Poisson** (``dp-shuffle-as-poisson``; Chua et al. 2024):
  the accountant assumes Poisson sampling at q = B/n while the batches are fixed slices;
- **clipping after noising** (``noise-clip-after-noise``): an update defense that adds the
  noise first and clips the noisy update, so the update itself is never bounded;
- **noise of the wrong law** (``dp-uniform-noise``): uniform noise of the declared variance
  (a hand-rolled sampler), bounded, so a canary that pushes a coordinate past its edge is
  certain to show;
- **per-batch instead of per-example clipping** (``dp-clip-the-batch``): the batch's summed
  gradient is clipped to C, not each example's, so one example can move it by 2C, and by
  anything the others' sum leaves room for.

and the assumptions a run's accountant makes (issue 48):

- **noise reused across releases** (``dp-noise-every-second-call``, ``dp-noise-seed-cycle``,
  ``noise-every-second-round``): a noise buffer refreshed every second call (per example, and
  per round at the update stage), a generator seeded by a call counter that wraps with period
  5 — every single release is the declared Gaussian, consecutive ones share their noise;
- **noise calibrated to the batch** (``dp-batch-calibrated-noise``): std σ·max_i ‖ḡ_i‖;
- **a clip bound computed from the batch** (``dp-clip-from-batch``): the batch's median norm,
  noise σ times it;
- **correlated noise** (``dp-correlated-noise``): one scalar draw per tensor.

Put this folder on ``PYTHONPATH`` to install it (it is laid out as pip installs a package).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from fedleak.defenses import PerExampleDefense, UpdateDefense
from fedleak.defenses.mechanism import Clip, Mechanism, Noise, Sampling


@dataclass
class DPConfig:
    noise_multiplier: float = field(default=1.0, metadata={"help": "σ: noise std / C"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "per-example clip norm C"})
    poisson: bool = field(default=False, metadata={"help": "declare Poisson sampling"})
    shortfall: float = field(default=0.9, metadata={"help": "dp-short-noise: std factor"})

    def __post_init__(self) -> None:
        if not self.noise_multiplier > 0 or not self.max_grad_norm > 0:
            raise ValueError("noise-multiplier and max-grad-norm must be > 0")


def clip_total(per_example: list[torch.Tensor], bound: float) -> list[torch.Tensor]:
    """Σ_i g_i · min(1, C / ‖g_i‖): the sum of per-example gradients clipped as a whole."""
    norms = torch.stack([g.reshape(len(g), -1).norm(2, dim=-1) for g in per_example],
                        dim=1).norm(2, dim=1)
    factor = (bound / (norms + 1e-6)).clamp(max=1.0)
    return [torch.einsum("i,i...", factor, g) for g in per_example]


class DeclaredDPSGD(PerExampleDefense):
    """What every per-example bug declares: per-example total clip to C, N(0, σ²C²) on each
    step's sum, fixed (or Poisson) batches. Subclasses implement it wrong, one way each."""

    Config = DPConfig

    def mechanism(self) -> Mechanism:
        c = self.config
        return Mechanism("per-example", clip=Clip(c.max_grad_norm),
                         noise=Noise(c.noise_multiplier * c.max_grad_norm),
                         sampling=Sampling("poisson" if c.poisson else "fixed"),
                         accountant="rdp", unit="example")

    def std(self) -> float:
        return self.config.noise_multiplier * self.config.max_grad_norm

    def privatise(self, per_example: list[torch.Tensor], expected_batch_size: int,
                  generator: torch.Generator) -> list[torch.Tensor]:
        summed = clip_total(per_example, self.config.max_grad_norm)
        return [(s + self.noise(s, i, generator)) / expected_batch_size
                for i, s in enumerate(summed)]

    def noise(self, summed: torch.Tensor, index: int, generator: torch.Generator) \
            -> torch.Tensor:
        return torch.normal(0.0, self.std(), summed.shape, generator=generator)


class NoiseWeightsOnly(DeclaredDPSGD):
    """BUG: noise only on weight matrices; biases (1-D tensors) are released clean."""

    def noise(self, summed: torch.Tensor, index: int, generator: torch.Generator) \
            -> torch.Tensor:
        noise = super().noise(summed, index, generator)
        return noise if summed.dim() >= 2 else torch.zeros_like(summed)


class ShortNoise(DeclaredDPSGD):
    """BUG: the noise std is ``shortfall`` × σC."""

    def std(self) -> float:
        return self.config.shortfall * super().std()


class NoiseAsVariance(DeclaredDPSGD):
    """BUG: the variance (σC)² is passed where the std belongs."""

    def std(self) -> float:
        return super().std() ** 2


class NoiseOverBatchTwice(DeclaredDPSGD):
    """BUG: the noise is averaged by hand and then again with the sum."""

    def privatise(self, per_example: list[torch.Tensor], expected_batch_size: int,
                  generator: torch.Generator) -> list[torch.Tensor]:
        summed = clip_total(per_example, self.config.max_grad_norm)
        return [(s + self.noise(s, i, generator) / expected_batch_size) / expected_batch_size
                for i, s in enumerate(summed)]


class ClipPerTensor(DeclaredDPSGD):
    """BUG: each tensor is clipped to C on its own; the accountant assumes one total clip."""

    def privatise(self, per_example: list[torch.Tensor], expected_batch_size: int,
                  generator: torch.Generator) -> list[torch.Tensor]:
        out = []
        for i, g in enumerate(per_example):
            summed = clip_total([g], self.config.max_grad_norm)[0]
            out.append((summed + self.noise(summed, i, generator)) / expected_batch_size)
        return out


class UniformNoise(DeclaredDPSGD):
    """BUG: the noise has the declared std but is uniform: (U − ½)·√12·σC."""

    def noise(self, summed: torch.Tensor, index: int, generator: torch.Generator) \
            -> torch.Tensor:
        uniform = torch.rand(summed.shape, generator=generator, dtype=summed.dtype) - 0.5
        return uniform * math.sqrt(12) * self.std()


class ClipTheBatch(DeclaredDPSGD):
    """BUG: the sum of the batch's gradients is clipped to C instead of each example's."""

    def privatise(self, per_example: list[torch.Tensor], expected_batch_size: int,
                  generator: torch.Generator) -> list[torch.Tensor]:
        summed = clip_total([g.sum(0, keepdim=True) for g in per_example],
                            self.config.max_grad_norm)
        return [(s + self.noise(s, i, generator)) / expected_batch_size
                for i, s in enumerate(summed)]


class ClipNormDefault(DeclaredDPSGD):
    """BUG: the clip uses a hard-coded 1.0, not the configured C (noise and claim use C)."""

    def privatise(self, per_example: list[torch.Tensor], expected_batch_size: int,
                  generator: torch.Generator) -> list[torch.Tensor]:
        summed = clip_total(per_example, 1.0)
        return [(s + self.noise(s, i, generator)) / expected_batch_size
                for i, s in enumerate(summed)]


class FixedSeed(DeclaredDPSGD):
    """BUG: the noise comes from a generator seeded with 0 on every call."""

    def privatise(self, per_example: list[torch.Tensor], expected_batch_size: int,
                  generator: torch.Generator) -> list[torch.Tensor]:
        return super().privatise(per_example, expected_batch_size,
                                 torch.Generator().manual_seed(0))


class ShuffleAsPoisson(DeclaredDPSGD):
    """BUG: declares Poisson sampling (so the accountant amplifies by q) but asks the victim
    for its fixed batches."""

    def mechanism(self) -> Mechanism:
        declared = super().mechanism()
        return Mechanism(declared.stage, clip=declared.clip, noise=declared.noise,
                         sampling=Sampling("poisson"), accountant="rdp", unit="example")

    def sample_rate(self, num_images: int, batch_size: int) -> float | None:
        return None


@dataclass
class UpdateNoiseConfig:
    clip_norm: float = field(default=1.0, metadata={"help": "S: the update's L2 bound"})
    sigma: float = field(default=1.0, metadata={"help": "noise std s"})


class ClipAfterNoise(UpdateDefense):
    """BUG: declares clip to S then N(0, s²); adds the noise first and clips the noisy update."""

    Config = UpdateNoiseConfig

    def gaussian_claim(self) -> None:
        return None

    def mechanism(self) -> Mechanism:
        c = self.config
        return Mechanism("update", clip=Clip(c.clip_norm), noise=Noise(c.sigma))

    def apply(self, update: list[torch.Tensor], generator: torch.Generator) -> list[torch.Tensor]:
        noisy = [u + self.config.sigma * torch.randn(u.shape, generator=generator,
                                                      dtype=u.dtype) for u in update]
        norm = math.sqrt(sum(float((u.double() ** 2).sum()) for u in noisy))
        scale = min(1.0, self.config.clip_norm / max(norm, 1e-12))
        return [u * scale for u in noisy]


class UpdateNoiseWeightsOnly(UpdateDefense):
    """BUG: declares clip to S then N(0, s²) on the update; noises weight matrices only."""

    Config = UpdateNoiseConfig

    def mechanism(self) -> Mechanism:
        c = self.config
        return Mechanism("update", clip=Clip(c.clip_norm), noise=Noise(c.sigma))

    def apply(self, update: list[torch.Tensor], generator: torch.Generator) -> list[torch.Tensor]:
        norm = math.sqrt(sum(float((u.double() ** 2).sum()) for u in update))
        scale = min(1.0, self.config.clip_norm / max(norm, 1e-12))
        return [u * scale + (self.config.sigma * torch.randn(u.shape, generator=generator,
                                                             dtype=u.dtype)
                             if u.dim() >= 2 else 0.0) for u in update]


class NoiseEverySecondCall(DeclaredDPSGD):
    """BUG: the noise vector is cached and redrawn only every second call (a noise buffer
    refreshed lazily): each release alone is the declared Gaussian, two consecutive ones
    share their noise."""

    def __init__(self, config: DPConfig | None = None) -> None:
        super().__init__(config)
        self._calls = 0
        self._cached: dict[int, torch.Tensor] = {}

    def noise(self, summed: torch.Tensor, index: int, generator: torch.Generator) \
            -> torch.Tensor:
        if index == 0:
            self._calls += 1
        if self._calls % 2 == 1 or index not in self._cached:
            self._cached[index] = super().noise(summed, index, generator)
        return self._cached[index]


@dataclass
class CycleConfig(DPConfig):
    period: int = field(default=5, metadata={"help": "calls before the seeds repeat"})


class NoiseSeedCycle(DeclaredDPSGD):
    """BUG: the noise generator is seeded with a call counter modulo ``period`` (a counter
    that wraps, a seed list reused), so the noise repeats every ``period`` releases."""

    Config = CycleConfig

    def __init__(self, config: CycleConfig | None = None) -> None:
        super().__init__(config)
        self._calls = 0

    def privatise(self, per_example: list[torch.Tensor], expected_batch_size: int,
                  generator: torch.Generator) -> list[torch.Tensor]:
        self._calls += 1
        seeded = torch.Generator().manual_seed(1_000 + self._calls % self.config.period)
        return super().privatise(per_example, expected_batch_size, seeded)


class BatchCalibratedNoise(DeclaredDPSGD):
    """BUG: the noise std is σ · max_i ‖ḡ_i‖ (the batch's largest clipped norm) instead of
    σC: equal to the declared noise whenever an example reaches the clip bound, less on a
    batch whose gradients are all small."""

    def privatise(self, per_example: list[torch.Tensor], expected_batch_size: int,
                  generator: torch.Generator) -> list[torch.Tensor]:
        c = self.config
        norms = torch.stack([g.reshape(len(g), -1).norm(2, dim=-1) for g in per_example],
                            dim=1).norm(2, dim=1)
        scale = float(norms.clamp(max=c.max_grad_norm).max()) if len(norms) else 0.0
        summed = clip_total(per_example, c.max_grad_norm)
        return [(s + torch.normal(0.0, c.noise_multiplier * scale, s.shape,
                                  generator=generator)) / expected_batch_size
                for s in summed]


class ClipFromBatch(DeclaredDPSGD):
    """BUG: the clip bound is the batch's median per-example norm (at most C), and the noise
    σ times that bound (adaptive clipping without accounting for it): on a batch whose
    gradients are small both shrink, while the claim keeps σ and C."""

    def privatise(self, per_example: list[torch.Tensor], expected_batch_size: int,
                  generator: torch.Generator) -> list[torch.Tensor]:
        c = self.config
        norms = torch.stack([g.reshape(len(g), -1).norm(2, dim=-1) for g in per_example],
                            dim=1).norm(2, dim=1)
        bound = min(float(norms.median()), c.max_grad_norm) if len(norms) else c.max_grad_norm
        summed = clip_total(per_example, bound)
        return [(s + torch.normal(0.0, c.noise_multiplier * bound, s.shape,
                                  generator=generator)) / expected_batch_size
                for s in summed]


class CorrelatedNoise(DeclaredDPSGD):
    """BUG: one scalar draw per tensor, added to every coordinate (a broadcast of the wrong
    shape): each coordinate has the declared std, but any two subtract to no noise."""

    def noise(self, summed: torch.Tensor, index: int, generator: torch.Generator) \
            -> torch.Tensor:
        scalar = torch.normal(0.0, self.std(), (1,), generator=generator)
        return scalar.expand(summed.shape).clone()


class UpdateNoiseEverySecondRound(UpdateDefense):
    """BUG: declares clip to S then N(0, s²) on the update; the noise is redrawn only every
    second round (a cached noise tensor), so two consecutive rounds share it."""

    Config = UpdateNoiseConfig

    def __init__(self, config: UpdateNoiseConfig | None = None) -> None:
        super().__init__(config)
        self._rounds = 0
        self._cached: list[torch.Tensor] = []

    def mechanism(self) -> Mechanism:
        c = self.config
        return Mechanism("update", clip=Clip(c.clip_norm), noise=Noise(c.sigma))

    def apply(self, update: list[torch.Tensor], generator: torch.Generator) -> list[torch.Tensor]:
        self._rounds += 1
        if self._rounds % 2 == 1 or len(self._cached) != len(update):
            self._cached = [self.config.sigma * torch.randn(u.shape, generator=generator,
                                                            dtype=u.dtype) for u in update]
        norm = math.sqrt(sum(float((u.double() ** 2).sum()) for u in update))
        scale = min(1.0, self.config.clip_norm / max(norm, 1e-12))
        return [u * scale + n for u, n in zip(update, self._cached, strict=True)]
