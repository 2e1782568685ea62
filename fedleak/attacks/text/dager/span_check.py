"""DAGER's span check: is a vector one of a linear layer's inputs.

(Petrov et al., "DAGER: Exact Gradient Inversion for Large Language Models", NeurIPS 2024, arXiv
2405.15586).

For a linear layer ``Z = X W`` applied to the b token vectors of a batch, ``X`` [b, n] (one row
per token of every sentence; ``n`` the layer's input width), the weight gradient is

    ∇_W L = Xᵀ ∂L/∂Z = Σ_t x_t δ_tᵀ

so its column space lies in ``span{x_t}`` and ``rank ∇_W L ≤ min(b, n, m)`` (the paper's
low-rank lemma). **Rank condition** (its span theorem): when ``b < n`` and ``∂L/∂Z`` has rank b
(generic; the rows of tokens whose δ_t is zero — padding, a causal model's last token — drop
out of both sides),

    colspan(∇_W L) = span{x_t : δ_t ≠ 0},

and a vector ``x`` in general position lies in that b-dimensional subspace of ℝⁿ with
probability 0. So with the orthonormal basis ``U_r`` of the r leading left singular vectors of
∇_W L,

    d(x) = ‖x̂ − U_r U_rᵀ x̂‖₂,   x̂ = x / ‖x‖                              (the span check)

is 0 (up to floating-point error) for every input of the layer and bounded away from 0 for any
other vector: about ``√(1 − r/n)`` for a random direction. The check stops separating when
``r`` reaches ``n``: for a batch of ``B`` sentences of ``T`` tokens, when the number of distinct
token vectors — at most ``B·T`` — reaches the hidden size. That is where DAGER stops.

The rank is read from the singular values ``s₁ ≥ s₂ ≥ …`` (:func:`numerical_rank`): the cut
is the largest drop into the rounding noise of the gradient's precision (float32: ε ≈ 1.2·10⁻⁷;
the noise of a transformer's float32 gradient sits near ε·s₁, while the signal of a low-rank
gradient spreads over five decades above it, and the tokens with the weakest δ may sit within
a decade of the noise: where their directions are lost, their span distance is not 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: singular values below NOISE_FACTOR·ε·s₁ count as rounding noise (float32 gradients of
#: transformers put their noise near 0.3–1.5·ε·s₁; the weakest tokens' signal sits above 10·ε·s₁)
NOISE_FACTOR = 10.0
#: the smallest step from signal into noise that counts as the cut
MIN_DROP = 3.0


class SpanError(ValueError):
    """The gradients cannot give a span: wrong shapes, non-finite values, nothing to read."""


@dataclass(frozen=True)
class InputSpan:
    """The span of a linear layer's inputs, read from its weight gradient.

    ``basis`` [n, r] has orthonormal columns; ``singular_values`` are all of the stacked
    gradient's, descending (for reports: where the cut was). ``full`` when ``rank`` reached
    ``n − 1``: every vector is (nearly) in the span and the check tells nothing.
    """

    basis: torch.Tensor
    singular_values: torch.Tensor
    rank: int
    input_dim: int

    @property
    def full(self) -> bool:
        """Tell whether the span leaves at most one direction of ℝⁿ unchecked.

        Whether the span leaves at most one direction of ℝⁿ unchecked (B·T reached the hidden size):
        a LayerNorm with β = 0 outputs vectors of zero mean, so its inputs fill n − 1 dimensions at
        most.
        """
        return self.rank >= self.input_dim - 1

    def distance(self, vectors: torch.Tensor) -> torch.Tensor:
        """Return the span distance ``d(x) = ‖x̂ − U Uᵀ x̂‖₂`` along the last axis.

        ``d(x) = ‖x̂ − U Uᵀ x̂‖₂`` for every vector along the last axis of ``vectors`` ([..., n] →
        [...]); 0 for the layer's inputs, about √(1 − r/n) for a random vector.
        """
        if vectors.shape[-1] != self.input_dim:
            raise SpanError(f"vectors of width {vectors.shape[-1]} cannot be checked against a "
                            f"span in R^{self.input_dim}")
        basis = self.basis.to(device=vectors.device)
        unit = vectors.to(basis.dtype)
        unit = unit / unit.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        residual: torch.Tensor = unit - (unit @ basis) @ basis.T
        distance: torch.Tensor = torch.linalg.vector_norm(residual, dim=-1)
        return distance


def input_span(gradients: Sequence[torch.Tensor], rank: int | None = None,
               noise: float = NOISE_FACTOR) -> InputSpan:
    """Return the span of the inputs of the layers whose weight ``gradients`` are given.

    The span of the inputs of the layers whose weight ``gradients`` are given, each [n, m_k] with
    the input dimension first (a ``Conv1D`` weight as stored; a ``nn.Linear`` weight's gradient
    transposed). Several gradients of layers reading the same input (query, key and value) are
    stacked side by side: ``[∇W_Q ∇W_K ∇W_V]`` has the same column space, with every token whose δ
    reaches any of them. ``rank`` overrides the rank read from the singular values (the paper's rank
    cutoff); ``noise`` sets where the rounding noise ends (:func:`numerical_rank`).
    """
    if not gradients:
        raise SpanError("no gradient given: name the layer's weight gradients")
    width = gradients[0].shape[0]
    for g in gradients:
        if g.dim() != 2 or g.shape[0] != width:
            raise SpanError(f"gradients must be 2-D with the input dimension first; got shapes "
                            f"{[tuple(x.shape) for x in gradients]}")
        if not torch.isfinite(g).all():
            raise SpanError("a gradient holds NaN or infinite values: the update is not a "
                            "gradient DAGER can read (was it clipped to nothing or overflowed?)")
    stacked = torch.cat([g.detach().to(torch.float64).cpu() for g in gradients], dim=1)
    u, s = left_singular(stacked)
    if s.numel() == 0 or float(s[0]) == 0.0:
        raise SpanError("the gradient is zero: no token reached this layer (an empty batch, "
                        "or an update that is not this model's gradient)")
    found = numerical_rank(s, gradients[0].dtype, noise) if rank is None else rank
    if not 0 < found <= width:
        raise SpanError(f"rank must lie in 1..{width}; got {found}")
    return InputSpan(basis=u[:, :found].contiguous(), singular_values=s, rank=found,
                     input_dim=width)


def left_singular(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Left singular vectors and singular values of ``matrix`` [n, m].

    For m > n through the QR factorisation ``Mᵀ = QR`` (``M = Rᵀ Qᵀ`` has the left singular vectors
    and values of the square ``Rᵀ``), a few times faster than the SVD of the wide matrix.
    """
    if matrix.shape[1] > matrix.shape[0]:
        _, r = torch.linalg.qr(matrix.T)
        matrix = r.T
    u, s, _ = torch.linalg.svd(matrix, full_matrices=False)
    return u, s


def numerical_rank(singular_values: torch.Tensor, dtype: torch.dtype,
                   noise: float = NOISE_FACTOR) -> int:
    """Return the numerical rank: singular values above the rounding noise of ``dtype``.

    The number of singular values (descending) above the rounding noise of a gradient computed in
    ``dtype`` (machine epsilon ε): the cut at the largest drop ``s_r / s_{r+1} ≥ MIN_DROP`` whose
    lower side lies in the noise region ``s_{r+1} < 2·noise·ε·s₁`` (inside a noise bulk neighbouring
    values differ by a few per cent; the step from the weakest signal down to the bulk is the
    largest), else every ``s_i > noise·ε·s₁``.
    """
    s = singular_values
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else torch.finfo(torch.float32).eps
    level = noise * eps * float(s[0])
    if s.numel() >= 2:
        lower = s[1:]
        ratios = s[:-1] / lower.clamp_min(torch.finfo(s.dtype).tiny)
        ratios = torch.where(lower < 2 * level, ratios, torch.zeros_like(ratios))
        best = int(torch.argmax(ratios))
        if float(ratios[best]) >= MIN_DROP and float(s[best]) > level / noise:
            return best + 1
    return int((s > level).sum())
