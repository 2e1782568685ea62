"""Pin an encoder's tokens to positions by splitting its first-layer gradient.

In a BERT the first attention's input at an occurrence i of token t_i at position p_i is

    x_i = γ ⊙ c(E_t + P_p + T) / σ_i + β = (a_t + b_p) / σ_i + β,

with ``c`` the mean removal, σ_i the per-vector standard deviation of ``E_t + P_p + T``,
``a_t = γ ⊙ c(E_t)`` and ``b_p = γ ⊙ c(P_p + T)``: every x_i lies in
``span{a_t, b_p, β}``, so the first span holds every batch token at every position and the
token filter cannot pin a token to a position (docs/text.md). The gradient itself can. With the
query/key/value weight gradients stacked (``G = Σ_i δ_i x_iᵀ``, 3d rows), and {a_t, b_p, β}
linearly independent (the batch's tokens, the positions and β: ~113 vectors in ℝᵈ),

    G = Σ_t U_t a_tᵀ + Σ_p V_p b_pᵀ + W βᵀ,   U_t = Σ_{i: t_i = t} δ_i/σ_i,
                                               V_p = Σ_{i: p_i = p} δ_i/σ_i,   W = Σ_i δ_i,

is solved exactly by least squares for the coefficient vectors (:func:`split_gradient`). A
token occurring once has ``U_t = δ_i/σ_i``, one summand of its position's ``V_p``; regressing
every ``V_p`` on the U's (:func:`position_weights`),

    V_p ≈ Σ_t c_{t,p} U_t,   Σ_p c_{t,p} = 1 exactly (Σ_p V_p = Σ_t U_t),

gives ``c ≈ 1`` at the position of a single-occurrence token and ≈ 0 elsewhere; a repeated
token's weight spreads over its positions, and its occurrences' vectors, in no U, leak into the
others' weights (≈ 0.1–0.5). A token whose row has one weight near 1 and the rest small is
*pinned* there (measured on MiniLM at 8 × 32: 38–56 tokens a batch, every one correct). The
candidates of a position (:func:`position_candidates`) are its pinned tokens, then the unpinned
tokens whose weight there is above ``floor`` (nearest 1 first), then the tokens pinned elsewhere
whose weight there is above ``pinned_floor`` (largest first). A repeated token can be pinned at
one of its positions (its weight there within PIN of 1, the others below OTHERS) while another
occurrence keeps a weight near 0 — measured on MiniLM at 8 × 32, −0.09 to 0.04 at the lost
occurrence, in 6 of 10 batches: no floor separates it from the noise, so the encoder's search
tries every batch token at every position once its moves over these sets are spent
(:mod:`encoder`). The end token (``everywhere``) is kept at every position: the search's
lengths are where it is a candidate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from fedleak.attacks.text.transformer_layout import TransformerLayout, part

#: a pinned token's weight lies within PIN of 1 ...
PIN = 0.25
#: ... and every other weight of its row below OTHERS
OTHERS = 0.3


@dataclass(frozen=True)
class GradientSplit:
    """The first-layer gradient split by token and by position.

    ``tokens`` [k] the batch's token ids, ``token_vectors`` [3d, k] the U_t, ``position_vectors``
    [3d, L] the V_p of positions 0..L−1, ``residual`` ‖G − Σ U aᵀ − Σ V bᵀ − W βᵀ‖/‖G‖ (≈ 10⁻⁷
    when the model is a post-LayerNorm embedding as above); ``trained`` when the LayerNorm's β is
    not 0 (a pretrained model, not one at its initialisation).
    """

    tokens: torch.Tensor
    token_vectors: torch.Tensor
    position_vectors: torch.Tensor
    residual: float
    trained: bool = True


def embedding_parts(model: nn.Module) -> nn.Module | None:
    """Return the BERT-style embedding module (word, position, token type, LayerNorm), or None."""
    for module in model.modules():
        if all(isinstance(part(module, n), nn.Module) for n in
               ("word_embeddings", "position_embeddings", "LayerNorm")):
            return module
    return None


def _parameter(module: nn.Module, child: str, name: str) -> torch.Tensor:
    """Return the parameter ``child.name`` of ``module`` in float64 on the CPU, without a graph."""
    value: torch.Tensor = module.get_parameter(f"{child}.{name}")
    return value.detach().double().cpu()


def split_gradient(layout: TransformerLayout, gradients: Mapping[str, torch.Tensor],
                   tokens: torch.Tensor, length: int) -> GradientSplit | None:
    """Solve ``G = Σ U_t a_tᵀ + Σ V_p b_pᵀ + W βᵀ`` (module docstring); None if not a BERT."""
    parts = embedding_parts(layout.model)
    if parts is None:
        return None
    words = _parameter(parts, "word_embeddings", "weight")
    positions = _parameter(parts, "position_embeddings", "weight")[:length]
    if isinstance(part(parts, "token_type_embeddings"), nn.Module):
        types = _parameter(parts, "token_type_embeddings", "weight")
        positions = positions + types[layout.token_type_id or 0]
    gamma = _parameter(parts, "LayerNorm", "weight")
    bias = part(parts.get_submodule("LayerNorm"), "bias")
    beta = _parameter(parts, "LayerNorm", "bias") if isinstance(bias, torch.Tensor) \
        else torch.zeros_like(gamma)

    def centred(v: torch.Tensor) -> torch.Tensor:
        return gamma * (v - v.mean(-1, keepdim=True))

    basis = torch.cat([centred(words[tokens]), centred(positions), beta[None]])  # [k+L+1, d]
    weights = layout.layers[0].gradients(gradients)
    stacked = torch.cat([g.detach().double().cpu().T for g in weights])
    solution = torch.linalg.lstsq(basis.T, stacked.T).solution.T  # [3d, k+L+1]
    residual = float((stacked - solution @ basis).norm() / stacked.norm().clamp_min(1e-300))
    k = tokens.numel()
    return GradientSplit(tokens, solution[:, :k], solution[:, k:k + length], residual,
                         trained=bool(beta.abs().max() > 0))


def position_weights(split: GradientSplit) -> torch.Tensor:
    """Return the least-squares weights c [k, L] of ``V_p ≈ Σ_t c_{t,p} U_t`` (module docstring)."""
    weights: torch.Tensor = torch.linalg.lstsq(split.token_vectors,
                                               split.position_vectors).solution
    return weights


def pinned_positions(weights: torch.Tensor) -> dict[int, int]:
    """Token row → the position it is pinned to (one weight within PIN of 1, the rest < OTHERS)."""
    pinned: dict[int, int] = {}
    if weights.shape[1] < 2:
        return pinned
    top = weights.topk(2, dim=1)
    for row in range(weights.shape[0]):
        first, second = float(top.values[row, 0]), float(top.values[row, 1])
        if abs(first - 1) < PIN and second < OTHERS:
            pinned[row] = int(top.indices[row, 0])
    return pinned


def position_candidates(split: GradientSplit, floor: float = -float("inf"),
                        pinned_floor: float = 0.05, everywhere: int | None = None
                        ) -> tuple[list[torch.Tensor], list[int]]:
    """Candidates per position (module docstring), and how many of each are pinned there.

    Positions whose V_p is zero (no real token there: padding has no δ) end the list.
    """
    weights = position_weights(split)
    pinned = pinned_positions(weights)
    scale = float(split.position_vectors.norm())
    active = int((split.position_vectors.norm(dim=0) > 1e-6 * scale).sum())
    out, counts = [], []
    for p in range(active):
        here = [r for r, q in pinned.items() if q == p]
        free = [r for r in range(weights.shape[0]) if r not in pinned and weights[r, p] > floor]
        free.sort(key=lambda r: abs(float(weights[r, p]) - 1))
        extra = [r for r, q in pinned.items() if q != p and (
            weights[r, p] > pinned_floor or int(split.tokens[r]) == everywhere)]
        extra.sort(key=lambda r: -float(weights[r, p]))
        out.append(split.tokens[torch.tensor(here + free + extra, dtype=torch.long)])
        counts.append(len(here))
    return out, counts


def end_lengths(split: GradientSplit, end: int, batch_size: int) -> list[int] | None:
    """Sentence lengths guessed from the end token's weights, longest first (None: no end token).

    Every sentence holds one end token, so ``Σ_p c_{end,p} = 1`` shares its B occurrences
    among their positions: B·c_{end,p} of them at p, roughly (the leaks of the other repeated
    tokens blur it). The B lengths are ``p + 1`` at the positions of the largest shares, by the
    largest-remainder rule over the positive weights.
    """
    rows = torch.nonzero(split.tokens == end).flatten()
    if rows.numel() == 0:
        return None
    weights = position_weights(split)[int(rows[0])].clamp_min(0)
    if float(weights.sum()) <= 0:
        return None
    share = batch_size * weights / weights.sum()
    counts = share.floor().long()
    for p in torch.argsort(share - counts, descending=True)[:batch_size - int(counts.sum())]:
        counts[p] += 1
    return sorted((p + 1 for p in range(counts.numel()) for _ in range(int(counts[p]))),
                  reverse=True)
