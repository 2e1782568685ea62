"""Feature inversion: images whose input to a linear layer points along recovered features.

Kariyappa et al., "Cocktail Party Attack", ICML 2023, Sec. 4.3, for models whose first trainable
layer is not fully connected (the attack is :mod:`~fedleak.attacks.exact.cocktail_party.cpa`).
"""

from __future__ import annotations

import torch

from fedleak.attacks.base import Progress
from fedleak.attacks.exact.analytic import LinearLayer
from fedleak.attacks.exact.cocktail_party.cpa_options import CocktailPartyConfig
from fedleak.attacks.observation import Observation
from fedleak.attacks.optimisation.priors import total_variation


def replayed_input(observation: Observation, layer: LinearLayer, image: torch.Tensor,
                   label: torch.Tensor) -> torch.Tensor:
    """Return the layer's input for one image, from its one-image replay.

    The ratios ``∂L/∂W_i / ∂L/∂b_i`` combined over the rows by least squares (exact for one
    input), differentiable in ``image``.
    """
    update = observation.simulate(image, label)
    weight, bias = update[layer.weight_index], update[layer.bias_index]
    return (bias[:, None] * weight).sum(0) / bias.square().sum().clamp_min(1e-30)


def invert_features(observation: Observation, layer: LinearLayer, features: torch.Tensor,
                    labels: torch.Tensor, cfg: CocktailPartyConfig, seed: int,
                    progress: Progress | None) -> torch.Tensor:
    """Find images whose layer inputs point along ``features`` (cosine).

    Adam minimises, over the images ``x_j`` with a feature, in the image box,
    ``Σ_j (1 − cos(h(x_j), ĥ_j)) / count + fi_tv · TV(x) + fi_gm · (1 − cos(∇θ L(x), g))``
    (Kariyappa et al. Sec. 4.3, with TV and optional gradient matching against the observed
    update ``g``); ``h`` is :func:`replayed_input`. Slots without a feature keep the mean image.
    """
    n, count = observation.num_images, features.shape[0]
    device = features.device
    low, high = observation.image_bounds(device)
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn((n, *observation.image_shape), generator=generator).to(device)
    images = torch.maximum(torch.minimum(images, high), low)
    images[count:] = 0.0
    variable = images[:count].clone().requires_grad_(True)
    optimiser = torch.optim.Adam([variable], lr=cfg.fi_lr)
    target = [u.detach() for u in observation.gradient_direction()]
    for step in range(cfg.fi_iterations):
        optimiser.zero_grad()
        with torch.enable_grad():
            loss = variable.new_zeros(())
            for j in range(count):
                h = replayed_input(observation, layer, variable[j:j + 1], labels[j:j + 1])
                loss = loss + (1 - torch.nn.functional.cosine_similarity(
                    h, features[j], dim=0)) / count
            if cfg.fi_tv > 0:
                loss = loss + cfg.fi_tv * total_variation(variable)
            if cfg.fi_gm > 0:
                full = torch.cat([variable, images[count:]])
                replay = observation.simulate(full, labels)
                dot = torch.stack([(a * b).sum() for a, b in zip(replay, target,
                                                                 strict=True)]).sum()
                norms = torch.stack([a.square().sum() for a in replay]).sum().sqrt() * \
                    torch.stack([b.square().sum() for b in target]).sum().sqrt()
                loss = loss + cfg.fi_gm * (1 - dot / norms.clamp_min(1e-30))
            torch.autograd.backward(loss)
        optimiser.step()
        with torch.no_grad():
            variable.copy_(torch.maximum(torch.minimum(variable, high), low))
        if progress is not None and ((step + 1) % 50 == 0 or step + 1 == cfg.fi_iterations):
            progress(step + 1, cfg.fi_iterations, float(loss))
    images[:count] = variable.detach()
    return images
