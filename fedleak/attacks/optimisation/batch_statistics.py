"""BatchNorm statistics: what the server can infer of the user's batch, and a prior on them.

**Inference from returned buffers.** A FedAvg client that sends its ``state_dict`` sends its
BatchNorm running statistics after local training. With momentum m (PyTorch's default 0.1),
each training-mode forward of batch b updates

    r_μ ← (1 − m) r_μ + m μ_b,     r_σ² ← (1 − m) r_σ² + m · N/(N − 1) · σ²_b,

where μ_b, σ²_b are the per-channel mean and *biased* variance over the N = n·H·W values of
the layer's input, and PyTorch stores the *unbiased* N/(N − 1)·σ²_b; ``num_batches_tracked``
counts the forwards. From the global statistics r⁰ the server sent and the returned r^k after
k = Δ num_batches_tracked forwards, the batch statistics are, exactly for k = 1,

    μ_b = (r^k_μ − (1 − m)^k r⁰_μ) / (1 − (1 − m)^k),
    σ²_b = (N − 1)/N · (r^k_σ² − (1 − m)^k r⁰_σ²) / (1 − (1 − m)^k),

and for k > 1 (several local steps) the same expression is the average of the k batches'
statistics (each taken at its own θ): an approximation. Without returned buffers the prior
falls back to the global model's running statistics r⁰ (DeepInversion's choice).

**The prior.** With μ_l(x), σ²_l(x) the batch statistics of BatchNorm layer l's input (C_l
channels) for candidate images x at θ, and μ̂_l, σ̂²_l the targets, the attack adds ``bn`` ×

    R_BN(x) = Σ_l ‖(μ_l(x) − μ̂_l)/σ̂_l‖₂/√C_l + ‖(σ_l(x) − σ̂_l)/σ̂_l‖₂/√C_l      (standardised)

(divisions per channel): each layer's channel means and standard deviations compared in units
of the target's standard deviation, as a root mean square over its channels, so every layer
weighs the same whatever the scale of its activations. Yin et al. (CVPR 2021, eq. 6;
DeepInversion, eq. 4) use the raw form,

    R_BN(x) = Σ_l ‖μ_l(x) − μ̂_l‖₂ + ‖σ²_l(x) − σ̂²_l‖₂,                              (yin)

where a layer's weight is the scale of its activations. Against one training-mode image on the
untrained ConvNet of width 16 (FedAvg, buffers returned, 1,200 iterations, α = 0.1, photos 5,
10 and 12) the raw form went from 8.90 dB without prior to 11.85 dB and the standardised one
to 13.05 dB (docs/fedavg.md), so the standardised form is the default; ``form="yin"`` keeps the
paper's (the ``bn`` prior part's ``form`` option; ``gradinversion`` uses it). Why the prior is
needed at all: with batch statistics, every layer after the first BatchNorm is invariant to
x ↦ a·x + c (a > 0, c a constant per colour; up to zero padding at the border), and the first
layer's gradient is as well (BatchNorm's backward removes each channel's mean), so the update
says nothing of the image's mean colour and contrast, which PSNR weighs heavily; the first
layer's statistics say exactly that.

The candidate statistics come from one forward of the server's model at θ
(the model, parameters and buffers of the observation's
:class:`~fedleak.attacks.replay_contract.Replay`: attacks never import the harness) with hooks
on its BatchNorm layers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from fedleak.attacks.observation import Observation
from fedleak.attacks.parts import PartError
from fedleak.attacks.replay_contract import Replay

SOURCES = ("auto", "returned", "global")
FORMS = ("standardised", "yin")
#: variances below this are treated as this (a dead channel's σ̂ would divide by zero)
VARIANCE_FLOOR = 1e-10


@dataclass
class LayerStatistics:
    """Per-channel batch mean and biased variance the prior pulls layer ``name`` towards."""

    name: str
    mean: torch.Tensor
    variance: torch.Tensor


def batch_norm_layers(model: nn.Module) -> dict[str, nn.modules.batchnorm._BatchNorm]:
    """Return the model's BatchNorm modules that track running statistics, by module name."""
    return {name: m for name, m in model.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats}


def replay_model(observation: Observation) -> tuple[nn.Module, dict[str, torch.Tensor],
                                                    dict[str, torch.Tensor]]:
    """Return the server's model with θ and the global buffers from the observation's replay."""
    simulate = observation.simulate
    if not isinstance(simulate, Replay):
        raise PartError("the BatchNorm prior needs the model behind the observation's replay "
                        "(build the observation with the harness: observe or "
                        "observation_from_update)")
    return simulate.model, dict(simulate.parameters), dict(simulate.buffers)


def layer_sizes(model: nn.Module, parameters: Mapping[str, torch.Tensor],
                buffers: Mapping[str, torch.Tensor], images: torch.Tensor) -> dict[str, int]:
    """N = n·H·W (values per channel) of every BatchNorm layer's input for ``images``."""
    sizes: dict[str, int] = {}
    hooks = [m.register_forward_hook(
        lambda _m, inputs, _o, name=name: sizes.__setitem__(
            name, inputs[0].numel() // inputs[0].shape[1]))
        for name, m in batch_norm_layers(model).items()]
    try:
        with torch.no_grad():
            functional_call(model, {**parameters, **{k: v.clone() for k, v in buffers.items()}},
                            (images,))
    finally:
        for hook in hooks:
            hook.remove()
    return sizes


def target_statistics(observation: Observation, source: str = "auto"
                      ) -> tuple[list[LayerStatistics], str]:
    """Return the statistics the BatchNorm prior pulls towards, and their source.

    The statistics the prior pulls towards, and where they come from (``returned``: batch statistics
    inferred from the buffers the user sent; ``global``: the global model's running statistics).
    Refuses a model without BatchNorm and a source the observation lacks.
    """
    if source not in SOURCES:
        raise PartError(f"bn-source must be one of {', '.join(SOURCES)}, got {source!r}")
    model, parameters, buffers = replay_model(observation)
    layers = batch_norm_layers(model)
    if not layers:
        raise PartError("the BatchNorm prior (bn > 0) needs a model with BatchNorm layers that "
                        "track running statistics; this one has none: use bn=0")
    returned = observation.returned_buffers
    if source == "returned" and not returned:
        raise PartError("bn-source=returned, but the user sent no buffers with its update; "
                        "start the victim with --return-buffers fedavg (FedAvg rounds) or "
                        "always, or use bn-source=global")
    if source == "global" or not returned:
        return [LayerStatistics(name, buffers[f"{name}.running_mean"].detach(),
                                buffers[f"{name}.running_var"].detach())
                for name in layers], "global"
    device = observation.update[0].device
    shape = (observation.num_images, *observation.image_shape)
    sizes = layer_sizes(model, parameters, buffers, torch.zeros(shape, device=device))
    out = []
    for name, module in layers.items():
        if module.momentum is None:
            raise PartError(f"BatchNorm layer {name!r} uses a cumulative average (momentum "
                            "None); its batch statistics cannot be inferred from the buffers")
        keep = 1 - float(module.momentum)
        steps = int(returned[f"{name}.num_batches_tracked"].item()
                    - buffers[f"{name}.num_batches_tracked"].item())
        if steps < 1:
            raise PartError(f"the returned buffers of {name!r} did not move (no training-mode "
                            "forward); use bn-source=global")
        decay = keep ** steps
        mean = (returned[f"{name}.running_mean"].to(device)
                - decay * buffers[f"{name}.running_mean"]) / (1 - decay)
        unbiased = (returned[f"{name}.running_var"].to(device)
                    - decay * buffers[f"{name}.running_var"]) / (1 - decay)
        n = sizes[name]
        out.append(LayerStatistics(name, mean, unbiased * (n - 1) / n))
    return out, "returned"


def layer_distance(mean: torch.Tensor, variance: torch.Tensor, target: LayerStatistics,
                   form: str = "standardised") -> torch.Tensor:
    """One layer's term of ``R_BN`` (module docstring) for candidate statistics."""
    distance: torch.Tensor
    if form == "yin":
        distance = (torch.linalg.vector_norm(mean - target.mean)
                    + torch.linalg.vector_norm(variance - target.variance))
        return distance
    scale = target.variance.clamp(min=VARIANCE_FLOOR).sqrt()
    root = math.sqrt(mean.numel())
    std = variance.clamp(min=VARIANCE_FLOOR).sqrt()
    distance = (torch.linalg.vector_norm((mean - target.mean) / scale)
                + torch.linalg.vector_norm((std - scale) / scale)) / root
    return distance


def batch_norm_prior(observation: Observation, targets: list[LayerStatistics],
                     form: str = "standardised") -> Callable[[torch.Tensor], torch.Tensor]:
    """``R_BN(x)`` of the module docstring for images ``x`` [n, C, H, W] (differentiable)."""
    if form not in FORMS:
        raise PartError(f"the BatchNorm prior's form must be one of {', '.join(FORMS)}, got "
                        f"{form!r}")
    model, parameters, buffers = replay_model(observation)
    layers = batch_norm_layers(model)
    wanted = {t.name: t for t in targets}

    def prior(images: torch.Tensor) -> torch.Tensor:
        terms: list[torch.Tensor] = []

        def hook(name: str) -> Callable[..., None]:
            def record(_module: nn.Module, inputs: tuple[torch.Tensor, ...], _out: object
                       ) -> None:
                x = inputs[0]
                dims = [d for d in range(x.dim()) if d != 1]
                mean = x.mean(dim=dims)
                variance = x.var(dim=dims, unbiased=False)
                terms.append(layer_distance(mean, variance, wanted[name], form))
            return record

        hooks = [module.register_forward_hook(hook(name)) for name, module in layers.items()]
        try:  # in the mode the user's replay left the model in (the protocol's BatchNorm mode)
            functional_call(model, {**parameters,
                                    **{k: v.detach().clone() for k, v in buffers.items()}},
                            (images,))
        finally:
            for h in hooks:
                h.remove()
        return torch.stack(terms).sum()

    return prior
