"""The noise the published defenses add to each coordinate of the update, σ² per layer.

The victim publishes its defense chain (Kerckhoffs); an attack that models it needs the
variance σ_l² the chain adds to a coordinate of layer l of the update u*:

- ``noise`` with σ: σ² (Gaussian), 2σ² (Laplace of scale σ);
- ``dpsgd`` with noise multiplier z and clip norm C: (z C / B)² per step on a gradient, B the
  batch (n for FedSGD; n / steps per epoch for FedAvg), and for a FedAvg delta each step's
  noise times the step size τ, summed over the user's K steps: K (τ z C / B)²;
- ``quantize`` with ``bits`` (stochastic rounding to s = 2^{bits−1} − 1 levels of step
  m_l / s, m_l = max|u*_l|, which rounding keeps exactly): (m_l / s)² / 6 on average.

:func:`additive_variance` is the isotropic part (``noise`` and ``dpsgd``),
:func:`noise_variances` adds quantisation's per layer, :func:`noise_ratio` is
r = d σ² / ‖u*‖², the published additive noise's expected energy over the update's (near 1
when the noise drowns the update). Used by the ``gaussian`` objective
(:mod:`fedleak.attacks.optimisation.objectives`) and by the default's choice of parts
(:mod:`fedleak.attacks.optimisation.explained`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fedleak.attacks.observation import Observation
from fedleak.attacks.published import find


def noise_variances(observed: Sequence[torch.Tensor], observation: Observation,
                    per_row: bool) -> list[torch.Tensor]:
    """Return σ_l² per layer of the noise the published defenses add.

    σ_l² per layer (a [rows, 1, …] tensor when ``per_row``, else 0-dim) of the noise the published
    defenses add to each coordinate of the update (module docstring).
    """
    isotropic = additive_variance(observation)
    quantize = find(observation.defenses, "quantize")
    levels = 2 ** (int(quantize.number("bits", 4)) - 1) - 1 if quantize is not None else 0
    out = []
    for o in observed:
        if per_row:
            scale = o.detach().reshape(o.shape[0], -1).abs().amax(1).double()
            scale = scale.view(-1, *[1] * (o.dim() - 1))
        else:
            scale = o.detach().abs().max().double()
        rounding = (scale / levels) ** 2 / 6 if levels else torch.zeros_like(scale)
        out.append(rounding + isotropic)
    return out


def additive_variance(observation: Observation) -> float:
    """σ² per coordinate of the isotropic noise the published ``noise`` and ``dpsgd`` add."""
    defenses = observation.defenses
    isotropic = 0.0
    noise = find(defenses, "noise")
    if noise is not None:
        sigma = noise.number("sigma", 0.0)
        laplace = noise.params.get("distribution", "gaussian") == "laplace"
        isotropic += (2 if laplace else 1) * sigma**2
    dp = find(defenses, "dpsgd")
    if dp is not None:
        per_step = dp.number("noise-multiplier", 0.0) * dp.number("max-grad-norm", 1.0) / \
            max(observation.num_images if observation.update_kind != "delta" else
                _batch_size(observation), 1)
        if observation.update_kind == "delta":
            per_step *= float(observation.learning_rate or 1.0)
            isotropic += max(observation.local_steps, 1) * per_step**2
        else:
            isotropic += per_step**2
    return isotropic


def noise_ratio(observed: Sequence[torch.Tensor], observation: Observation,
                per_row: bool) -> torch.Tensor:
    """Return the noise-to-update energy ratio r = d σ² / ‖u*‖².

    r = d σ² / ‖u*‖²: the published additive noise's expected energy over the observed update's
    (0-dim, or [rows] when ``per_row``); near 1 when the noise drowns the update.
    """
    variance = additive_variance(observation)
    count = sum(o[0].numel() if per_row else o.numel() for o in observed)
    if per_row:
        energy = torch.stack([o.detach().double().reshape(o.shape[0], -1).square().sum(1)
                              for o in observed]).sum(0)
    else:
        energy = torch.stack([o.detach().double().square().sum() for o in observed]).sum()
    return (count * variance / energy.clamp(min=1e-300)).to(observed[0].dtype)


def _batch_size(observation: Observation) -> int:
    """Return the user's local batch size for FedAvg: n / (steps per epoch), at least 1."""
    return max(1, math.ceil(observation.num_images / max(observation.local_steps, 1)))
