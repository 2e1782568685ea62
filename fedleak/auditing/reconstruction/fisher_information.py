"""The Fisher-information ceiling on reconstruction quality (Guo et al. 2022, arXiv 2201.12383).

For a mechanism M(x) = h(x) + N(0, s²I) of a d-dimensional private input x, the Fisher
information of the output about x is I(x) = J_h(x)ᵀ J_h(x) / s², J_h the Jacobian of h. By the
Cramér–Rao bound every *unbiased* estimator x̂ of x satisfies, per coordinate (Guo et al.,
Thm. 1, via Tr(I⁻¹) ≥ d² / Tr(I)),

    E‖x̂ − x‖² / d  ≥  d / Tr(I(x))  =  1 / dFIL,       dFIL = Tr(I(x)) / d,

so on images with values in [0, 1] no unbiased reconstruction beats the PSNR ceiling
10·log₁₀(dFIL). For DP-SGD, h is one image's clipped per-example gradient and s = σC (the
1/``|B|`` scaling of the step divides both); Fisher information adds over the steps of a run
(adaptive composition: the chain rule of Fisher information), and under Poisson sampling at
rate q a step's information is at most q times the information with the image in the batch
(Fisher information is convex in the distribution; the mixture is (1 − q)·P₀ + q·P_x with P₀
independent of x). :func:`jacobian_norm_squared` gives ‖J_h(x)‖²_F = Tr(J_hᵀ J_h) exactly, with
one forward-mode derivative per input coordinate (``torch.func.jvp``, vectorised in chunks).

Sharp edges (Guo et al. §3.3): the ceiling binds *unbiased* estimators only; an attack with a
strong image prior is biased and can score above it (so can a lucky guess on a low-entropy
data set); it is a per-image statement at the parameters where the Jacobian was taken.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.func import jvp, vmap


def jacobian_norm_squared(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                          chunk: int = 64) -> float:
    """‖∂fn(x)/∂x‖²_F = Σ_j ‖J e_j‖², one Jacobian-vector product per coordinate of ``x``.

    ``fn`` maps a tensor shaped like ``x`` to a tensor (any shape); it must be differentiable in
    forward mode (``torch.func`` transforms compose: a ``grad`` inside is fine).
    """
    flat = x.detach().reshape(-1)
    d = flat.numel()

    def of_flat(v: torch.Tensor) -> torch.Tensor:
        return fn(v.view_as(x)).reshape(-1)

    def tangent(direction: torch.Tensor) -> torch.Tensor:
        derivative: torch.Tensor = jvp(of_flat, (flat,), (direction,))[1]
        return derivative

    total = 0.0
    eye = torch.eye(d, dtype=flat.dtype, device=flat.device)
    for start in range(0, d, chunk):
        tangents = vmap(tangent)(eye[start:start + chunk])
        total += float(tangents.double().square().sum())
    return total


@dataclass(frozen=True)
class FisherCeiling:
    """Tr(I(x)) of one image, and the MSE floor and PSNR ceiling it implies."""

    trace: float
    dimension: int

    @property
    def dfil(self) -> float:
        """Diagonal Fisher information loss: Tr(I) / d."""
        return self.trace / self.dimension

    @property
    def mse_floor(self) -> float:
        """Return d / Tr(I): the least per-coordinate MSE of an unbiased estimator."""
        return math.inf if self.trace == 0 else self.dimension / self.trace

    @property
    def psnr_ceiling(self) -> float:
        """10·log₁₀(1 / mse_floor) dB on [0, 1]; +inf when the mechanism adds no noise."""
        if math.isinf(self.trace):
            return math.inf
        if self.trace == 0:
            return -math.inf
        return 10 * math.log10(self.dfil)


def gaussian_step_information(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                              noise_std: float, sample_rate: float = 1.0) -> float:
    """Return Tr(I(x)) of one subsampled release h(x) + N(0, s²I).

    Tr(I(x)) of one release h(x) + N(0, s²I), included with probability ``sample_rate`` (at most
    q·‖J‖²/s², by convexity); +inf without noise.
    """
    if noise_std == 0:
        return math.inf
    return sample_rate * jacobian_norm_squared(fn, x) / noise_std ** 2
