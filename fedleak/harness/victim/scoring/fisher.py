"""The Fisher-information PSNR ceiling of each private image of a round, computed inside the victim.

For a round whose chain declares a per-example Gaussian mechanism (``dpsgd``, or any plug-in
declaring the same: per-example clipping to C and noise σC on each step's sum — read from the
declaration, never the class), image i's Fisher information under one local step at the
round's parameters θ is

    Tr I(x_i) = q · ‖∂ clip(∇_θ CE(f_θ(x_i), y_i)) / ∂x_i‖²_F / (σC)²

(x_i on [0, 1], the normalisation inside the derivative; q the Poisson sample rate, 1 for a full
batch): :mod:`fedleak.auditing.reconstruction.fisher_information` turns it into the PSNR ceiling of
an unbiased reconstruction (Guo et al. 2022). Only the ceilings leave the victim, at report
precision — never the Fisher matrix or the Jacobian. A round of several local steps is not bounded:
the victim keeps the round's parameters, not those of its later steps, and a ceiling taken at the
wrong parameters could be too low.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad

from fedleak.auditing.reconstruction.fisher_information import (
    FisherCeiling,
    gaussian_step_information,
)
from fedleak.defenses import DefenseChain
from fedleak.defenses.mechanism import GAUSSIAN, PER_COORDINATE, TOTAL
from fedleak.harness.federated.local_update import set_training_mode, user_loss
from fedleak.harness.federated.protocol import FEDSGD
from fedleak.harness.victim.rounds import Round
from fedleak.harness.victim.scoring import precision
from fedleak.harness.zoo.datasets import DatasetInfo, normalize

#: Above this many input coordinates (a forward-mode derivative each) no ceiling is computed.
MAX_DIMENSION = 4096
CLIP_EPS = 1e-6  # Opacus's: min(1, C / (‖g‖ + 1e-6))


@dataclass
class FisherAnswer:
    """Per private image of the round (by batch position) its PSNR ceiling, or why none."""

    ceilings: dict[int, float] | None
    note: str = ""


def dp_steps(chain: DefenseChain, round_: Round, n: int) -> tuple[int, float]:
    """(local DP-SGD steps, sample rate) of a round of ``n`` images, as the victim ran it."""
    declared = chain.per_example_mechanism
    protocol = round_.protocol
    q = declared.sampling.poisson_rate(n, protocol.batch_size) if declared is not None else None
    if protocol.kind == FEDSGD:
        return 1, q if q is not None else 1.0
    if q is not None:
        return protocol.local_epochs * max(1, round(1 / q)), q
    return protocol.local_steps(n), 1.0


def fisher_ceilings(model: nn.Module, chain: DefenseChain, round_: Round, images: torch.Tensor,
                    labels: torch.Tensor, info: DatasetInfo) -> FisherAnswer:
    """The round's per-image ceilings (``images`` on [0, 1], the round's batch), or a note."""
    declared = chain.per_example_mechanism
    clip, noise = (declared.clip, declared.noise) if declared is not None else (None, None)
    if clip is None or noise is None or noise.distribution != GAUSSIAN or not noise.std > 0 \
            or clip.geometry == PER_COORDINATE:
        return FisherAnswer(None, "no Fisher ceiling: the chain declares no per-example "
                                  "Gaussian mechanism (a clip and Gaussian noise on each "
                                  "step's gradient, as dpsgd does), which it is computed for")
    if round_.parameters is None or round_.buffers is None:
        return FisherAnswer(None, "no Fisher ceiling: this round's parameters were forgotten "
                                  "(--feature-memory-mb); score right after the round")
    steps, q = dp_steps(chain, round_, len(labels))
    if steps != 1:
        return FisherAnswer(None, f"no Fisher ceiling: the round took {steps} local steps and "
                                  "the victim keeps only its starting parameters")
    dimension = int(images[0].numel())
    if dimension > MAX_DIMENSION:
        return FisherAnswer(None, f"no Fisher ceiling: {dimension} input values per image "
                                  f"(more than {MAX_DIMENSION} derivatives)")
    noise_std = noise.std
    params = {k: v.detach() for k, v in round_.parameters.items()}
    buffers = round_.buffers
    set_training_mode(model, round_.protocol)
    groups = clip.groups(list(params))
    bounds = clip.group_bounds(len(groups)) if clip.geometry != TOTAL else [clip.norm]

    def clipped_gradient(x01: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
            x = normalize(x01[None], info)
            return user_loss(functional_call(model, {**p, **buffers}, (x,)), y[None])

        grads = list(grad(loss)(params).values())
        clipped = list(grads)
        for members, bound in zip(groups, bounds, strict=True):
            norm = torch.cat([grads[i].flatten() for i in members]).norm()
            factor = torch.clamp(bound / (norm + CLIP_EPS), max=1.0)
            for i in members:
                clipped[i] = grads[i] * factor
        return torch.cat([g.flatten() for g in clipped])

    ceilings = {}
    for i in range(len(labels)):
        trace = gaussian_step_information(functools.partial(clipped_gradient, y=labels[i]),
                                          images[i].float(), noise_std, q)
        ceilings[i] = precision.psnr(FisherCeiling(trace, dimension).psnr_ceiling)
    return FisherAnswer(ceilings, f"Fisher ceiling (Guo et al. 2022) of one DP-SGD step, σ = "
                                  f"{declared.noise_multiplier if declared else 0:g}, C = "
                                  f"{clip.norm:g}, q = {q:g}; binds unbiased reconstructions "
                                  "only")
