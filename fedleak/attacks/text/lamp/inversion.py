"""LAMP (Balunović et al., NeurIPS 2022) and TAG (Deng et al. 2021) for text.

LAMP (Balunović, Dimitrov, Jovanović, Vechev, "LAMP: Extracting Text from Gradients with Language
Model Priors", NeurIPS 2022, arXiv 2202.08827) and TAG (Deng et al. 2021), the optimisation
baselines for text.

Both optimise continuous token embeddings ``x`` [B, T, d] so that the replayed update matches
the observed one, then project each ``x_t`` to its nearest token (:mod:`text_matching`):

    TAG:   min_x  Σ_l ‖∇'_l − ∇_l‖₂ + α‖∇'_l − ∇_l‖₁                     (Adam on x)
    LAMP:  min_x  L_rec(x) + α_reg (mean‖x_t‖ − mean‖E_v‖)²

LAMP alternates every ``discrete_every`` continuous steps with a discrete step:
``discrete_candidates`` reorderings of one sentence each (:mod:`lamp_moves`), scored by
``L_rec + α_lm L_lm`` with ``L_lm`` a language-model prior (here :class:`~fedleak.attacks.text
.bigram_prior.BigramPrior`, counted from public text; the paper uses GPT-2, which cannot be
downloaded here); the best replaces the current embeddings when it scores lower. Several random
initialisations are scored and the best is optimised (the paper's best-of-n start).

The replay is ``replay(inputs_embeds [B, T, d], attention_mask [B, T], labels) -> list of
gradients`` aligned with ``observed`` and differentiable in ``inputs_embeds`` (the harness's
replay of the user's update; a test writes its own with autograd). ``labels`` are given
(classification: recovered or known) or computed from the current projection (a causal LM's
labels are its own tokens). Positions of ``template`` that hold a token id (≥ 0) are known and
stay fixed ([CLS], [SEP]). The budget is work: ``iterations`` continuous steps; every replay
call counts as one objective evaluation (``evaluations`` in the result).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from fedleak.attacks.text.lamp import moves as lamp_moves
from fedleak.attacks.text.lamp.bigram_prior import BigramPrior
from fedleak.attacks.text.lamp.matching import (
    OBJECTIVES,
    gradient_distance,
    length_regulariser,
    nearest_tokens,
)

#: ``replay(inputs_embeds, attention_mask, labels) -> gradients``
TextReplay = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], list[torch.Tensor]]
#: fixed labels, or labels as a function of the current token ids [B, T]
Labels = torch.Tensor | Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class LampConfig:
    """LAMP's settings (the defaults are LAMP_cos's shape at a small budget).

    :func:`tag_config` gives TAG's. The learning rate follows a cosine schedule to zero over
    ``iterations``.
    """

    iterations: int = 500
    learning_rate: float = 0.01
    objective: str = "cosine"
    tag_alpha: float = 0.01
    regulariser: float = 1.0
    prior_weight: float = 0.2
    discrete_every: int = 50
    discrete_candidates: int = 32
    initialisations: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        """Refuse an unknown objective and counts or weights out of range."""
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}; got "
                             f"{self.objective!r}")
        for name in ("iterations", "initialisations"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1; got {getattr(self, name)}")
        for name in ("discrete_every", "discrete_candidates"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be non-negative; got {getattr(self, name)}")
        for name in ("learning_rate", "tag_alpha", "regulariser", "prior_weight"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0 or (name == "learning_rate" and value == 0):
                raise ValueError(f"{name} must be a finite non-negative number (learning_rate "
                                 f"positive); got {value}")


def tag_config(**changes: float | int | str) -> LampConfig:
    """TAG: the L2 + αL1 distance, continuous steps only, no prior, no regulariser."""
    base = LampConfig(objective="tag", regulariser=0.0, prior_weight=0.0, discrete_every=0)
    return replace(base, **changes)  # type: ignore[arg-type]


@dataclass
class TextInversionResult:
    """Result of one inversion: tokens, embeddings, distances and work.

    The projected tokens [B, T] (masked positions hold 0), the embeddings they came from, the
    reconstruction distance at the end and at the chosen random start, and the work: continuous
    ``iterations`` and replay ``evaluations``.
    """

    tokens: torch.Tensor
    embeddings: torch.Tensor
    objective: float
    start_objective: float
    iterations: int
    evaluations: int

    def sentences(self, mask: torch.Tensor) -> list[list[int]]:
        """Return the token ids of each sentence, masked positions left out."""
        return [row[m.bool()].tolist() for row, m in zip(self.tokens, mask, strict=True)]


def invert_text(replay: TextReplay, observed: Sequence[torch.Tensor],
                vocabulary: torch.Tensor, attention_mask: torch.Tensor, labels: Labels,
                config: LampConfig | None = None, prior: BigramPrior | None = None,
                template: torch.Tensor | None = None,
                allowed: torch.Tensor | None = None) -> TextInversionResult:
    """Run LAMP (or TAG, by ``config``) against ``observed`` (module docstring).

    ``vocabulary`` is the input embedding matrix [V, d]; ``allowed`` restricts the projection to a
    recovered token set.
    """
    config = config or LampConfig()
    _check(observed, vocabulary, attention_mask, template, prior, config)
    vocabulary = vocabulary.detach()
    mask = attention_mask.to(torch.long)
    count, length = mask.shape
    fixed = (template >= 0) if template is not None else torch.zeros_like(mask, dtype=torch.bool)
    known = vocabulary[template.clamp_min(0)] if template is not None else None
    free = [[t for t in range(length) if mask[b, t] and not fixed[b, t]] for b in range(count)]
    generator = torch.Generator().manual_seed(config.seed)
    evaluations = 0

    def full(x: torch.Tensor) -> torch.Tensor:
        return x if known is None else torch.where(fixed[..., None], known, x)

    def tokens_of(x: torch.Tensor) -> torch.Tensor:
        ids = nearest_tokens(full(x), vocabulary, allowed)
        if template is not None:
            ids = torch.where(fixed, template, ids)
        return ids * mask

    def reconstruction(x: torch.Tensor) -> torch.Tensor:
        nonlocal evaluations
        evaluations += 1
        y = labels(tokens_of(x)) if callable(labels) else labels
        grads = replay(full(x), mask, y)
        return gradient_distance(grads, observed, config.objective, config.tag_alpha)

    def discrete_score(x: torch.Tensor) -> float:
        value = float(reconstruction(x).detach())
        if prior is not None and config.prior_weight > 0:
            value += config.prior_weight * float(prior.nll(tokens_of(x), mask).mean())
        return value

    sigma = float(vocabulary.std())
    starts = [torch.randn(count, length, vocabulary.shape[1], generator=generator) * sigma
              for _ in range(config.initialisations)]
    scores = [float(reconstruction(s).detach()) for s in starts]
    chosen = min(range(len(starts)), key=scores.__getitem__)
    x = starts[chosen].to(vocabulary.dtype)
    x = x.to(vocabulary.device).requires_grad_(True)
    optimiser = torch.optim.Adam([x], lr=config.learning_rate)
    for step in range(config.iterations):
        for group in optimiser.param_groups:
            group["lr"] = config.learning_rate * 0.5 * (1 + math.cos(math.pi * step /
                                                                     config.iterations))
        loss = reconstruction(x)
        if config.regulariser > 0:
            loss = loss + config.regulariser * length_regulariser(full(x), vocabulary, mask)
        (gradient,) = torch.autograd.grad(loss, [x])
        x.grad = gradient
        optimiser.step()
        if config.discrete_every and (step + 1) % config.discrete_every == 0 \
                and config.discrete_candidates:
            current = x.detach()
            best, best_score = current, discrete_score(current)
            for candidate in lamp_moves.candidates(current, free, config.discrete_candidates,
                                                   generator):
                value = discrete_score(candidate)
                if value < best_score:
                    best, best_score = candidate, value
            with torch.no_grad():
                x.copy_(best)
    final = float(reconstruction(x).detach())
    return TextInversionResult(tokens_of(x.detach()), full(x.detach()), final, scores[chosen],
                               config.iterations, evaluations)


def _check(observed: Sequence[torch.Tensor], vocabulary: torch.Tensor,
           mask: torch.Tensor, template: torch.Tensor | None, prior: BigramPrior | None,
           config: LampConfig) -> None:
    if not observed:
        raise ValueError("no observed gradient: pass the update's tensors aligned with the "
                         "replay's output")
    if vocabulary.dim() != 2:
        raise ValueError(f"vocabulary must be the embedding matrix [V, d]; got shape "
                         f"{tuple(vocabulary.shape)}")
    if mask.dim() != 2 or not bool(mask.sum(dim=1).gt(0).all()):
        raise ValueError("attention_mask must be [B, T] with at least one token per sentence")
    if template is not None and template.shape != mask.shape:
        raise ValueError(f"template must have the mask's shape {tuple(mask.shape)}; got "
                         f"{tuple(template.shape)}")
    if prior is not None and prior.vocab_size != vocabulary.shape[0]:
        raise ValueError(f"the prior counts {prior.vocab_size} token ids, the vocabulary "
                         f"has {vocabulary.shape[0]}")
    if config.prior_weight > 0 and config.discrete_every and prior is None:
        raise ValueError("LAMP's discrete steps score candidates with a language-model prior: "
                         "pass prior= (a BigramPrior counted from public text), or set "
                         "prior_weight=0")
