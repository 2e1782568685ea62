"""The fully-connected layer an honest batch attack inverts, and the labels of what it recovered.

What :mod:`~fedleak.attacks.exact.spear` and :mod:`~fedleak.attacks.exact.cocktail_party.cpa`
share: the layer, what they need of it, and the labels of the inputs they recovered.

A layer ``z = W h + b`` whose weight gradient is ``∂L/∂W = Σ_j δ_j h_jᵀ`` (one term per input
of the batch) mixes its inputs linearly — the observation both attacks start from. Its input
``h`` is the image itself when it is the network's first trainable layer over the flattened
image (the zoo's ``mlp``), otherwise the output of the layers before it (a known feature
extractor: the convolutions of ``lenet-zhu`` or ``convnet`` in front of their classifier).

**Labels of recovered inputs.** Once the inputs ``x_j`` are known, each label is read from the
classifier's gradient: the observed update is, up to a positive factor (1/n, τ, the users of a
secure-aggregation sum), ``Σ_j g(x_j, y_j)``, so the labels are chosen, image by image, to
bring the replayed classifier gradient ``Σ_j g_c(x_j, y_j)`` closest to the observed one
(coordinate descent over the images from the counting estimate's classes, at most a few
sweeps; each candidate is a one-image replay through ``Observation.simulate``).
"""

from __future__ import annotations

import torch

from fedleak.attacks.exact.analytic import LinearLayer, biased_linear_layers, starts_with_linear
from fedleak.attacks.labels import recover_labels
from fedleak.attacks.malicious.label_flipping import classifier_names
from fedleak.attacks.observation import Observation


class ModelDoesNotFit(ValueError):
    """The model or the update cannot carry this attack.

    The message says why and what to use instead.
    """


def first_linear_layer(observation: Observation, choice: str, attack: str) -> LinearLayer:
    """Return the layer ``choice`` names.

    ``auto``/``first`` (the first biased linear layer over the flattened image: the model's
    first trainable layer), ``last`` (the classifier, after a feature extractor), or a module
    name.

    Raises
    ------
    ModelDoesNotFit
        With the reason, when there is no such layer.
    """
    layers = biased_linear_layers(observation)
    first_name = observation.parameter_names[0] if observation.parameter_names else "none"
    first_shape = list(observation.update[0].shape) if observation.update else []
    if not layers:
        raise ModelDoesNotFit(
            f"{attack} inverts a biased fully-connected layer (a NAME.weight [m, d] with a "
            f"NAME.bias [m]); this model has none: use inverting-gradients")
    if choice in ("auto", "first"):
        layer = layers[0]
        if not starts_with_linear(observation, layer):
            raise ModelDoesNotFit(
                f"{attack} needs the first trainable layer to be fully connected over the "
                f"flattened image; this model's first parameter is {first_name} "
                f"{first_shape}. Name the layer after its feature extractor instead "
                f"(-o layer={layers[-1].name} or layer=last"
                + (", which cocktail-party inverts to features, then images)" if
                   attack == "cocktail-party" else ")")
                + ", or use inverting-gradients")
        return layer
    if choice == "last":
        return layers[-1]
    for layer in layers:
        if layer.name == choice:
            return layer
    valid = ", ".join(["auto", "first", "last", *(layer.name for layer in layers)])
    raise ModelDoesNotFit(f"no biased linear layer {choice!r}; choose one of {valid}")


def gradient_of(observation: Observation, layer: LinearLayer) -> tuple[torch.Tensor,
                                                                         torch.Tensor]:
    """Return the layer's weight and bias gradient, float64 on the CPU.

    A FedAvg delta is turned into a gradient direction first.
    """
    grads = observation.gradient_direction()
    return (grads[layer.weight_index].detach().double().cpu(),
            grads[layer.bias_index].detach().double().cpu())


def layer_parameters(observation: Observation, layer: LinearLayer) -> tuple[torch.Tensor,
                                                                              torch.Tensor]:
    """Return the layer's weight and bias at the sent θ, float64 on the CPU."""
    return (observation.parameters[layer.weight_index].detach().double().cpu(),
            observation.parameters[layer.bias_index].detach().double().cpu())


def relu_follows(observation: Observation, layer: LinearLayer) -> bool:
    """Tell whether a ReLU (an exact zero gradient at inactive units) follows the layer.

    Replay the user's update on one probe image and look for rows of the weight gradient that
    are exactly zero (more than 5 % of them). A sigmoid or tanh leaves none; a ReLU about half.
    """
    device = observation.parameters[0].device
    low, high = observation.image_bounds(device)
    generator = torch.Generator().manual_seed(0)
    probe = low + torch.rand((1, *observation.image_shape), generator=generator).to(device) \
        * (high - low)
    labels = torch.zeros(1, dtype=torch.long, device=device)
    with torch.enable_grad():
        update = observation.simulate(probe, labels)
    rows = update[layer.weight_index].detach()
    zero_rows = (rows.abs().amax(dim=1) == 0).float().mean()
    return bool(zero_rows > 0.05)


def check_update(observation: Observation, attack: str) -> list[str]:
    """Refuse FedAvg deltas over several local steps; warn of what degrades the attack.

    Over several local steps the mixture is no longer one gradient's. The warnings returned name
    what degrades the attack (published noise, pruning, quantisation).

    Raises
    ------
    ModelDoesNotFit
        For a FedAvg delta of more than one local step.
    """
    if observation.update_kind == "delta" and observation.local_steps > 1:
        raise ModelDoesNotFit(
            f"{attack} reads one gradient's mixture Σ_j δ_j x_jᵀ; this FedAvg update took "
            f"{observation.local_steps} local steps, so the mixture changed between them. "
            "Attack FedSGD, or FedAvg with one local step (--local-epochs 1 and "
            "--local-batch-size 0), or use the fedavg attack")
    warnings = []
    noisy = [d.name for d in observation.defenses if d.name in ("dpsgd", "noise", "prune",
                                                                  "quantize")]
    if noisy:
        warnings.append(f"the victim publishes {', '.join(noisy)}: the gradient's linear "
                        f"structure (and the exact zeros a ReLU leaves) is perturbed, so {attack} "
                        "recovers less or nothing")
    return warnings


def labels_for_inputs(observation: Observation, inputs: torch.Tensor,
                      sweeps: int = 3) -> torch.Tensor:
    """Return the labels of recovered images ``inputs`` [n, C, H, W] (normalised space).

    Read from the classifier's gradient (module docstring): coordinate descent, at most
    ``sweeps`` sweeps, on ``‖s Σ_j g_c(x_j, y_j) − g_c‖`` with the best scale ``s``. Falls back
    to :func:`recover_labels` when the model has no classifier layer (a 2-D weight with one row
    per class) or more than 4096 image × class replays would be needed.
    """
    n, k = inputs.shape[0], observation.num_classes
    try:
        weight, bias = classifier_names(observation.named_parameters(), k)
    except ValueError:
        return recover_labels(observation)
    keep = [observation.index_of(weight)] + \
        ([observation.index_of(bias)] if bias is not None else [])
    observed = torch.cat([observation.gradient_direction()[i].detach().double().flatten()
                          for i in keep]).cpu()
    device = observation.parameters[0].device
    if n * k > 4096:
        return recover_labels(observation)
    replays = torch.zeros(n, k, observed.numel(), dtype=torch.float64)
    for j in range(n):
        for c in range(k):
            with torch.enable_grad():
                update = observation.simulate(
                    inputs[j:j + 1].to(device).float(),
                    torch.tensor([c], dtype=torch.long, device=device))
            replays[j, c] = torch.cat([update[i].detach().double().flatten()
                                       for i in keep]).cpu()
    start = recover_labels(observation).cpu()
    labels = [int(y) for y in start.tolist()]

    def residual(chosen: list[int]) -> float:
        total = replays[torch.arange(n), torch.tensor(chosen)].sum(0)
        scale = float(total @ observed) / max(float(total @ total), 1e-300)
        return float((scale * total - observed).norm())

    best = residual(labels)
    for _ in range(sweeps):
        changed = False
        for j in range(n):
            for c in range(k):
                if c == labels[j]:
                    continue
                trial = labels.copy()
                trial[j] = c
                value = residual(trial)
                if value < best - 1e-12 * max(best, 1.0):
                    labels, best, changed = trial, value, True
        if not changed:
            break
    return torch.tensor(labels, dtype=torch.long, device=device)


def expected_sets(n: int, zero_fraction: float = 0.5) -> float:
    """Return about how many random sets of n − 1 rows SPEAR tries to find every direction.

    A coupon collector over inputs found with probability ``f^{n−1}`` each
    (``f = zero_fraction``): ``H_n / f^{n−1}`` sets, ``H_n`` the n-th harmonic number.
    """
    per_input = zero_fraction ** (n - 1)
    harmonic = sum(1.0 / i for i in range(1, n + 1))
    return harmonic / max(per_input, 1e-300) if n > 1 else 1.0
