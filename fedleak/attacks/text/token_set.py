"""Token-set recovery: which words the user typed, read off the embedding gradient.

Melis et al., "Exploiting Unintended Feature Leakage in Collaborative Learning" (S&P 2019,
arXiv 1805.04049), Sec. 5.1: the input embedding is a lookup, e = E[x], so its gradient is

    ∇_E L = Σ_t  onehot(x_t) δ_tᵀ,        δ_t = ∂L/∂e_t,

non-zero exactly in the rows of the tokens the batch holds wherever they influence the loss
(padding rows stay zero: padded positions carry no loss and no real token attends to them).
Exact on an undefended FedSGD gradient, and on a FedAvg delta without weight decay (a row no
step looked up never moves). Two refinements make it the whole set:

- **A decoder's last token.** In a causal language model the last real token of a sequence
  cut at T tokens predicts nothing (its label is ignored) and nothing attends to it, so its
  input row is zero; it is the label of the position before. The language-model head's
  gradient, ∇_W L = Σ_t (softmax_t − onehot(y_t)) h_tᵀ, has rows of norm ≈ ‖h‖ for the labels
  y_t against ≈ (n·T/V)‖h‖ for every other token: the rows that stand out by the largest gap
  of the sorted row norms are the labels (exact in practice: the gap is ~20× at random init on
  the bundled models; an assumption, not a theorem, once the model is trained).
- **A frozen or tied embedding** (``span``; DAGER's token filter, Petrov et al. 2024, Sec. 4):
  the first linear map after the embeddings, y = W x, has ∇_W L = Σ_t g_t x_tᵀ, whose row
  space holds the inputs x_t = LN(E[v] + P[p] (+ type)); a token v belongs to the batch iff
  its input at some position lies in that span (tested at every position; exact while the
  batch's n·T inputs are fewer than the hidden size). With a tied head the shared matrix's
  rows also stand out for the labels (largest gap, as above).

No multiplicities: each row is a sum over occurrences, and the first-layer span is closed
under recombining tokens and positions (E[v] + P[p] = (E[v] + P[q]) − (E[w] + P[q]) +
(E[w] + P[p])), so it places tokens at positions they never held. The maths of these
gradients gives the set, not the counts; none are claimed.

Defended updates: rows whose norm is not exactly zero on most of the vocabulary (noise) are
kept when they stand above the largest ratio gap of the sorted row norms among the top
``2·n·T`` rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from fedleak.attacks.attack_registry import register_attack
from fedleak.attacks.base import Progress, UpdateSetting
from fedleak.attacks.observation import Reconstruction
from fedleak.attacks.text.text_attack import TextAttack
from fedleak.attacks.text.transformer_layout import part
from fedleak.attacks.text_observation import (
    DECODER,
    TextObservation,
    TextReconstruction,
)

METHODS = ("auto", "rows", "span")


@dataclass
class TokenSetConfig:
    """Options of the token-set attack: the method and its span and rank tolerances."""

    method: str = field(default="auto", metadata={
        "help": "rows: non-zero rows of the input embedding gradient; span: inputs in the "
                "first layer's gradient span (frozen or tied embeddings); auto: rows where the "
                "embedding is trained and untied, else span"})
    labels: bool = field(default=True, metadata={
        "help": "decoders: add the labels read off the language-model head's rows (a "
                "sequence's last token is visible only there)"})
    span_tolerance: float = field(default=0.02, metadata={
        "help": "span: the largest relative distance of a candidate input from the span"})
    rank_tolerance: float = field(default=1e-6, metadata={
        "help": "span: singular values below this times the largest are float32 noise; the "
                "rank is the largest drop above it"})

    def __post_init__(self) -> None:
        """Refuse an unknown method and non-positive tolerances."""
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}")
        if self.span_tolerance <= 0 or self.rank_tolerance <= 0:
            raise ValueError("span-tolerance and rank-tolerance must be positive")


@register_attack("token-set")
class TokenSet(TextAttack):
    """The set of token ids of the user's batch (no counts: module docstring)."""

    Config = TokenSetConfig
    architectures: ClassVar[tuple[str, ...]] = ("decoder", "encoder")

    @classmethod
    def unsuited(cls, setting: UpdateSetting) -> str | None:
        """Return None: the token set is read from any update setting."""
        return None

    def budget(self) -> int | None:
        """Return None: the attack runs no search with a budget."""
        return None

    def recover(self, target: TextObservation, *, device: torch.device, seed: int,
                progress: Progress | None) -> Reconstruction:
        """Recover the set of token ids the batch holds (module docstring)."""
        c: TokenSetConfig = self.config
        text_ids = target.text_ids().to(device)
        method = c.method
        usable_rows = bool(target.embedding_name) and not target.tied_head
        if method == "auto":
            method = "rows" if usable_rows else "span"
        if method == "rows" and not usable_rows:
            raise ValueError("method rows needs a trained, untied token embedding (this update "
                             f"has {'a tied head' if target.embedding_name else 'none'}); use "
                             "method span")
        most = 2 * target.num_sequences * target.seq_len
        if method == "rows":
            rows = target.gradient(target.embedding_name).detach().to(device)
            found = set(text_ids[standing_out(rows.norm(dim=1)[text_ids], most)].tolist())
        else:
            pairs = first_layer_pairs(target, text_ids, c)
            if pairs is None:
                raise ValueError("method span needs the gradient of the first attention "
                                 "projection (GPT-2, llama or BERT families, not LoRA adapters)")
            found = {v for v, _ in pairs}
        head = language_model_head(target)
        if c.labels and head:
            rows = target.gradient(head).detach().to(device)
            found |= set(text_ids[standing_out(rows.norm(dim=1)[text_ids], most)].tolist())
        token_set = sorted(int(t) for t in found)
        if progress is not None:
            progress(1, 1, float(len(token_set)))
        return TextReconstruction(token_set=token_set, iterations=1,
                                  objective=float(len(token_set)),
                                  extras={"method": method, "labels_from_head": bool(
                                      c.labels and head)})


def language_model_head(target: TextObservation) -> str:
    """Return the trained language-model head's weight name ('' for an encoder or a frozen head)."""
    if target.architecture != DECODER:
        return ""
    if target.tied_head:
        return target.embedding_name
    model: Any = target.model
    head = part(model, "get_output_embeddings", lambda: None)()
    if head is None:
        return ""
    names = [n for n, p in model.named_parameters() if p is head.weight]
    return names[0] if names and names[0] in target.parameter_names else ""


def standing_out(norms: torch.Tensor, most: int) -> torch.Tensor:
    """Which ``norms`` (one per candidate row) stand out.

    Every non-zero one when most are exactly zero (an undefended gradient), else those above the
    largest ratio gap of the sorted norms among the top ``most``.
    """
    if int((norms == 0).sum()) * 2 >= len(norms):
        return norms > 0
    ordered, order = norms.sort(descending=True)
    top = min(most, len(ordered) - 1)
    ratios = ordered[:top] / ordered[1:top + 1].clamp_min(1e-30)
    cut = int(ratios.argmax()) + 1
    keep = torch.zeros_like(norms, dtype=torch.bool)
    keep[order[:cut]] = True
    return keep


def first_layer_pairs(target: TextObservation, text_ids: torch.Tensor,
                      config: TokenSetConfig) -> list[tuple[int, int]] | None:
    """Return the (token, position) pairs in the first layer's gradient span, or None.

    The (token, position) pairs whose first-layer input lies in the span of the first layer's weight
    gradient (module docstring); None when the model offers no such layer.
    """
    found = first_layer(target)
    if found is None:
        return None
    name, transposed, inputs = found
    gradient = target.gradient(name).detach().to(text_ids.device).double()
    basis = span_basis(gradient.T if transposed else gradient, config.rank_tolerance)
    pairs: list[tuple[int, int]] = []
    # rotary positions (llama) act after the projection: its inputs are the same at every one
    positional = part(part(target.model, "model"), "layers") is None
    with torch.no_grad():
        for position in range(target.seq_len if positional else 1):
            x = inputs(text_ids, position).double()
            residual = (x - (x @ basis) @ basis.T).norm(dim=1) / x.norm(dim=1).clamp_min(1e-30)
            hits = text_ids[residual < config.span_tolerance]
            pairs += [(int(v), position) for v in hits]
    return pairs


def span_basis(gradient: torch.Tensor, tolerance: float) -> torch.Tensor:
    """Return an orthonormal basis [d, r] of the column space of ``gradient``.

    An orthonormal basis [d, r] of the column space of ``gradient`` [d, k] (the layer inputs' span).
    The rank r is where the singular values drop the most (the largest ratio s_r / s_{r+1}; float32
    rounding leaves a floor, not zeros), among those above ``tolerance`` times the largest.
    """
    u, s, _ = torch.linalg.svd(gradient, full_matrices=False)
    floor = float(s[0]) * tolerance
    usable = int((s > floor).sum())
    rank = max(usable, 1)
    if 1 < usable < len(s):
        ratios = s[:usable] / s[1:usable + 1].clamp_min(1e-300)
        rank = int(ratios.argmax()) + 1
    basis: torch.Tensor = u[:, :rank]
    return basis


#: the inputs the first linear map sees for candidate token ids at one position
FirstInputs = Callable[[torch.Tensor, int], torch.Tensor]


def first_layer(target: TextObservation) -> tuple[str, bool, FirstInputs] | None:
    """Return the first linear map's weight name, orientation and input function.

    The first linear map's weight name, whether its gradient holds the inputs on its columns
    (``nn.Linear``: [out, in]) rather than its rows (GPT-2's ``Conv1D``: [in, out]), and its inputs
    for candidate tokens at a position; GPT-2, llama and BERT families, else None.
    """
    model: Any = target.model
    gpt2 = part(part(model, "transformer"), "h")
    if target.architecture == DECODER and gpt2 is not None:
        name = "transformer.h.0.attn.c_attn.weight"
        if name not in target.parameter_names:
            return None
        block, wte, wpe = gpt2[0], model.transformer.wte.weight, model.transformer.wpe.weight

        def gpt2_inputs(ids: torch.Tensor, position: int) -> torch.Tensor:
            out: torch.Tensor = block.ln_1(wte[ids] + wpe[position])
            return out

        return name, False, gpt2_inputs
    llama = part(part(model, "model"), "layers")
    if target.architecture == DECODER and llama is not None:
        name = "model.layers.0.self_attn.q_proj.weight"
        if name not in target.parameter_names:
            return None
        layer, embed = llama[0], model.model.embed_tokens.weight

        def llama_inputs(ids: torch.Tensor, position: int) -> torch.Tensor:
            out: torch.Tensor = layer.input_layernorm(embed[ids])  # rotary acts after q_proj
            return out

        return name, True, llama_inputs
    bert = part(model, "bert")
    name = "bert.encoder.layer.0.attention.self.value.weight"
    if bert is None or name not in target.parameter_names:
        return None
    emb: Any = bert.embeddings

    def bert_inputs(ids: torch.Tensor, position: int) -> torch.Tensor:
        e = emb.word_embeddings.weight[ids] + emb.position_embeddings.weight[position] \
            + emb.token_type_embeddings.weight[0]
        out: torch.Tensor = emb.LayerNorm(e)
        return out

    return name, True, bert_inputs
