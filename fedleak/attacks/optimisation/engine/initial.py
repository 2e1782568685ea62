"""The init x₀ of an inversion, drawn reproducibly from a seed.

- ``gaussian``: x₀ ~ N(0, 1) per coordinate in the normalised space the attack works in
  (Geiping et al. 2020, Sec. 4; not projected: the box projection follows each step);
- ``uniform``: pixels p ~ U(0, 1), then x₀ = (p − mean) / std per channel (Qian & Hansen 2021,
  Algorithm 2, line 1).

Both are drawn on the CPU from their own ``torch.Generator`` seeded with ``seed`` and then
moved to the device, so restart r starts from the same images on every device and whether the
restarts run one by one, side by side or packed with other observations.
"""

from __future__ import annotations

import torch

from fedleak.attacks.observation import Observation


def gaussian_init(shape: tuple[int, ...], seed: int, device: torch.device) -> torch.Tensor:
    """N(0, 1) images in normalised space, drawn on the CPU from ``seed``, moved to ``device``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator).to(device)


def uniform_init(observation: Observation, seed: int, device: torch.device) -> torch.Tensor:
    """U(0, 1) images in pixel space, drawn on the CPU from ``seed``, in normalised space."""
    shape = (observation.num_images, *observation.image_shape)
    pixels = torch.rand(shape, generator=torch.Generator().manual_seed(seed)).to(device)
    mean = torch.as_tensor(observation.mean, dtype=torch.float32, device=device)
    std = torch.as_tensor(observation.std, dtype=torch.float32, device=device)
    return (pixels - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)
