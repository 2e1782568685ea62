"""Trap weights of "When the Curious Abandon Honesty" (Boenisch et al., EuroS&P 2023).

Only parameter *values* change: the server sets the first fully-connected layer ``ReLU(W x + b)``
(W: [m, d] over the flattened input) so that each unit fires for few inputs. Then, for a mean
loss over N inputs,

    ∂L/∂W_i = (1/N) Σ_{n: W_i x_n + b_i > 0} g_{n,i} x_nᵀ,     ∂L/∂b_i = (1/N) Σ_{n: …} g_{n,i},

and a unit active for exactly one input n gives it exactly: ``x_n = ∂L/∂W_i / ∂L/∂b_i``
(the identity of analytic inversion, Geiping et al. Prop. D.1, on a *trapped* row).

The paper makes units sparse by shrinking the positive part of random rows; this implementation
calibrates the sparsity directly: row i is a random unit direction w_i scaled by s, and its
bias puts the cut-off at the ``1 − p`` quantile of ⟨w_i, x⟩ over public data (the empirical
one by default; a fitted normal misplaces it in the tails of digits), so each unit fires
for a fraction p of inputs. p = 1/N maximises the chance that a unit fires for exactly one
of the N inputs of the update (about 1/e). Every row that fires for one input gives that input, so
rows are grouped by agreement
(:func:`~fedleak.attacks.exact.analytic.separate_inputs`): a group of two or more agreeing rows is a
confirmed single input; lone rows fill the remaining slots when their ratio lies in the image
box and fires its own unit (mixtures of inputs with weights of both signs fail that).
:func:`~fedleak.attacks.malicious.imprint_guarantee.expected_trapped` gives the expected number of
confirmed inputs, printed beside each result.

**Which models can be trapped.** The first layer with parameters must be a biased linear layer
over the whole input, followed by ReLU (the zoo's ``mlp``; also an imprint block). A network
that starts with convolutions (``lenet-zhu``, ``convnet``, the ResNets) cannot: its first
linear layer is the classifier, whose rows are coupled to every input through the softmax (no
ReLU to switch a row off for most inputs), and the convolutions before it (strided, with sigmoid
or BatchNorm and max-pooling) cannot be set to pass the image through unchanged. The attack
refuses those models with this reason, before any round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from fedleak.attacks.attack_registry import register_attack
from fedleak.attacks.base import Progress
from fedleak.attacks.exact.analytic import separate_inputs
from fedleak.attacks.labels import recover_labels
from fedleak.attacks.malicious.crafted_parameters import (
    CUT_METHODS,
    AttackRefused,
    MaliciousAttack,
    ServerKnowledge,
    cut_offs,
)
from fedleak.attacks.malicious.imprint_block import ImprintBlock
from fedleak.attacks.malicious.imprint_guarantee import expected_trapped
from fedleak.attacks.observation import Observation, Reconstruction


@dataclass
class TrapWeightsConfig:
    """How sparse the trapped layer's units are, and how rows are read back."""

    rate: float = field(default=0.0, metadata={
        "help": "p, the fraction of inputs each trapped unit fires for (0: 1/N for the N images "
                "behind the update)"})
    scale: float = field(default=1.0, metadata={"help": "s, the norm of every trapped row"})
    cuts: str = field(default="quantiles", metadata={
        "help": "where each row's cut-off goes: quantiles (the public projections' empirical "
                "1 - p quantile; needs a few times 1/p public images) or gaussian (a normal "
                "fitted to them; misplaces cut-offs in non-normal tails)"})
    threshold: float = field(default=1e-6, metadata={
        "help": "rows with |bias gradient| <= threshold * the largest are silent"})
    tolerance: float = field(default=1e-4, metadata={
        "help": "relative distance under which two rows' ratios agree"})
    box_tolerance: float = field(default=0.02, metadata={
        "help": "a lone row's ratio must lie within [0, 1] widened by this"})

    def __post_init__(self) -> None:
        """Check rate, cut method and positive numbers; raise ``ValueError`` naming the bad one."""
        if not (0 <= self.rate < 1):
            raise ValueError(f"rate must lie in [0, 1), got {self.rate}")
        if self.cuts not in CUT_METHODS:
            raise ValueError(f"cuts must be one of {CUT_METHODS}, got {self.cuts!r}")
        for key in ("scale", "threshold", "tolerance", "box_tolerance"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{key} must be a positive number, got {value}")


def trappable_layer(model: nn.Module, pixels: int) -> str:
    """Return the module name of the first linear layer when the model can be trapped.

    Raises
    ------
    AttackRefused
        Naming why the model cannot be trapped (see the module docstring).
    """
    parents = {name: module for name, module in model.named_modules()}
    leaves = [(name, module) for name, module in model.named_modules()
              if not list(module.children())]
    with_parameters = [i for i, (_, module) in enumerate(leaves)
                       if any(True for _ in module.parameters(recurse=False))]
    if not with_parameters:
        raise AttackRefused("the model has no parameters to trap")
    index = with_parameters[0]
    name: str = leaves[index][0]
    first = leaves[index][1]
    kind = type(first).__name__
    if not isinstance(first, nn.Linear) or first.bias is None or first.in_features != pixels:
        raise AttackRefused(
            f"trap weights need the network's first layer to be a biased linear layer over the "
            f"whole input followed by ReLU; this model starts with {kind} {name!r}: its only "
            "linear layer is the classifier, whose rows every input reaches through the "
            "softmax (no ReLU switches a row off), and the layers before it cannot be set to "
            "pass the image through unchanged. Use an MLP victim (--model mlp), the malicious "
            "architecture (--model imprint:... with --attack imprint), or --attack fishing")
    parent = parents.get(name.rpartition(".")[0])
    follows_relu = index + 1 < len(leaves) and isinstance(leaves[index + 1][1], nn.ReLU)
    if not (follows_relu or isinstance(parent, ImprintBlock)):
        raise AttackRefused(f"the first linear layer {name!r} is not followed by ReLU, so no "
                            "unit can be switched off for most inputs")
    return name


@register_attack("trap-weights")
class TrapWeights(MaliciousAttack):
    """Boenisch et al.'s trap weights in the first linear layer; exact single inputs."""

    Config = TrapWeightsConfig
    config: TrapWeightsConfig

    def check(self, knowledge: ServerKnowledge) -> None:
        """Refuse a model whose first layer cannot be trapped (module docstring)."""
        trappable_layer(knowledge.model, math.prod(knowledge.image_shape))

    def rate(self, inputs: int) -> float:
        """p: the configured rate, or 1/N."""
        return self.config.rate or 1.0 / max(inputs, 2)

    def craft(
        self, knowledge: ServerKnowledge, probes: Sequence[Observation], seed: int
    ) -> dict[str, torch.Tensor] | None:
        """One round: the first linear layer's rows set to sparse traps."""
        if probes:
            return None
        cfg = self.config
        layer = trappable_layer(knowledge.model, math.prod(knowledge.image_shape))
        weight = knowledge.parameters[layer + ".weight"]
        rows, pixels = weight.shape
        generator = torch.Generator().manual_seed(seed)
        directions = torch.randn(rows, pixels, generator=generator, dtype=torch.float64)
        directions /= directions.norm(dim=1, keepdim=True)
        projections = knowledge.public_images.flatten(1).double() @ directions.T  # [N, m]
        level = torch.tensor([1 - self.rate(knowledge.images_in_aggregate)])
        cuts = cut_offs(projections, level, cfg.cuts)[0]
        crafted = {name: tensor.detach().clone() for name, tensor in
                   knowledge.parameters.items()}
        crafted[layer + ".weight"] = (cfg.scale * directions).to(weight)
        crafted[layer + ".bias"] = (-cfg.scale * cuts).to(weight)
        return crafted

    def recover(
        self,
        observation: Observation,
        *,
        device: torch.device,
        seed: int,
        progress: Progress | None,
    ) -> Reconstruction:
        """Group agreeing rows of the trapped layer; fill with consistent lone rows."""
        cfg = self.config
        names = observation.parameter_names
        pixels = math.prod(observation.image_shape)
        index = next((i for i, (name, p) in enumerate(zip(names, observation.parameters,
                                                          strict=True))
                      if name.endswith(".weight") and p.dim() == 2 and p.shape[1] == pixels),
                     None)
        if index is None or names[index][:-len("weight")] + "bias" not in names:
            raise AttackRefused("the observed update has no biased linear layer over the input")
        bias_index = observation.index_of(names[index][:-len("weight")] + "bias")
        grads = observation.gradient_direction()
        g_w, g_b = grads[index].detach().double(), grads[bias_index].detach().double()
        weight = observation.parameters[index].detach().double()
        bias = observation.parameters[bias_index].detach().double()
        n = observation.num_images
        found, sizes = separate_inputs(g_w, g_b, n, cfg.threshold, cfg.tolerance)
        chosen = [found[i] for i in range(found.shape[0])]
        if len(chosen) < n:
            chosen += self.lone_rows(g_w, g_b, weight, bias, observation, chosen, n - len(chosen))
        shape = observation.image_shape
        images = torch.stack(chosen).float().view(-1, *shape) if chosen else \
            torch.zeros(0, *shape)
        recovered = images.shape[0]
        if recovered < n:
            images = torch.cat([images, torch.zeros(n - recovered, *shape)])
        if progress is not None:
            progress(1, 1, 0.0)
        rate = self.rate(n)
        return Reconstruction(
            images=images.to(device), labels=recover_labels(observation).to(device),
            objective=0.0, iterations=1, padding=list(range(min(recovered, n), n)),
            extras={"trapped_rows": int(g_b.numel()), "confirmed": len(sizes),
                    "active_rows": int((g_b.abs() > cfg.threshold * g_b.abs().max()).sum()),
                    "expected_confirmed": expected_trapped(int(g_b.numel()), n, rate)})

    def lone_rows(
        self,
        g_w: torch.Tensor,
        g_b: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        observation: Observation,
        chosen: list[torch.Tensor],
        count: int,
    ) -> list[torch.Tensor]:
        """Return up to ``count`` ratios of single active rows, largest bias gradient first.

        A ratio ``∇_{W_i} L / ∇_{b_i} L`` is kept when it lies in the image box, fires its own
        unit and differs from every input already chosen.
        """
        cfg = self.config
        active = torch.nonzero(g_b.abs() > cfg.threshold * g_b.abs().max()).flatten()
        active = active[torch.argsort(g_b[active].abs(), descending=True)]
        ratios = g_w[active] / g_b[active, None]
        low, high = observation.image_bounds(ratios.device)
        pixels = ratios.shape[1]
        channels = low.shape[1]
        low = low.double().view(channels, 1).expand(channels, pixels // channels).reshape(-1)
        high = high.double().view(channels, 1).expand(channels, pixels // channels).reshape(-1)
        margin = cfg.box_tolerance * (high - low)
        in_box = ((ratios >= low - margin) & (ratios <= high + margin)).all(1)
        fires = (ratios * weight[active]).sum(1) + bias[active] > 0
        picked: list[torch.Tensor] = []
        for row in torch.nonzero(in_box & fires).flatten().tolist():
            candidate = ratios[row]
            if all((candidate - other).norm() > cfg.tolerance * other.norm()
                   for other in chosen + picked):
                picked.append(candidate)
            if len(picked) == count:
                break
        return picked
