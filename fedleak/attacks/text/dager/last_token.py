"""Recover each sentence's last token from the final LayerNorm's gradient.

The last token of each sentence of a causal language model, from the final LayerNorm's gradient (an
extension of DAGER: the last token has no loss after it, so its δ is zero in every layer and no span
holds it).

With the prefixes ``x_b = (x_{b,0}, …, x_{b,n_b−1})`` known (every token but the last), the
model's forward on them gives, at every position t, the final LayerNorm's normalised input
``n̂_t = (u_t − μ_t)/σ_t`` and the next-token distribution ``p_t``. The loss is the mean
cross-entropy over the ``N = Σ_b n_b`` predicted tokens (Hugging Face's causal-LM loss: labels
shifted, padding −100), so ``∂L/∂z_t = (p_t − e_{y_t})/N`` and, through ``o_t = γ ⊙ n̂_t + β``
and the output embedding ``W`` [V, d],

    ∂L/∂γ = (1/N) Σ_t (Wᵀ (p_t − e_{y_t})) ⊙ n̂_t,      ∂L/∂β = (1/N) Σ_t Wᵀ (p_t − e_{y_t}).

Every label is known but ``y_b``, the last token, predicted at each sentence's last known
position ``t_b = n_b − 1``. Subtracting the known part ``A`` (the same formula with
``e_{y_{t_b}}`` left out: the gradient of ``(1/N)[Σ_known CE + Σ_b logsumexp z_{t_b}]``) leaves

    N (A − ∇L) = Σ_b ( W_{y_b} ⊙ n̂_{t_b} ,  W_{y_b} )   ∈ ℝ²ᵈ,

a sum of B known 2d-vectors, one chosen per sentence among V. Coordinate descent picks each
``y_b`` as the minimiser of the remaining residual (in closed form for the whole vocabulary at
once), and exchanges two sentences' tokens where that lowers it (two tokens found but crossed
is a fixed point of the single changes); the residual left, relative to the target's norm,
certifies the choice (0 up to float32 rounding when every prefix is right). When the update is
a multiple of the gradient (a FedAvg delta of one local step, −τ∇L) the fit is poor at scale
1; the scale s of ``N(A − s·update)`` is then refitted by least squares against the decoded
tokens, and the decoding repeated.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from fedleak.attacks.text.transformer_layout import LayoutError, TransformerLayout, part

#: coordinate-descent sweeps over the sentences
SWEEPS = 8
#: a fit this good (relative residual) is the exact answer; else the update's scale is fitted
FITTED = 1e-4
#: decodings with a refitted scale at most
SCALE_FITS = 4


def last_tokens(layout: TransformerLayout, gradients: Mapping[str, torch.Tensor],
                prefixes: list[list[int]]) -> tuple[list[int], float]:
    """Each prefix's last token and the relative residual of the fit (module docstring)."""
    if layout.final_norm is None or layout.final_norm_weights is None or layout.head is None:
        raise LayoutError("the last tokens need a causal LM's final LayerNorm and output "
                          "embedding (layout.final_norm, final_norm_weights, head)")
    for name in layout.final_norm_weights:
        if name not in gradients:
            raise LayoutError(f"the update has no gradient for {name!r}: the last tokens of a "
                              "causal LM are read from the final LayerNorm's gradient")
    known, observed, normalised = _target(layout, gradients, prefixes)
    head = layout.head.detach().to(torch.float64).cpu()
    best: tuple[list[int], float] = ([], float("inf"))
    scale = 1.0
    for _ in range(SCALE_FITS):
        target = known - scale * observed
        chosen = _pursuit(target, normalised, head)
        fitted = sum((_feature(head[y], n) for y, n in zip(chosen, normalised, strict=True)),
                     torch.zeros_like(target))
        fit = float((target - fitted).norm() / target.norm().clamp_min(1e-30))
        if fit < best[1]:
            best = (chosen, fit)
        if fit < FITTED:
            break
        # the update may be a multiple of the gradient (one local step: −τ∇L): fit the scale
        scale = float((known - fitted) @ observed / (observed @ observed).clamp_min(1e-300))
    return best


def _target(layout: TransformerLayout, gradients: Mapping[str, torch.Tensor],
            prefixes: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """``N A`` and ``N ∇L`` over (γ, β), and each sentence's ``n̂_{t_b}``."""
    assert layout.final_norm is not None and layout.final_norm_weights is not None
    norm = layout.final_norm
    lengths = [len(p) for p in prefixes]
    width = max(lengths)
    ids = torch.zeros(len(prefixes), width, dtype=torch.long)
    mask = torch.zeros(len(prefixes), width, dtype=torch.long)
    for row, prefix in enumerate(prefixes):
        ids[row, :len(prefix)] = torch.tensor(prefix)
        mask[row, :len(prefix)] = 1
    captured: list[torch.Tensor] = []
    handle = norm.register_forward_pre_hook(lambda _, args: captured.append(args[0].detach()))
    model = layout.model
    training = model.training
    model.eval()
    weight, bias = (part(norm, "weight"), part(norm, "bias"))
    if not isinstance(weight, torch.Tensor) or not isinstance(bias, torch.Tensor):
        raise LayoutError("the final LayerNorm has no weight and bias")
    try:
        out = model(**layout.model_inputs(ids, attention_mask=mask))
    finally:
        handle.remove()
        model.train(training)
    logits = part(out, "logits")
    if not isinstance(logits, torch.Tensor) or not captured:
        raise LayoutError("the model's forward returned no logits")
    count = sum(lengths)
    loss = logits.new_zeros(())
    for row, n in enumerate(lengths):
        z = logits[row, :n].float()
        if n > 1:
            loss = loss + F.cross_entropy(z[:-1], ids[row, 1:n].to(z.device), reduction="sum")
        loss = loss + torch.logsumexp(z[-1], dim=0)
    known = torch.autograd.grad(loss / count, [weight, bias])
    observed = [gradients[name].detach() for name in layout.final_norm_weights]
    known_part = torch.cat([k.detach().to(torch.float64).cpu() * count for k in known])
    observed_part = torch.cat([o.to(torch.float64).cpu() * count for o in observed])
    u = captured[0].to(torch.float64).cpu()
    eps = float(part(norm, "eps", 1e-5))
    normalised = []
    for row, n in enumerate(lengths):
        v = u[row, n - 1]
        normalised.append((v - v.mean()) / torch.sqrt(v.var(unbiased=False) + eps))
    return known_part, observed_part, normalised


def _feature(row: torch.Tensor, normalised: torch.Tensor) -> torch.Tensor:
    return torch.cat([row * normalised, row])


def _pursuit(target: torch.Tensor, normalised: list[torch.Tensor], head: torch.Tensor
             ) -> list[int]:
    """Coordinate descent on ``‖target − Σ_b f(y_b, b)‖²``, one token per sentence.

    Coordinate descent on ``‖target − Σ_b f(y_b, b)‖²`` over one token per sentence, with exchanges
    of two sentences' tokens when no single change helps (two sentences' tokens found but crossed is
    a fixed point of the single changes).
    """
    d = head.shape[1]
    squares = head * head
    row_norms = squares.sum(dim=1)
    chosen: list[int] = [-1] * len(normalised)

    def residual(choice: list[int]) -> float:
        fitted = sum((_feature(head[y], n) for y, n in zip(choice, normalised, strict=True)
                      if y >= 0), torch.zeros_like(target))
        return float((target - fitted).norm())

    for _ in range(SWEEPS):
        changed = False
        for b, n in enumerate(normalised):
            rest = target.clone()
            for other, y in enumerate(chosen):
                if other != b and y >= 0:
                    rest -= _feature(head[y], normalised[other])
            inner = head @ (rest[:d] * n) + head @ rest[d:]
            energy = squares @ (n * n) + row_norms
            best = int(torch.argmin(energy - 2 * inner))
            if best != chosen[b]:
                chosen[b], changed = best, True
        current = residual(chosen)
        for a in range(len(chosen)):
            for b in range(a + 1, len(chosen)):
                if chosen[a] == chosen[b]:
                    continue
                trial = list(chosen)
                trial[a], trial[b] = trial[b], trial[a]
                value = residual(trial)
                if value < current:
                    chosen, current, changed = trial, value, True
        if not changed:
            break
    return chosen
