"""Post-processing of KKT candidates (Haim et al. 2022, Sec. 4 and App. B.3), attacker side.

The KKT attack returns m candidates per run with multipliers λ_i. A candidate with λ_i ≈ 0 does
not enter the stationarity condition (eq. (2)), so it can be anything; several candidates may
converge to the same training point. The attacker, who never sees the training set, therefore:

1. **Scales** each candidate to [0, 1] by its own minimum and maximum (App. B.3 step 1):
   x ↦ (x − min x) / (max x − min x); a constant candidate becomes all 0.5.
2. **Keeps** the candidates with λ_i > ``lambda_threshold`` (Sec. 4 removes λ_i < 5 in 2-D).
3. **Merges near duplicates** by normalised cross-correlation (NCC, Lewis 1995),
   NCC(a, b) = ⟨a − ā, b − b̄⟩ / (‖a − ā‖ ‖b − b̄‖). Rule: visit the kept candidates by
   decreasing λ; the first not yet grouped one opens a group, and every not-yet-grouped
   candidate whose NCC with it is at least ``merge_ncc`` joins that group. Each group becomes
   one candidate, the pixel-wise mean of its members (on [0, 1]), with the largest λ of the
   group. This is App. B.3's "mean of all the closest nearest neighbours", done among the
   candidates themselves because the attacker has no training sample to vote with.

For low-dimensional points (the 2-D experiment of Sec. 4) :func:`remove_duplicates` drops, in
the same λ order, every point closer than ``min_distance`` (Euclidean, 0.03 in the paper) to a
point already kept; the paper visits the points in random order, λ order is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def scale_to_unit(candidates: Tensor) -> Tensor:
    """Min–max scale every candidate ``[M, ...]`` to [0, 1] on its own (App. B.3, step 1)."""
    flat = candidates.flatten(1)
    low = flat.min(1, keepdim=True).values
    span = flat.max(1, keepdim=True).values - low
    scaled = torch.where(span > 0, (flat - low) / span.clamp_min(1e-30), torch.full_like(flat, 0.5))
    return scaled.view_as(candidates)


def normalized_cross_correlation(a: Tensor, b: Tensor) -> Tensor:
    """NCC of every pair, ``[A, B]`` in [−1, 1]; constant images correlate 0 with everything."""
    a = a.flatten(1).double()
    b = b.flatten(1).double()
    a = a - a.mean(1, keepdim=True)
    b = b - b.mean(1, keepdim=True)
    a = a / a.norm(dim=1, keepdim=True).clamp_min(1e-30)
    b = b / b.norm(dim=1, keepdim=True).clamp_min(1e-30)
    return a @ b.T


@dataclass
class ProcessedCandidates:
    """Merged candidates on [0, 1] and where they came from.

    ``images`` ``[K, ...]``; ``lambdas`` ``[K]`` (largest λ of the group); ``labels`` ``[K]``
    (label of the group's first member); ``group`` ``[M]``: the output index each input
    candidate went to, −1 where it was dropped for a small λ.
    """

    images: Tensor
    lambdas: Tensor
    labels: Tensor
    group: Tensor

    def __len__(self) -> int:
        """Return K, the number of candidates kept."""
        return int(self.images.shape[0])


def postprocess_candidates(
    candidates: Tensor,
    lambdas: Tensor,
    labels: Tensor | None = None,
    *,
    lambda_threshold: float = 0.0,
    merge_ncc: float = 0.95,
) -> ProcessedCandidates:
    """Scale, keep λ > ``lambda_threshold``, merge candidates with NCC ≥ ``merge_ncc``.

    ``merge_ncc`` > 1 disables merging. See the module docstring for the exact rule.
    """
    m = candidates.shape[0]
    if lambdas.shape != (m,):
        raise ValueError(f"{m} candidates but lambdas of shape {tuple(lambdas.shape)}")
    labels = labels if labels is not None else torch.zeros(m, dtype=torch.long)
    scaled = scale_to_unit(candidates.detach())
    finite = torch.isfinite(scaled.flatten(1)).all(1) & torch.isfinite(lambdas)
    kept = torch.nonzero(finite & (lambdas > lambda_threshold)).flatten()
    kept = kept[torch.argsort(lambdas[kept], descending=True, stable=True)]
    group = torch.full((m,), -1, dtype=torch.long)
    ncc = normalized_cross_correlation(scaled[kept], scaled[kept])
    free = torch.ones(len(kept), dtype=torch.bool)
    images: list[Tensor] = []
    group_lambdas: list[Tensor] = []
    group_labels: list[Tensor] = []
    for position in range(len(kept)):
        if not free[position]:
            continue
        members = torch.nonzero(free & (ncc[position] >= merge_ncc)).flatten()
        members = torch.unique(torch.cat([members, torch.tensor([position])]))
        free[members] = False
        group[kept[members]] = len(images)
        images.append(scaled[kept[members]].mean(0))
        group_lambdas.append(lambdas[kept[position]])
        group_labels.append(labels[kept[position]])
    shape = tuple(candidates.shape[1:])
    return ProcessedCandidates(
        images=torch.stack(images) if images else scaled.new_zeros((0, *shape)),
        lambdas=torch.stack(group_lambdas) if images else lambdas.new_zeros(0),
        labels=torch.stack(group_labels) if images else labels.new_zeros(0),
        group=group,
    )


def remove_duplicates(points: Tensor, lambdas: Tensor, min_distance: float) -> Tensor:
    """Return the indices of the points kept by Sec. 4's greedy de-duplication, by decreasing λ.

    A point is dropped when it lies closer than ``min_distance`` (Euclidean, in input space)
    to a point kept before it.
    """
    order = torch.argsort(lambdas, descending=True, stable=True)
    flat = points.flatten(1).double()
    kept: list[int] = []
    for index in order.tolist():
        if kept and bool((flat[kept] - flat[index]).norm(dim=1).min() < min_distance):
            continue
        kept.append(index)
    return torch.tensor(kept, dtype=torch.long)
