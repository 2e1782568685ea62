"""DAGER's search for encoders (Petrov et al. 2024, Sec. 4.3), by local search.

In an encoder every position sees the whole sentence, so the second span's input
``h_j(s)`` of a candidate sentence ``s`` is known only once all of ``s`` is fixed: no greedy
order exists. The paper enumerates (or samples) the product of the filtered token sets of the
positions and keeps the B sentences with the smallest mean second-span distance, which is
exact for small B·T and hopeless for B = 8 sentences of 32 tokens (8³⁰ combinations; at random
initialisation every position's set is the whole batch's token set, see :mod:`dager`).

Here the same objective,

    f(s) = (1/ℓ) Σ_j d₂(h_j(s)),      s_j ∈ S_j,   ℓ the sentence length,

is minimised by local search over single-token replacements (``s_j ← c``, c ∈ S_j) and
transpositions (``s_j ↔ s_k``): a first-order screen ranks every move by
``⟨∇_{e_j} f, E_c − E_{s_j}⟩`` (one backward pass through the embeddings, as HotFlip / GCG do),
the ``screen`` best are evaluated exactly, the best one is taken while it lowers f; when none
does, the next ``3·screen`` are, then (for a sentence within 10·τ₂ of its certificate but not
certified) every move, and then the start ends. ``f`` is 0 exactly at the batch's
sentences; a sentence mixing several of them has the context (the attention over the sentence)
of none, so its distance falls as it becomes purer, and the search slides to the sentence most
of its tokens came from. A sentence is certified when the median of its positions' distances
is below τ₂ (the median, not the largest: in a classifier a few tokens, [SEP] often, get a δ so
small that their direction drowns in the gradient's rounding noise, and their distance stays
near 10⁻²; a wrong token moves the context of every position). Each start draws its tokens
from those no certified sentence holds (so it lands on a new sentence); a start that ends
uncertified is a failed start.
Sentences end with ``end_token`` ([SEP]) where it passes the token filter; the longest lengths
are searched first, and the search stops at ``batch_size`` certified sentences, after
``restarts`` failed starts in a row at every length, or at ``max_evaluations`` sentence
evaluations.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fedleak.attacks.text.dager_settings import DagerConfig, DagerResult, Work
from fedleak.attacks.text.span_check import InputSpan
from fedleak.attacks.text.transformer_layout import TransformerLayout, captured_input

#: sentences evaluated at once
CHUNK = 256
#: when the ``screen`` best moves do not help, the next ``(WIDEN − 1)·screen`` are tried
WIDEN = 4
#: and then every move, when the sentence's certificate is within POLISH·τ₂
POLISH = 10.0


class _Objective:
    """f(s) for sentences of one length, with its work counted."""

    def __init__(self, layout: TransformerLayout, span: InputSpan, work: Work) -> None:
        self.layout, self.span, self.work = layout, span, work
        self.embeddings = layout.token_embeddings.detach()

    def distances(self, sentences: torch.Tensor) -> torch.Tensor:
        """d₂ per position, [N, ℓ]."""
        out = []
        for start in range(0, sentences.shape[0], CHUNK):
            block = sentences[start:start + CHUNK]
            h = captured_input(self.layout.model, self.layout.layers[1].module,
                               self.layout.model_inputs(block))
            out.append(self.span.distance(h).cpu())
        self.work.add(sentences.shape[0])
        return torch.cat(out)

    def gradient(self, sentence: torch.Tensor) -> torch.Tensor:
        """∇_e f at the sentence's token embeddings, [ℓ, d]."""
        e = self.embeddings[sentence.to(self.embeddings.device)][None].clone()
        e.requires_grad_(True)
        h = captured_input(self.layout.model, self.layout.layers[1].module,
                           self.layout.model_inputs(e), graph=True)
        f = self.span.distance(h).mean()
        (grad,) = torch.autograd.grad(f, e)
        self.work.add(1)
        return grad[0].detach().to(torch.float64).cpu()


def search_encoder(layout: TransformerLayout, span: InputSpan, candidates: list[torch.Tensor],
                   batch_size: int, config: DagerConfig, work: Work, result: DagerResult,
                   gradients: Mapping[str, torch.Tensor]) -> None:
    """Fill ``result`` with the sentences the search recovers (module docstring)."""
    del gradients
    objective = _Objective(layout, span, work)
    generator = torch.Generator().manual_seed(config.seed)
    found: list[tuple[list[int], float]] = []
    for end in _ends(candidates, config.end_token):
        sets = [c for c in candidates[:end + 1]]
        if config.end_token is not None:
            sets = [c[c != config.end_token] for c in sets[:-1]] + \
                [torch.tensor([config.end_token])]
        if any(s.numel() == 0 for s in sets):
            continue
        failures = 0
        while len(found) < batch_size and failures < config.restarts and not work.exhausted:
            start = _start(sets, [s for s, _ in found if len(s) == end + 1], generator)
            sentence, score = _descend(objective, sets, start, config.screen,
                                       config.l2_threshold)
            tokens = sentence.tolist()
            if score < config.l2_threshold and all(tokens != s for s, _ in found):
                found.append((tokens, score))
                failures = 0
            else:
                failures += 1
        if len(found) >= batch_size or work.exhausted:
            break
    result.sentences = [s for s, _ in found]
    result.scores = [score for _, score in found]
    result.certified = [True] * len(found)
    if len(found) < batch_size:
        result.warnings.append(f"{len(found)} of {batch_size} sentences recovered: the "
                               "search's starts ended above τ₂ (raise restarts or "
                               "max_evaluations)")


def _ends(candidates: list[torch.Tensor], end_token: int | None) -> list[int]:
    """The last positions sentences may end at, longest first."""
    if end_token is None:
        return [len(candidates) - 1]
    ends = [i for i, c in enumerate(candidates) if bool((c == end_token).any())]
    return sorted(ends, reverse=True)


def _start(sets: list[torch.Tensor], found: list[list[int]], generator: torch.Generator
           ) -> torch.Tensor:
    """A random sentence over the sets, drawn from the tokens no found sentence holds anywhere
    (else from those no found sentence holds at that position; else from all): the search
    slides to the sentence most of the start's tokens came from, so a start without the found
    sentences' tokens lands on a new one."""
    anywhere = {t for s in found for t in s}
    tokens = []
    for j, options in enumerate(sets):
        pool = [int(t) for t in options if int(t) not in anywhere] or \
            [int(t) for t in options if int(t) not in {s[j] for s in found}] or options.tolist()
        tokens.append(pool[int(torch.randint(len(pool), (1,), generator=generator))])
    return torch.tensor(tokens)


def _moves(sentence: torch.Tensor, sets: list[torch.Tensor], grad: torch.Tensor,
           embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every replacement and transposition as (new sentences [M, ℓ], first-order gain [M])."""
    e = embeddings.to(torch.float64).cpu()
    current = e[sentence]
    variants, gains = [], []
    for j, options in enumerate(sets):
        options = options[options != sentence[j]]
        if options.numel() == 0:
            continue
        gains.append((e[options] - current[j]) @ grad[j])
        block = sentence.repeat(options.numel(), 1)
        block[:, j] = options
        variants.append(block)
    length = sentence.numel()
    allowed = [set(s.tolist()) for s in sets]
    pairs = [(j, k) for j in range(length) for k in range(j + 1, length)
             if sentence[j] != sentence[k] and int(sentence[k]) in allowed[j]
             and int(sentence[j]) in allowed[k]]
    if pairs:
        js, ks = torch.tensor(pairs).T
        delta = current[ks] - current[js]
        gains.append((delta * grad[js]).sum(1) - (delta * grad[ks]).sum(1))
        block = sentence.repeat(len(pairs), 1)
        rows = torch.arange(len(pairs))
        block[rows, js], block[rows, ks] = sentence[ks], sentence[js]
        variants.append(block)
    if not variants:
        return sentence[None, :0].long(), torch.zeros(0)
    return torch.cat(variants), torch.cat(gains)


def _descend(objective: _Objective, sets: list[torch.Tensor], sentence: torch.Tensor,
             screen: int, threshold: float) -> tuple[torch.Tensor, float]:
    """Local search from ``sentence`` until no screened move helps (a sentence that passes
    ``threshold`` is still improved: a transposed pair may pass the median); the sentence
    reached and its certificate, the median span distance of its positions."""
    distances = objective.distances(sentence[None])[0]
    value = float(distances.mean())
    while not objective.work.exhausted and float(distances.max()) >= threshold / 100:
        grad = objective.gradient(sentence)
        variants, gains = _moves(sentence, sets, grad, objective.embeddings)
        order = torch.argsort(gains)
        stages = [order[:screen], order[screen:WIDEN * screen]]
        if threshold <= float(distances.median()) < POLISH * threshold:
            stages.append(order[WIDEN * screen:])
        improved = False
        for chosen in stages:
            if chosen.numel() == 0:
                continue
            d = objective.distances(variants[chosen])
            values = d.mean(dim=1)
            best = int(torch.argmin(values))
            if float(values[best]) < value * (1 - 1e-9):
                sentence, distances = variants[chosen[best]], d[best]
                value, improved = float(values[best]), True
                break
        if not improved:
            break
    return sentence, float(distances.median())
