"""Analytic inversion of a biased fully-connected layer.

The closed form of Geiping et al. Prop. 3.1 / D.1 and Qian & Hansen Prop. 2. For a layer
``y = A x + b`` (``A`` of shape [m, d]) inside any network, the chain rule gives, for one input
x and row i (Prop. D.1, eqs. (4)–(5) of the supplement),

    ∂L/∂b_i = ∂L/∂y_i,      ∂L/∂A_{i,:} = ∂L/∂y_i · xᵀ = ∂L/∂b_i · xᵀ,

so every row with a non-zero bias gradient gives the layer's input exactly:
``x = ∇_{A_i} L / ∇_{b_i} L``. Rows whose unit was inactive (ReLU off) or whose bias gradient
is tiny carry no or noisy information, so only rows with ``|∇_{b_i} L| ≥ threshold ·
max_j |∇_{b_j} L|`` are used, and their estimates are combined robustly: by least squares over
the rows (the x minimising ``Σ_i ‖∇_{A_i} L − ∇_{b_i} L · x‖²``, i.e.
``x = Σ_i ∇_{b_i} L · ∇_{A_i} L / Σ_i (∇_{b_i} L)²``, which weights a row by its bias gradient)
or by the coordinate-wise median of the per-row ratios.

For a network that *starts* with a biased linear layer (the zoo's ``mlp``) the input is the
image itself, in the normalised space the model sees. For any other network the attack inverts
the *last* biased linear layer (the classifier) and recovers its input features, which the
victim can score against the true ones.

**Batches (Prop. D.2 and Qian & Hansen Prop. 3).** With n images averaged, ``∂L/∂A_i =
(1/n) Σ_k g_{ki} x_kᵀ`` and ``∂L/∂b_i = (1/n) Σ_k g_{ki}``, so the ratio is the
gradient-weighted mixture ``Σ_k (g_{ki} / Σ_{k'} g_{k'i}) x_k`` of the batch's inputs, with
weights that differ from row to row (and need not be positive): not one image. But a unit
that is active (ReLU on, ``g_{ki} ≠ 0``) for exactly one image k of the batch gives that image
exactly, ``∂L/∂A_i / ∂L/∂b_i = x_k``, and all such rows of image k agree. With ``separate``
(default) the per-row estimates are grouped (greedily, by relative distance ≤ ``tolerance``);
every group of at least two agreeing rows is taken as one recovered input, largest groups first.
Slots left over (fewer groups than images, as at a classifier, where every image's error
``p − e_y`` is non-zero in every row) get the least-squares mixture, and the attack says so in a
warning.

A FedAvg delta is turned into a gradient direction first; after several local steps the
identity holds only approximately. The labels come from :func:`recover_labels`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from fedleak.attacks.attack_registry import register_attack
from fedleak.attacks.base import Attack, Progress
from fedleak.attacks.labels import recover_labels
from fedleak.attacks.observation import Observation, Reconstruction

LAYER_CHOICES = ("auto", "first", "last")
COMBINE_CHOICES = ("least-squares", "median")


class AnalyticInversionError(ValueError):
    """The update has no biased linear layer to invert, or its bias gradient is zero."""


@dataclass
class AnalyticConfig:
    """Which biased linear layer to invert, and how to pick and combine its rows."""

    layer: str = field(
        default="auto",
        metadata={"help": "'auto' (the first layer when the network starts with a biased "
                          "linear layer, else the last), 'first', 'last', or a module name "
                          "such as fc or layers.1"},
    )
    threshold: float = field(
        default=1e-3,
        metadata={"help": "use rows with |grad b_i| >= threshold * max |grad b| (0 < t <= 1)"},
    )
    separate: bool = field(
        default=True,
        metadata={"help": "for a batch, group rows that agree (units active for one image "
                          "only) into separate inputs"},
    )
    tolerance: float = field(
        default=1e-4, metadata={"help": "relative distance under which two rows agree"}
    )
    combine: str = field(
        default="least-squares",
        metadata={"help": "'least-squares' (rows weighted by their bias gradient) or 'median' "
                          "(coordinate-wise median of the per-row ratios)"},
    )

    def __post_init__(self) -> None:
        """Check the settings; raise ``ValueError`` naming the one out of range."""
        if not (0 < self.threshold <= 1 and math.isfinite(self.threshold)):
            raise ValueError(f"threshold must lie in (0, 1], got {self.threshold}")
        if self.combine not in COMBINE_CHOICES:
            raise ValueError(f"combine must be one of {COMBINE_CHOICES}, got {self.combine!r}")
        if not self.layer:
            raise ValueError(f"layer must be one of {LAYER_CHOICES} or a module name")
        if not (0 < self.tolerance < 1):
            raise ValueError(f"tolerance must lie in (0, 1), got {self.tolerance}")


@dataclass(frozen=True)
class LinearLayer:
    """A biased linear layer of the update: module name and indices of weight and bias."""

    name: str
    weight_index: int
    bias_index: int


def biased_linear_layers(observation: Observation) -> list[LinearLayer]:
    """Every ``NAME.weight`` [m, d] with a ``NAME.bias`` [m] in the update, in parameter order."""
    names = observation.parameter_names
    shapes = [tuple(u.shape) for u in observation.update]
    layers = []
    for index, name in enumerate(names):
        if not name.endswith(".weight") or len(shapes[index]) != 2:
            continue
        module = name[: -len(".weight")]
        bias_name = module + ".bias"
        if bias_name in names and \
                shapes[observation.index_of(bias_name)] == (shapes[index][0],):
            layers.append(LinearLayer(module, index, observation.index_of(bias_name)))
    return layers


def starts_with_linear(observation: Observation, layer: LinearLayer) -> bool:
    """Whether ``layer`` is the network's first parameter and takes the flattened image."""
    pixels = math.prod(observation.image_shape)
    return layer.weight_index == 0 and observation.update[0].shape[1] == pixels


def choose_layer(observation: Observation, choice: str) -> LinearLayer:
    """Return the layer ``choice`` names (see :class:`AnalyticConfig`).

    Raises
    ------
    AnalyticInversionError
        When the update has no biased linear layer, or none of that name.
    """
    layers = biased_linear_layers(observation)
    if not layers:
        raise AnalyticInversionError(
            "the update has no biased linear layer (a NAME.weight [m, d] with a NAME.bias [m]); "
            "analytic inversion needs one: use a model with biases, or another attack"
        )
    if choice == "auto":
        first = layers[0]
        return first if starts_with_linear(observation, first) else layers[-1]
    if choice == "first":
        return layers[0]
    if choice == "last":
        return layers[-1]
    for layer in layers:
        if layer.name == choice:
            return layer
    valid = ", ".join([*LAYER_CHOICES, *(layer.name for layer in layers)])
    raise AnalyticInversionError(f"no biased linear layer {choice!r}; choose one of {valid}")


def invert_linear_layer(
    weight_grad: torch.Tensor,
    bias_grad: torch.Tensor,
    threshold: float = 1e-3,
    combine: str = "least-squares",
) -> tuple[torch.Tensor, int]:
    """Recover the layer input ``x`` [d] from ``∇_A L`` [m, d] and ``∇_b L`` [m] (Prop. D.1).

    Rows with ``|∇_{b_i} L| ≥ threshold · max |∇_b L|`` are combined by least squares or by the
    coordinate-wise median of ``∇_{A_i} L / ∇_{b_i} L``.

    Returns
    -------
    tuple of torch.Tensor and int
        ``x`` (float64) and the number of rows used.
    """
    weight_grad, bias_grad = weight_grad.detach().double(), bias_grad.detach().double()
    largest = bias_grad.abs().max()
    if not bool(torch.isfinite(largest)) or float(largest) == 0.0:
        raise AnalyticInversionError(
            "the layer's bias gradient is zero (or not finite) in every row, so its input "
            "cannot be recovered: no unit was active for this batch"
        )
    rows = bias_grad.abs() >= threshold * largest
    g_w, g_b = weight_grad[rows], bias_grad[rows]
    if combine == "median":
        x = (g_w / g_b[:, None]).median(dim=0).values
    else:
        x = (g_b[:, None] * g_w).sum(0) / g_b.square().sum()
    return x, int(rows.sum())


def separate_inputs(
    weight_grad: torch.Tensor,
    bias_grad: torch.Tensor,
    count: int,
    threshold: float = 1e-3,
    tolerance: float = 1e-4,
) -> tuple[torch.Tensor, list[int]]:
    """Up to ``count`` distinct inputs ``[k, d]`` from groups of agreeing per-row estimates.

    Each row above the threshold gives ``r_i = ∇_{A_i} L / ∇_{b_i} L``. Rows are visited by
    decreasing ``|∇_{b_i} L|``; a row joins the first group whose first member is within
    ``tolerance · ‖member‖`` of it, else starts a group. Groups of two or more rows are returned
    (their mean, float64), largest first, with their sizes.
    """
    weight_grad, bias_grad = weight_grad.detach().double(), bias_grad.detach().double()
    largest = bias_grad.abs().max()
    if not bool(torch.isfinite(largest)) or float(largest) == 0.0:
        return weight_grad.new_zeros(0, weight_grad.shape[1]), []
    order = torch.argsort(bias_grad.abs(), descending=True)
    order = order[bias_grad.abs()[order] >= threshold * largest]
    ratios = weight_grad[order] / bias_grad[order, None]
    # agree[a, r]: row r lies within tolerance of row a (relative to row a's norm)
    agree = (torch.cdist(ratios, ratios) <= tolerance * ratios.norm(dim=1)[:, None]).tolist()
    groups: list[list[int]] = []
    for row in range(ratios.shape[0]):
        for group in groups:
            if agree[group[0]][row]:
                group.append(row)
                break
        else:
            groups.append([row])
    kept = sorted((g for g in groups if len(g) >= 2), key=len, reverse=True)[:count]
    if not kept:
        return weight_grad.new_zeros(0, weight_grad.shape[1]), []
    return torch.stack([ratios[g].mean(0) for g in kept]), [len(g) for g in kept]


@register_attack("analytic")
class AnalyticInversion(Attack[Observation]):
    """Closed-form recovery of a biased linear layer's input from its weight and bias gradients.

    The image for a network starting with such a layer (``mlp``), else the classifier's input
    features. No optimisation: one division per row.
    """

    Config = AnalyticConfig
    config: AnalyticConfig

    def recover(
        self,
        observation: Observation,
        *,
        device: torch.device,
        seed: int,
        progress: Progress | None,
    ) -> Reconstruction:
        """Invert the chosen layer; ``seed`` is unused (the attack is deterministic)."""
        cfg = self.config
        layer = choose_layer(observation, cfg.layer)
        grads = observation.gradient_direction()
        x, rows = invert_linear_layer(grads[layer.weight_index], grads[layer.bias_index],
                                      cfg.threshold, cfg.combine)
        labels = recover_labels(observation).to(device)
        n = observation.num_images
        warnings = []
        inputs = x.view(1, -1).expand(n, -1).clone()
        separated: list[int] = []
        if n > 1 and cfg.separate:
            found, separated = separate_inputs(grads[layer.weight_index],
                                               grads[layer.bias_index], n, cfg.threshold,
                                               cfg.tolerance)
            inputs[: len(separated)] = found
        if n > 1 and len(separated) < n:
            warnings.append(
                f"the batch has {n} images: analytic inversion separated {len(separated)} of "
                "them (units active for one image only); the other slots hold the "
                "gradient-weighted mixture of the batch's layer inputs (Prop. D.2), not one "
                "image"
            )
        elif n > 1:
            warnings.append(
                f"the batch has {n} images: all {n} were separated from units active for one "
                "image only; every other unit gives a gradient-weighted mixture of the batch's "
                "inputs (Prop. D.2) and was not used"
            )
        if observation.update_kind == "delta" and observation.local_steps > 1:
            warnings.append(
                f"the update is a FedAvg delta over {observation.local_steps} local steps: the "
                "identity grad_A = grad_b * x holds only approximately"
            )
        extras = {"layer": layer.name, "rows_used": rows,
                  "rows_total": int(grads[layer.bias_index].numel()),
                  "separated": len(separated), "separated_rows": separated}
        if progress is not None:
            progress(1, 1, 0.0)
        if starts_with_linear(observation, layer):
            images = inputs.float().view(n, *observation.image_shape).to(device)
            extras["recovered"] = "image"
            return Reconstruction(images=images, labels=labels, objective=0.0, iterations=1,
                                  extras=extras, warnings=warnings)
        extras["recovered"] = "features"
        empty = torch.empty(0, *observation.image_shape, device=device)
        return Reconstruction(images=empty, labels=labels, objective=0.0, iterations=1,
                              extras=extras, features=inputs[: max(len(separated), 1)].float()
                              .to(device),
                              feature_layer=layer.name, warnings=warnings)
