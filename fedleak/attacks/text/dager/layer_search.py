"""DAGER (Petrov et al., NeurIPS 2024): exact text from one transformer gradient.

DAGER (Petrov, Dimitrov, Baader, Müller, Vechev, "DAGER: Exact Gradient Inversion for Large Language
Models", NeurIPS 2024, arXiv 2405.15586): whole batches of text, exactly, from one FedSGD gradient
of a transformer.

**The rank condition.** A linear layer ``Z = X W`` over the b = B·T token vectors of a batch
has ``∇_W L = Xᵀ ∂L/∂Z``: rank ≤ b (the paper's low-rank lemma), and when ``b < d`` (the
layer's input width) and ``∂L/∂Z`` has rank b, ``colspan ∇_W L = span{x_t}`` (its span
theorem). So, with ``U_r`` the basis of the gradient's r leading singular vectors,
``d(x) = ‖x̂ − U_r U_rᵀ x̂‖`` is 0 for the layer's inputs and about ``√(1 − r/d)`` for anything
else (:mod:`span_check`). DAGER is exact while the batch's distinct token vectors number fewer
than d, i.e. ``B·T < d``; at ``B·T ≥ d`` the span is all of ℝᵈ and every token passes every
check: the attack stops, and says so.

**Two spans.** (1) The first attention's Q/K/V input at position i is a function of the token
v there and i alone, ``x = LN(E_v + P_i)``, so the check filters the whole vocabulary position
by position (the token filter, threshold ``τ₁``). (2) A second layer's input depends
on the sentence around the token (a decoder: its prefix; an encoder: all of it), so whole
(partial) sentences are checked (threshold ``τ₂``). Decoders are searched greedily,
position by position (:mod:`dager_decoder`); encoders by a search over the filtered tokens of
every position (:mod:`dager_encoder`). A causal language model's last token of each sentence
has no loss after it, so its δ is zero and it is in no span: it is read from the final
LayerNorm's gradient instead (:mod:`dager_last_token`).

**Sharp edges.** The update must be one gradient of the model as it was sent (FedSGD), with
dropout off; a FedAvg delta of several steps is not in any span exactly. At random
initialisation the first LayerNorm has γ = 1, β = 0: ``LN(E_v + P_i)`` is then a rescaled
linear function of ``E_v + P_i``, so ``E_a + P_i`` is in the span whenever ``a`` occurs at any
position linked to i through tokens shared across positions (``(E_a+P_j) − (E_c+P_j) +
(E_c+P_i)``): the token filter then returns the batch's token set at every position, and the
second span does all the work (slower, still exact). A trained LayerNorm (β ≠ 0) breaks that
closure and the filter returns about B tokens per position, as in the paper.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from fedleak.attacks.text.dager.configuration import DagerConfig, DagerResult, Work
from fedleak.attacks.text.dager.decoder import search_decoder
from fedleak.attacks.text.dager.encoder import search_encoder
from fedleak.attacks.text.dager.peeling import Repin, Repinned, SentenceGradient, peel
from fedleak.attacks.text.dager.position_split import (
    end_lengths,
    position_candidates,
    split_gradient,
)
from fedleak.attacks.text.dager.span_check import InputSpan, input_span
from fedleak.attacks.text.transformer_layout import TransformerLayout, layout_of

__all__ = ["DagerConfig", "DagerResult", "dager", "token_candidates"]

#: vocabulary rows run through the embedding at once
VOCAB_CHUNK = 8192
#: an encoder's filter passing this share of the batch's tokens at the median position is
#: saturated (a pretrained BERT's LayerNorm: every batch token at every position)
SATURATED = 0.5


def token_candidates(layout: TransformerLayout, span: InputSpan, position: int,
                     threshold: float, cap: int) -> tuple[torch.Tensor, bool]:
    """Return the token filter at ``position``.

    Every vocabulary id v whose first-layer input ``x(v, position)`` has span distance below
    ``threshold``, nearest first, at most ``cap`` of them; and whether the cap cut some.
    """
    distances = []
    for start in range(0, layout.vocab_size, VOCAB_CHUNK):
        ids = torch.arange(start, min(start + VOCAB_CHUNK, layout.vocab_size))[:, None]
        x = layout.layer_inputs(0, ids, position_ids=torch.full_like(ids, position))
        distances.append(span.distance(x[:, 0]).cpu())
    d = torch.cat(distances)
    keep = torch.nonzero(d < threshold).flatten()
    keep = keep[torch.argsort(d[keep])]
    return keep[:cap], keep.numel() > cap


def start_layout(candidates: list[torch.Tensor], start: int) -> list[torch.Tensor]:
    """Apply the published layout to the filtered tokens.

    The start token stays at position 0 (when it passed there) and nowhere else.
    """
    first = candidates[0]
    head = first[first == start] if bool((first == start).any()) else first
    return [head] + [c[c != start] for c in candidates[1:]]


def full_span_warning(spans: tuple[InputSpan, ...], batch_size: int,
                      max_length: int | None) -> str:
    """Say why the span is full.

    Either the batch's B·T token vectors reach the width d, or (B·T < d) something else filled
    it, as noise added to the update (DP-SGD, a noise defense) does.
    """
    ranks = (f"ranks {spans[0].rank}, {spans[1].rank} of {spans[0].input_dim}, "
             f"{spans[1].input_dim}")
    tokens = batch_size * max_length if max_length else None
    if tokens is not None and tokens < min(spans[0].input_dim, spans[1].input_dim):
        return (f"the gradient's span is full ({ranks}) although the batch holds at most "
                f"B·T = {batch_size}×{max_length} = {tokens} token vectors, fewer than the "
                "hidden size: something other than the batch filled it — noise added to the "
                "update (DP-SGD, a noise defense) makes every gradient full rank — so every "
                "token passes the span check; nothing recovered")
    return (f"the gradient's span is full ({ranks}): the batch holds at least as many token "
            "vectors as the hidden size (B·T ≥ d), so every token passes the span check and "
            "DAGER cannot tell the sentences; nothing recovered")


def saturated(candidates: list[torch.Tensor]) -> bool:
    """Whether the token filter passes most of the batch's tokens at most positions."""
    if len(candidates) < 3:
        return False
    union = torch.unique(torch.cat(candidates)).numel()
    sizes = sorted(c.numel() for c in candidates[1:])
    return bool(union >= 8 and sizes[len(sizes) // 2] >= SATURATED * union)


def pinned_candidates(layout: TransformerLayout, gradients: Mapping[str, torch.Tensor],
                      candidates: list[torch.Tensor], batch_size: int, config: DagerConfig,
                      result: DagerResult
                      ) -> tuple[list[torch.Tensor], tuple[list[int], list[int] | None] | None]:
    """Narrow a saturated filter's sets by splitting the first-layer gradient.

    :mod:`~fedleak.attacks.text.dager.position_split`: the tokens the gradient pins to a
    position come first there and nowhere else; the unchanged sets where the split does not
    apply (no BERT embedding), does not hold (residual above 10⁻⁴) or is not needed (a
    LayerNorm at its initialisation, β = 0: the random encoders the search was tuned on,
    where it has not been measured). With them: the number
    pinned at each position and the sentence lengths the end token's weights suggest.
    """
    tokens = torch.unique(torch.cat(candidates))
    split = split_gradient(layout, gradients, tokens, len(candidates))
    if split is None or split.residual > 1e-4 or not split.trained:
        return candidates, None
    narrowed, pinned = position_candidates(split, everywhere=config.end_token)
    if config.start_token is not None and narrowed:
        narrowed = start_layout(narrowed, config.start_token)
        pinned[0] = min(pinned[0], narrowed[0].numel())
    if not narrowed or any(c.numel() == 0 for c in narrowed):
        return candidates, None
    result.pinned = sum(pinned)
    lengths = None if config.end_token is None else \
        end_lengths(split, config.end_token, batch_size)
    if lengths is not None:
        lengths = [min(n, len(narrowed)) for n in lengths]
    return narrowed, (pinned, lengths)


def repinner(layout: TransformerLayout, gradients: Mapping[str, torch.Tensor],
             candidates: list[torch.Tensor], batch_size: int, config: DagerConfig,
             result: DagerResult, sentence_gradient: SentenceGradient, classes: int) -> Repin:
    """Return the encoder's :data:`~fedleak.attacks.text.dager.peeling.Repin`: peel, split again.

    Each call peels the sentences found since the last (:func:`~fedleak.attacks.text.dager.
    peeling.peel`) and splits the residual's first layer again over the filter's tokens that
    still have a share in it (‖U_t‖ above 10⁻⁵ of the largest: a token of the peeled sentences
    alone has none); None, from then on, once a sentence could not be peeled.
    """
    residual: Mapping[str, torch.Tensor] = gradients  # the batch's gradient less what is peeled
    peeled, broken = 0, False
    tokens = torch.unique(torch.cat(candidates))
    keep = [t for t in (config.end_token, config.start_token) if t is not None]

    def repin(found: list[list[int]]) -> Repinned | None:
        nonlocal residual, peeled, broken
        if broken or len(found) <= peeled or len(found) >= batch_size:
            return None
        residual, labels = peel(residual, found[peeled:], sentence_gradient, classes,
                                batch_size, lambda g: layout.layers[1].gradients(g))
        peeled, broken = len(found), None in labels
        split = split_gradient(layout, residual, tokens, len(candidates))
        if broken or split is None:
            broken = True
            return None
        norms = split.token_vectors.norm(dim=0)
        alive = tokens[(norms > 1e-5 * norms.max()) | torch.isin(tokens, torch.tensor(keep))]
        narrowed = [c[torch.isin(c, alive)] for c in candidates]
        pinned_before = result.pinned
        sets, pinned = pinned_candidates(layout, residual, narrowed, batch_size - len(found),
                                         config, result)
        result.pinned = pinned_before
        if pinned is None:
            return None
        # past the longest remaining sentence V_p is 0 and the split ends its sets; the search's
        # shapes keep every position (a slot may still be longer): the filter's there, unpinned
        sets += [n if n.numel() else c for n, c in zip(narrowed[len(sets):],
                                                       candidates[len(sets):], strict=True)]
        pinned[0].extend([0] * (len(sets) - len(pinned[0])))
        return Repinned(input_span(layout.layers[1].gradients(residual)), sets, *pinned)

    return repin


def dager(model: nn.Module | TransformerLayout, gradients: Mapping[str, torch.Tensor],
          batch_size: int, config: DagerConfig | None = None,
          progress: Callable[[int, int, float], None] | None = None,
          sentence_gradient: SentenceGradient | None = None, classes: int = 0) -> DagerResult:
    """Recover a batch of ``batch_size`` sentences from ``gradients`` of ``model``.

    Recover a batch of ``batch_size`` sentences from ``gradients`` (the FedSGD gradient by parameter
    name, oriented like ∇L) of ``model`` (a Hugging Face GPT-2 or BERT, or a
    :class:`TransformerLayout`): the decoder's greedy search or the encoder's search, by the model's
    kind; ``progress(evaluations, budget, sentences found)`` now and then. ValueError for input it
    cannot use, naming what to change. ``sentence_gradient`` (one sentence's own gradient with a
    label) and ``classes``: an encoder's certified sentences are peeled off the gradient
    (:mod:`~fedleak.attacks.text.dager.peeling`, through :func:`repinner`).
    """
    config = config or DagerConfig()
    layout = model if isinstance(model, TransformerLayout) else layout_of(model)
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1; got {batch_size}")
    spans = tuple(input_span(layout.layers[k].gradients(gradients), rank=config.ranks[k])
                  for k in (0, 1))
    result = DagerResult([], [], [], [], (spans[0].rank, spans[1].rank), layout.hidden_size)
    limit = min(config.max_length or layout.max_positions, layout.max_positions)
    if spans[0].full or spans[1].full:
        result.warnings.append(full_span_warning(spans, batch_size, config.max_length))
        return result
    candidates: list[torch.Tensor] = []
    for position in range(limit):
        if not layout.positional and candidates:  # RoPE: the same input at every position
            candidates.append(candidates[0])
            continue
        found, cut = token_candidates(layout, spans[0], position, config.l1_threshold,
                                      config.max_candidates)
        if found.numel() == 0:
            break
        result.truncated |= cut
        candidates.append(found)
    if config.start_token is not None and candidates:
        candidates = start_layout(candidates, config.start_token)
    pinned: tuple[list[int], list[int] | None] | None = None
    repin: Repin | None = None
    if layout.kind == "encoder" and saturated(candidates):
        filtered = candidates
        candidates, pinned = pinned_candidates(layout, gradients, candidates, batch_size,
                                               config, result)
        if pinned is not None and sentence_gradient is not None and classes > 0:
            repin = repinner(layout, gradients, filtered, batch_size, config, result,
                             sentence_gradient, classes)
    result.candidates = [c.numel() for c in candidates]
    if not candidates:
        result.warnings.append("no token passed the first span check at position 0: the "
                               "update is not this model's gradient of a text batch, or τ₁ "
                               "is too small")
        return result
    if result.truncated:
        result.warnings.append(f"more than max_candidates={config.max_candidates} tokens "
                               "passed the token filter at some position (the span is nearly "
                               "full): the nearest were kept")
    work = Work(config.max_evaluations, progress)
    if layout.kind == "decoder":
        search_decoder(layout, spans[1], candidates, batch_size, config, work, result, gradients)
    else:
        search_encoder(layout, spans[1], candidates, batch_size, config, work, result, gradients,
                       pinned=pinned, repin=repin)
    result.evaluations = work.count
    if work.exhausted:
        result.truncated = True
        result.warnings.append(f"the search used its budget of {config.max_evaluations} "
                               "sentence evaluations")
    return result
