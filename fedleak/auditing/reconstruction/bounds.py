"""Reconstruction robustness: the most any attack can succeed against a DP mechanism.

Balle, Cherubin & Hayes 2022 (arXiv 2201.04845) define the informed adversary's success: the
target z is drawn from a prior π, the mechanism runs on D⁻ ∪ {z}, and the attack succeeds when
its guess lies within η of z. The prior's *baseline* κ = sup_ẑ π(ρ(ẑ, z) ≤ η) is what the best
fixed guess achieves without looking at the output. Hayes, Mahloujifar & Balle 2023 ("Bounding
Training Data Reconstruction in DP-SGD", NeurIPS 2023, arXiv 2302.07225, Thm. 2 and §3) show
that for a mechanism whose output on D⁻ ∪ {z} can be told from a reference output (the
mechanism without z) no better than the trade-off curve f allows,

    P[success] ≤ 1 − f(κ) =: β(κ)                       (reconstruction robustness bound)

— the largest probability under the "with target" output of an event whose probability under
the reference is κ (Neyman–Pearson: a likelihood-ratio set).

Adjacency. The proof compares M(D⁻ ∪ {z}) with the reference M(D⁻) — the same mechanism with
the target's contribution removed, which does not depend on z — so the trade-off curve needed
is the **add/remove** one, even when the game *replaces* one candidate by another. For DP-SGD
with clipping norm C and noise σC per step the target moves each step's sum by at most C:
μ = 1/σ per step. Under replace-one adjacency the sum moves by up to 2C (μ = 2/σ), a looser
bound that holds as well; :data:`ADJACENCIES` offers both, and fedleak's informed-adversary game
uses add/remove (the victim trains on D⁻ plus the target; the reference is D⁻).

Three ways to evaluate β:

- T full-batch Gaussian steps (sample rate q = 1): μ-GDP with μ = √T/σ (add/remove), so
  β(κ) = Φ(Φ⁻¹(κ) + μ) (:func:`gaussian_bound`).
- Poisson-subsampled DP-SGD (q < 1): the dominating pair per step is P = N(0, σ²) (reference)
  against Q = (1 − q)·N(0, σ²) + q·N(1, σ²) (with target), composed over T steps; β(κ) =
  Q(L > τ) where L = log dQ/dP = Σ_t log(1 − q + q·exp((2y_t − 1)/(2σ²))) and P(L > τ) = κ.
  :func:`subsampled_gaussian_bound` estimates it by Monte Carlo (Hayes et al. 2023, §3.2),
  with a standard error from independent batches.
- :func:`reconstruction_bound` picks the right one for (σ, q, T) and says which it used.

Formal guarantee: β bounds the success probability of *every* attack whose output depends on
the data only through the mechanism's output, for the prior's κ. Sharp edges: κ must be the
prior's true baseline (for an estimated κ see
:mod:`fedleak.auditing.reconstruction.prior_baseline`); the Monte Carlo value is an estimate (read
it with its standard error); a mechanism that is not the Gaussian one assumed here (a bug, another
noise) is not covered — that is what audits are for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: ``add-remove``: the reference is the mechanism without the target (sensitivity C);
#: ``replace-one``: the target replaced by the worst other record (sensitivity 2C).
ADJACENCIES = ("add-remove", "replace-one")
#: Monte Carlo samples per distribution by default (in :data:`MC_BATCHES` batches).
MC_SAMPLES = 200_000
MC_BATCHES = 20


class BoundError(ValueError):
    """Arguments for which no bound is defined; the message says what to change."""


@dataclass(frozen=True)
class ReconstructionBound:
    """β(κ) for one mechanism, how it was computed, and its Monte Carlo standard error."""

    value: float
    kappa: float
    noise_multiplier: float
    sample_rate: float
    steps: int
    adjacency: str
    method: str                      # "gaussian" (closed form), "monte-carlo" or "no-noise"
    standard_error: float = 0.0      # of a Monte Carlo estimate; 0 for a closed form
    mu: float | None = None          # the GDP parameter when q = 1

    def describe(self) -> str:
        """Describe the bound β(κ), its error and the mechanism in one line."""
        se = f" ± {self.standard_error:.4f}" if self.standard_error else ""
        mech = (f"σ = {self.noise_multiplier:g}, q = {self.sample_rate:g}, T = {self.steps}, "
                f"{self.adjacency}")
        return f"β(κ = {self.kappa:.4g}) = {self.value:.4f}{se} [{self.method}; {mech}]"


def _check(kappa: float, noise_multiplier: float, steps: int, adjacency: str) -> None:
    if not 0 < kappa < 1:
        raise BoundError(f"the prior's baseline κ must lie in (0, 1), got {kappa}")
    if not noise_multiplier >= 0 or not math.isfinite(noise_multiplier):
        raise BoundError(f"the noise multiplier σ must be finite and >= 0, got "
                         f"{noise_multiplier}")
    if not isinstance(steps, int | np.integer) or steps < 1:
        raise BoundError(f"steps T must be a whole number >= 1, got {steps!r}")
    if adjacency not in ADJACENCIES:
        raise BoundError(f"adjacency must be one of {', '.join(ADJACENCIES)}, got "
                         f"{adjacency!r}")


def gaussian_mu(noise_multiplier: float, steps: int = 1, adjacency: str = "add-remove") -> float:
    """μ of T full-batch Gaussian steps: √T/σ (add/remove) or 2√T/σ (replace-one)."""
    _check(0.5, noise_multiplier, steps, adjacency)
    if noise_multiplier == 0:
        return math.inf
    sensitivity = 2.0 if adjacency == "replace-one" else 1.0
    return sensitivity * math.sqrt(steps) / noise_multiplier


def bound_from_mu(kappa: float, mu: float) -> float:
    """β(κ) = Φ(Φ⁻¹(κ) + μ) for a μ-GDP mechanism (Hayes et al. 2023, Cor. 3)."""
    if not 0 < kappa < 1:
        raise BoundError(f"the prior's baseline κ must lie in (0, 1), got {kappa}")
    if math.isinf(mu):
        return 1.0
    from scipy.stats import norm  # here, not at import: every attacker process imports this

    return float(norm.cdf(norm.ppf(kappa) + mu))


def gaussian_bound(kappa: float, noise_multiplier: float, steps: int = 1,
                   adjacency: str = "add-remove") -> float:
    """β(κ) for T full-batch Gaussian steps with noise multiplier σ, in closed form."""
    _check(kappa, noise_multiplier, steps, adjacency)
    return bound_from_mu(kappa, gaussian_mu(noise_multiplier, steps, adjacency))


@dataclass(frozen=True)
class MonteCarloBound:
    """A Monte Carlo estimate of β(κ) and its standard error (from batch means)."""

    value: float
    standard_error: float
    samples: int


def privacy_loss(y: np.ndarray, noise_multiplier: float, sample_rate: float) -> np.ndarray:
    """L(y) = Σ_t log(1 − q + q·exp((2y_t − 1)/(2σ²))), summed over the last axis."""
    a = (2 * y - 1) / (2 * noise_multiplier ** 2)
    if sample_rate >= 1:
        return np.asarray(a.sum(axis=-1))
    terms = np.logaddexp(math.log1p(-sample_rate), math.log(sample_rate) + a)
    return np.asarray(terms.sum(axis=-1))


def subsampled_gaussian_bound(
    kappa: float,
    noise_multiplier: float,
    sample_rate: float,
    steps: int = 1,
    samples: int = MC_SAMPLES,
    seed: int = 0,
    batches: int = MC_BATCHES,
) -> MonteCarloBound:
    """β(κ) for T Poisson-subsampled Gaussian steps by Monte Carlo (add/remove adjacency).

    Per batch: ``samples/batches`` draws of y ~ P give τ, the (1 − κ)-quantile of L under the
    reference; as many draws of y ~ Q give the fraction with L > τ. The estimate is the mean
    over batches and its standard error their spread / √batches (which covers the error of τ).
    """
    _check(kappa, noise_multiplier, steps, "add-remove")
    if not 0 < sample_rate <= 1:
        raise BoundError(f"the sample rate q must lie in (0, 1], got {sample_rate}")
    if batches < 2 or samples < batches * 10:
        raise BoundError(f"use at least 2 batches of 10 samples (got {samples} samples in "
                         f"{batches} batches)")
    if noise_multiplier == 0:
        return MonteCarloBound(1.0, 0.0, samples)
    rng = np.random.default_rng(seed)
    per_batch = samples // batches
    chunk = max(1, 4_000_000 // steps)  # draws per array, to bound memory (~32 MB)
    estimates = []
    for _ in range(batches):
        reference = _losses(rng, per_batch, steps, noise_multiplier, sample_rate, chunk,
                            with_target=False)
        tau = float(np.quantile(reference, 1 - kappa))
        target = _losses(rng, per_batch, steps, noise_multiplier, sample_rate, chunk,
                         with_target=True)
        estimates.append(float(np.mean(target > tau)))
    values = np.asarray(estimates)
    return MonteCarloBound(float(values.mean()), float(values.std(ddof=1) / math.sqrt(batches)),
                           per_batch * batches)


def _losses(rng: np.random.Generator, count: int, steps: int, sigma: float, q: float,
            chunk: int, with_target: bool) -> np.ndarray:
    out = []
    for start in range(0, count, chunk):
        n = min(chunk, count - start)
        y = rng.normal(0.0, sigma, size=(n, steps))
        if with_target:
            y += rng.random((n, steps)) < q if q < 1 else 1.0
        out.append(privacy_loss(y, sigma, q))
    return np.concatenate(out)


def reconstruction_bound(
    kappa: float,
    noise_multiplier: float,
    sample_rate: float = 1.0,
    steps: int = 1,
    adjacency: str = "add-remove",
    samples: int = MC_SAMPLES,
    seed: int = 0,
) -> ReconstructionBound:
    """β(κ) for DP-SGD with noise multiplier σ, sample rate q and T steps.

    Closed form for q = 1 (T Gaussian steps compose to μ-GDP), Monte Carlo for q < 1
    (add/remove adjacency only: replace-one has another dominating pair under subsampling).
    σ = 0 (no noise) bounds nothing: β = 1.
    """
    _check(kappa, noise_multiplier, steps, adjacency)
    if not 0 < sample_rate <= 1:
        raise BoundError(f"the sample rate q must lie in (0, 1], got {sample_rate}")
    common = dict(kappa=kappa, noise_multiplier=noise_multiplier, sample_rate=sample_rate,
                  steps=int(steps), adjacency=adjacency)
    if noise_multiplier == 0:
        return ReconstructionBound(1.0, method="no-noise", **common)  # type: ignore[arg-type]
    if sample_rate >= 1:
        mu = gaussian_mu(noise_multiplier, steps, adjacency)
        return ReconstructionBound(bound_from_mu(kappa, mu), method="gaussian", mu=mu,
                                   **common)  # type: ignore[arg-type]
    if adjacency != "add-remove":
        raise BoundError("a Poisson-subsampled bound is computed for add/remove adjacency only "
                         "(the reference without the target); use adjacency add-remove")
    estimate = subsampled_gaussian_bound(kappa, noise_multiplier, sample_rate, steps,
                                         samples=samples, seed=seed)
    return ReconstructionBound(estimate.value, method="monte-carlo",
                               standard_error=estimate.standard_error,
                               **common)  # type: ignore[arg-type]
