"""Gradient matching on continuous token embeddings.

The distances TAG and LAMP minimise, LAMP's embedding-length regulariser, and the projection of
embeddings back to tokens.

For candidate embeddings ``x`` [B, T, d] the replay of the user's update gives ``∇' = ∇_θ
L(x, y)``; it is compared with the observed gradient ``∇`` parameter by parameter (l):

* TAG (Deng et al., "TAG: Gradient Attack on Transformer-based Language Models", Findings of
  EMNLP 2021, arXiv 2103.06819): ``Σ_l ‖∇'_l − ∇_l‖₂ + α ‖∇'_l − ∇_l‖₁``;
* LAMP's cosine (Balunović et al. 2022, after Geiping et al. 2020):
  ``1 − ⟨∇', ∇⟩ / (‖∇'‖ ‖∇‖)`` over all parameters at once;
* LAMP's regulariser: ``(mean_t ‖x_t‖ − mean_v ‖E_v‖)²``, which keeps the embeddings'
  lengths at the vocabulary's;
* the projection: each ``x_t`` becomes the token of the nearest embedding row (Euclidean).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

OBJECTIVES = ("cosine", "tag")


def gradient_distance(candidate: Sequence[torch.Tensor], observed: Sequence[torch.Tensor],
                      objective: str, tag_alpha: float = 0.01) -> torch.Tensor:
    """Return the distance ``objective`` (``cosine`` or ``tag``) between two gradient lists."""
    if len(candidate) != len(observed):
        raise ValueError(f"the replay returned {len(candidate)} gradients for "
                         f"{len(observed)} observed ones: they must be aligned by parameter")
    if objective == "cosine":
        inner = torch.stack([(c * o).sum() for c, o in zip(candidate, observed, strict=True)])
        norm_c = torch.stack([(c * c).sum() for c in candidate]).sum().sqrt()
        norm_o = torch.stack([(o * o).sum() for o in observed]).sum().sqrt()
        return 1 - inner.sum() / (norm_c * norm_o).clamp_min(1e-30)
    if objective == "tag":
        total = candidate[0].new_zeros(())
        for c, o in zip(candidate, observed, strict=True):
            diff = c - o
            total = total + diff.norm() + tag_alpha * diff.abs().sum()
        return total
    raise ValueError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")


def length_regulariser(embeddings: torch.Tensor, vocabulary: torch.Tensor,
                       mask: torch.Tensor) -> torch.Tensor:
    """``(mean_t ‖x_t‖ − mean_v ‖E_v‖)²`` over the unmasked positions."""
    lengths = embeddings.norm(dim=-1)
    weights = mask.to(lengths.dtype)
    mean = (lengths * weights).sum() / weights.sum().clamp_min(1)
    target = torch.linalg.vector_norm(vocabulary, dim=-1).mean()
    return torch.square(mean - target)


def nearest_tokens(embeddings: torch.Tensor, vocabulary: torch.Tensor,
                   allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Return the id of the nearest ``vocabulary`` row to each of ``embeddings``.

    The id of the nearest row of ``vocabulary`` [V, d] to each of ``embeddings`` [..., d], among
    ``allowed`` ids when given (a recovered token set).
    """
    table = vocabulary if allowed is None else vocabulary[allowed]
    flat = embeddings.detach().reshape(-1, embeddings.shape[-1]).to(table.dtype)
    ids = torch.cdist(flat, table).argmin(dim=1)
    if allowed is not None:
        ids = allowed.to(ids.device)[ids]
    return ids.reshape(embeddings.shape[:-1])
