"""Audit canaries: synthetic, public objects whose presence a game tests.

Only the coin that says whether a trial carries the canary is secret; the canary itself must be
known to the auditor, who scores every trial against it.

- **gradient canary** (Nasr et al. 2023, Sec. 5.1): a direction u in parameter space, ‖u‖₂ = 1,
  entering the user's computation as one extra example's gradient of norm ‖c‖ (``norm``) —
  either a Dirac e_j on a coordinate j that real data barely moves (:func:`quiet_coordinate`),
  or a seeded random direction (:func:`random_direction`);
- **input canary**: a crafted, deliberately mislabelled image — seeded uniform noise with a
  seeded label — added to the user's batch (:func:`input_canary`); it works for every defense,
  including those that never see per-example gradients, but its gradient is not the auditor's
  choice, so it audits less tightly;
- **canary client** (Andrew et al. 2024): a whole update ‖c‖ · u from an extra user of a
  secure-aggregation round, u a seeded random direction.

All canaries are functions of public inputs (shapes, a seed, a coordinate), so anyone can
rebuild them; none of them is derived from private data.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

GRADIENT = "gradient"
INPUT = "input"
CLIENT = "client"
CANARY_KINDS = (GRADIENT, INPUT, CLIENT)
DIRAC = "dirac"
RANDOM = "random"
DIRECTIONS = (DIRAC, RANDOM)


def dirac(shapes: Sequence[Sequence[int]], coordinate: int) -> list[torch.Tensor]:
    """Return e_j, the basis vector at flat index ``coordinate``, one tensor per parameter.

    e_j: one tensor per parameter, zero but for a 1 at flat index ``coordinate`` of the concatenated
    parameters.
    """
    sizes = [int(torch.Size(s).numel()) for s in shapes]
    total = sum(sizes)
    if not 0 <= coordinate < total:
        raise ValueError(f"the Dirac coordinate must lie in [0, {total}), got {coordinate}")
    flat = torch.zeros(total)
    flat[coordinate] = 1.0
    return split_flat(flat, shapes)


def random_direction(shapes: Sequence[Sequence[int]], seed: int) -> list[torch.Tensor]:
    """Return a uniformly random unit direction.

    N(0, I) from a generator seeded with ``seed``, normalised to ‖u‖₂ = 1.
    """
    total = sum(int(torch.Size(s).numel()) for s in shapes)
    flat = torch.randn(total, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return split_flat((flat / flat.norm()).float(), shapes)


def quiet_coordinate(gradient: Sequence[torch.Tensor]) -> int:
    """Return the flat index of the smallest ``|g_j|`` (ties: the first).

    Where a Dirac canary stands out most from what data moves. ``gradient`` should come from public,
    synthetic data.
    """
    flat = torch.cat([g.detach().flatten().abs() for g in gradient])
    return int(torch.argmin(flat))


def input_canary(shape: Sequence[int], num_classes: int, seed: int) \
        -> tuple[torch.Tensor, int]:
    """Return a seeded uniform-noise image on [0, 1] of ``shape`` (C, H, W) and a seeded label.

    An input no real data resembles, labelled arbitrarily (mislabelled by construction).
    """
    generator = torch.Generator().manual_seed(seed)
    image = torch.rand(tuple(shape), generator=generator)
    label = int(torch.randint(0, num_classes, (1,), generator=generator))
    return image, label


def split_flat(flat: torch.Tensor, shapes: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Return a flat vector cut into tensors of ``shapes``, in order."""
    out, start = [], 0
    for shape in shapes:
        size = int(torch.Size(shape).numel())
        out.append(flat[start:start + size].reshape(tuple(shape)).clone())
        start += size
    return out


def flat_dot(update: Sequence[torch.Tensor], direction: Sequence[torch.Tensor]) -> float:
    """⟨update, direction⟩ over all tensors (in float64)."""
    return float(sum((u.double() * d.double()).sum() for u, d in zip(update, direction,
                                                                       strict=True)))
