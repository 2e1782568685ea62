"""DAGER's search for encoders (Petrov et al. 2024), by local search.

In an encoder every position sees the whole sentence, so the second span's input
``h_j(s)`` of a candidate sentence ``s`` is known only once all of ``s`` is fixed: no greedy
order exists. The paper enumerates (or samples) the product of the filtered token sets of the
positions and keeps the B sentences with the smallest mean second-span distance, which is
exact for small B·T and hopeless for B = 8 sentences of 32 tokens (8³⁰ combinations; at random
initialisation every position's set is the whole batch's token set, see :mod:`dager`).

Here the same objective,

    f(s) = (1/ℓ) Σ_j d₂(h_j(s)),      s_j ∈ S_j,   ℓ the sentence length,

is minimised by local search over single-token replacements (``s_j ← c``, c ∈ S_j),
transpositions (``s_j ↔ s_k``) and shifts by one of a run ``s_j … s_k`` (a cyclic rotation: a
token one position off together with the run it sits in, :mod:`encoder_moves`): a first-order
screen ranks every move by ``Σ_m ⟨∇_{e_m} f, E_{new_m} − E_{s_m}⟩`` (one backward pass through
the embeddings, as HotFlip / GCG do), the ``screen`` best are evaluated exactly, the best one is
taken while it lowers f; when none does, the next ``3·screen`` are, then (for a sentence within
``POLISH``·τ₂ = 100·τ₂ of its certificate but not certified) the rest in blocks of ``4·screen``
in the screen's order, the first block holding a move that lowers f taken, and then the start
ends. ``f`` is 0 exactly at the batch's sentences; a sentence mixing several of them has the
context (the attention over the sentence) of none, so its distance falls as it becomes purer,
and the search slides to the sentence most of its tokens came from. A sentence is certified when
the median of its positions' distances is below τ₂ (the median, not the largest: in a classifier
a few tokens, [SEP] often, get a δ so small that their direction drowns in the gradient's
rounding noise, and their distance stays near 10⁻²; a wrong token moves the context of every
position). Each start draws its tokens from those no certified sentence holds (so it lands on a
new sentence); a start that ends uncertified is a failed start.
**Lengths.** A sentence either fills every position or ends with ``end_token`` ([SEP]) where
that token passes the token filter (then padding, which has no δ). At random initialisation the
filter passes [SEP] nearly everywhere, so the length is searched too: a start takes a random
allowed length (the first start the longest), descends, and then tries its content at every
allowed length (cut, or continued with the content it had or random candidates) and, closed by
[SEP], one token shorter (any inner token deleted) or longer (every candidate inserted before
[SEP]; :mod:`encoder_moves`, which with the rotations moves a length together with its tokens);
it descends again at a length that fits better. A descent that sticks above τ₂ is kicked: the
worse-fitting half of its positions (largest distance) is redrawn and the descent repeated, kept
when it ends lower (iterated local search), ``KICKS`` times. The longest shape is open at its
end: its last position holds [SEP] or a word, so a text cut at the batch length (no [SEP]: long
speeches) and one closed at the last position are one shape a replacement moves between; a start
still uncertified at a shorter length is last continued to the longest shape and descended
there. A descent that comes to agree with a recovered sentence (of its length, or one off) at
``SAME`` of its inner positions stops at once (it is sliding onto that sentence) and counts as a
failed start. The search stops at ``batch_size`` certified sentences, after ``restarts`` failed
starts in a row, or at ``max_evaluations`` sentence evaluations.

**A saturated filter** (a pretrained BERT at 8 × 32: every batch token at every position) is
first narrowed by splitting the first-layer gradient (:mod:`position_split`, tokens pinned to
positions); the first starts are then the slots of the whole batch's assembly
(:mod:`sentence_assembly`), certified ones peeled off and the rest assembled again, before the
random starts take over (each assembly :data:`SWEEPS` block-coordinate sweeps). The split's sets
can miss a true pair — a repeated token pinned at one occurrence keeps a weight near 0 at
another (:mod:`position_split`) — so a descent within POLISH·τ₂ of its certificate that no move
over the sets improves also tries, in the screen's order and in blocks of ``WIDEN·screen``, the
moves over the widened sets (every batch token but the start token wherever a set has a choice,
:meth:`~fedleak.attacks.text.dager.encoder_shapes.Shapes.widened`) that put a token where the
sets do not. Each slot is first searched under a cap of ``max_evaluations/(2B)``
evaluations (one slow slot must not spend the budget of the others); the slots a cap stopped
are resumed, nearest their certificate first, without it. **Peeling** (given ``repin``,
:mod:`peeling`): each certified sentence's own gradient is subtracted from the update and the
rest split again, so the objective, the sets and the pins are the remaining sentences' alone;
a round whose capped slots certified half of them re-assembles the rest at once (its slots
within POLISH·τ₂ of their certificate as the assembly's first rows) instead of resuming.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fedleak.attacks.text.dager.configuration import DagerConfig, DagerResult, Work
from fedleak.attacks.text.dager.encoder_moves import blocks, indels, kick, moves, outside
from fedleak.attacks.text.dager.encoder_shapes import Shapes, shapes_of
from fedleak.attacks.text.dager.peeling import Repin
from fedleak.attacks.text.dager.sentence_assembly import assemble
from fedleak.attacks.text.dager.sentence_assembly import objective as objective_values
from fedleak.attacks.text.dager.span_check import InputSpan
from fedleak.attacks.text.transformer_layout import TransformerLayout, captured_input

#: sentences evaluated at once
CHUNK = 256
#: when the ``screen`` best moves do not help, the next ``(WIDEN − 1)·screen`` are tried
WIDEN = 4
#: and then the rest in blocks of WIDEN·screen, when the sentence's certificate is within
#: POLISH·τ₂ (10·τ₂ missed sentences two transposed tokens or a 3-cycle off, at 2–7·10⁻³)
POLISH = 100.0
#: a stuck start is kicked (its worse-fitting half redrawn) and descended again this often
KICKS = 3
#: a descent whose sentence agrees with a recovered one at this share of its positions stops
#: (two texts of a batch agreeing at 3 of 4 positions are one text, up to a few words)
SAME = 0.75
#: ... and is of its length or this many tokens off it
SLIDE = 1
#: assemblies in a row that certify nothing before the random starts take over
ROUNDS = 2
#: block-coordinate sweeps per assembly (a sweep costs B·(pinned + 3B) evaluations a position,
#: ~8,000 at 8 × 32 of a 60,000 budget; 2 against up to 6: 54 of 80 sentences against 47)
SWEEPS = 2
#: the score of a start that slid onto a recovered sentence
DUPLICATE = float("inf")


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
                   gradients: Mapping[str, torch.Tensor],
                   pinned: tuple[list[int], list[int] | None] | None = None,
                   repin: Repin | None = None) -> None:
    """Fill ``result`` with the sentences the search recovers (module docstring).

    ``pinned = (counts, lengths)``: the first ``counts[p]`` candidates of position p are pinned
    there by the gradient's split (:mod:`position_split`), ``lengths`` the sentence lengths it
    suggests (or None); the first starts are then the slots of
    :func:`~fedleak.attacks.text.dager.sentence_assembly.assemble`.
    """
    del gradients
    objective = _Objective(layout, span, work)
    generator = torch.Generator().manual_seed(config.seed)
    shapes = shapes_of(candidates, config, spare=pinned is not None)
    found: list[tuple[list[int], float]] = []
    failures = 0
    if pinned is not None and shapes.options:
        shapes = _assembled(objective, shapes, candidates, pinned[0], pinned[1], batch_size,
                            config, generator, found, repin)
        failures = 0
    while len(found) < batch_size and failures < config.restarts and not work.exhausted \
            and shapes.options:
        pick = int(torch.randint(len(shapes.options), (1,), generator=generator))
        length, ends = shapes.options[0 if not found and failures == 0 else pick]
        start = _start(shapes.sets(length, ends), [s for s, _ in found], generator,
                       2 * batch_size)
        sentence, score = _search(objective, shapes, start, config, generator,
                                  [s for s, _ in found])
        tokens = sentence.tolist()
        if score < config.l2_threshold and all(tokens != s for s, _ in found):
            found.append((tokens, score))
            work.found = len(found)
            failures = 0
        else:
            failures += 1
    result.sentences = [s for s, _ in found]
    result.scores = [score for _, score in found]
    result.certified = [True] * len(found)
    if len(found) < batch_size:
        result.warnings.append(f"{len(found)} of {batch_size} sentences recovered: the "
                               "search's starts ended above τ₂ (raise restarts or "
                               "max_evaluations)")


def _assembled(objective: _Objective, shapes: Shapes, candidates: list[torch.Tensor],
               pinned: list[int], lengths: list[int] | None, batch_size: int,
               config: DagerConfig, generator: torch.Generator,
               found: list[tuple[list[int], float]], repin: Repin | None = None) -> Shapes:
    """Assemble the remaining slots, certify what the local search can, peel it off, repeat.

    A certified sentence's pinned tokens are no longer required at their positions (each is one
    occurrence): they stay there as the first unpinned candidates, since a pinned token may
    occur again at the same position (“ opening five texts of a batch at position 1, [SEP]
    closing seven texts cut at 16 tokens); the next assembly has fewer slots and fewer required
    tokens; ``ROUNDS`` assemblies in a row that certify nothing end it.
    """
    sets, counts = [c.clone() for c in candidates], list(pinned)
    idle = 0
    warm: list[torch.Tensor] = []
    while len(found) < batch_size and idle < ROUNDS and not objective.work.exhausted:
        slots, values = assemble(objective.distances, sets, counts, batch_size - len(found),
                                 generator, config.end_token, sweeps=SWEEPS, lengths=lengths,
                                 starts=warm)
        warm = []
        before = len(found)
        cap = max(config.max_evaluations // (2 * batch_size), 1)
        starts: list[tuple[torch.Tensor, int | None]] = [
            (slots[k], cap) for k in torch.argsort(values).tolist()]
        pending: list[tuple[float, torch.Tensor]] = []
        repinned = False
        while starts:
            start, limit = starts.pop(0)
            if len(found) >= batch_size or objective.work.exhausted:
                break
            with objective.work.capped(limit):
                sentence, score = _search(objective, shapes, start, config, generator,
                                          [s for s, _ in found])
            tokens = sentence.tolist()
            if config.l2_threshold <= score < DUPLICATE and limit is not None:
                pending.append((score, sentence))
            if not starts and pending and repinned and 2 * (len(found) - before) >= len(slots):
                warm = [s for v, s in sorted(pending, key=lambda p: p[0])
                        if v < POLISH * config.l2_threshold]  # the next assembly's first rows
                break
            if not starts and pending:  # the capped starts resumed, nearest first, uncapped
                starts = [(s, None) for _, s in sorted(pending, key=lambda p: p[0])]
                pending = []
            if score < config.l2_threshold and all(tokens != s for s, _ in found):
                found.append((tokens, score))
                objective.work.found = len(found)
                if lengths is not None and len(tokens) in lengths:
                    lengths = [n for i, n in enumerate(lengths) if i != lengths.index(len(tokens))]
                for p, token in enumerate(tokens[:len(sets)]):
                    here = sets[p][:counts[p]]
                    if bool((here == token).any()) and sets[p].numel() > 1:
                        rest = sets[p][sets[p] != token]
                        counts[p] -= 1
                        sets[p] = torch.cat([rest[:counts[p]], torch.tensor([token]),
                                             rest[counts[p]:]])
                fresh = None if repin is None else repin([s for s, _ in found])
                if fresh is not None:  # the rest of the batch's gradient (module docstring)
                    repinned = True
                    objective.span, lengths = fresh.span, fresh.lengths
                    sets, counts = [c.clone() for c in fresh.candidates], list(fresh.pinned)
                    shapes = shapes_of(fresh.candidates, config, spare=True)
        idle = 0 if len(found) > before else idle + 1
    return shapes


def _search(objective: _Objective, shapes: Shapes, sentence: torch.Tensor,
            config: DagerConfig, generator: torch.Generator, found: list[list[int]]
            ) -> tuple[torch.Tensor, float]:
    """Descend at the sentence's shape, moving it to the best-fitting allowed shape.

    Descend at the sentence's shape, then move it to the allowed shape whose sentence fits best (its
    content cut or continued), and descend again while the shape changes; a start still uncertified
    below the longest shape is last continued to it and descended there (a text cut at the batch's
    length whose start fitted a shorter shape). A descent that slides onto a ``found`` sentence ends
    at once (:func:`_descend`), uncertified.
    """
    pools = [c if c.numel() else raw for c, raw in
             zip(shapes.sets(len(shapes.candidates), False), shapes.candidates, strict=True)]
    filler = torch.stack([c[int(torch.randint(len(c), (1,), generator=generator))]
                          for c in pools])
    score = float("inf")
    for _ in range(len(shapes.options) + 1):
        sets = shapes.sets(sentence.numel(), shapes.closes(sentence))
        wide = shapes.widened(sentence.numel(), shapes.closes(sentence))
        sentence, score = _descend(objective, sets, sentence, config.screen,
                                   config.l2_threshold, found, wide)
        for _ in range(KICKS):
            if score < config.l2_threshold or objective.work.exhausted or score == DUPLICATE:
                break
            fit = objective.distances(sentence[None])[0]
            kicked, kicked_score = _descend(objective, sets, kick(sentence, fit, sets,
                                                                  generator),
                                            config.screen, config.l2_threshold, found, wide)
            if kicked_score < score:
                sentence, score = kicked, kicked_score
        if score < config.l2_threshold or len(shapes.options) < 2 or score == DUPLICATE:
            break
        content = shapes.content(sentence)  # after the descent: the open end may have moved
        filler = torch.cat([content, filler[content.numel():]])
        variants = shapes.reshaped(sentence, filler) + indels(shapes, sentence)
        values = objective_values(objective.distances, variants).tolist()
        best = variants[min(range(len(values)), key=values.__getitem__)]
        if best.numel() == sentence.numel() and bool((best == sentence).all()):
            break
        sentence = best
    longest, closed = shapes.options[0]
    if config.l2_threshold <= score < DUPLICATE and sentence.numel() < longest \
            and not objective.work.exhausted:
        grown, grown_score = _descend(objective, shapes.sets(longest, closed),
                                      shapes.shaped(sentence, filler, longest, closed),
                                      config.screen, config.l2_threshold, found,
                                      shapes.widened(longest, closed))
        if grown_score < score:
            sentence, score = grown, grown_score
    return sentence, score


def _repeats(sentence: torch.Tensor, found: Sequence[list[int]]) -> bool:
    """Tell whether ``sentence`` agrees with a found sentence.

    Whether ``sentence`` agrees with a found sentence of its length or :data:`SLIDE` token off it at
    a share :data:`SAME` of the positions between the first and the shorter one's last (the
    first is [CLS] in every text and the last often the end token: short texts differing in one
    word stay apart). A length off too, because a descent changes lengths a token at a time
    (:mod:`encoder_moves`): a slot one token short of a recovered sentence is sliding onto it.
    Not further: texts of other lengths may share their first words.
    """
    tokens = sentence.tolist()
    for f in found:
        if abs(len(f) - len(tokens)) > SLIDE:
            continue
        inner = min(len(f), len(tokens)) - 2
        if inner > 0 and sum(a == b for a, b in zip(f[1:inner + 1], tokens[1:inner + 1],
                                                     strict=True)) >= SAME * inner:
            return True
    return False


def _start(sets: list[torch.Tensor], found: list[list[int]], generator: torch.Generator,
           prefer: int) -> torch.Tensor:
    """Draw a random start sentence over the token sets.

    A random sentence over the sets, each token drawn from the ``prefer`` nearest the first span at
    its position (the filter's order: where the first LayerNorm is not exactly linear the batch's
    own tokens come first) that no found sentence holds anywhere, else from those no found sentence
    holds there, else from all: the search slides to the sentence most of the start's tokens came
    from, so a start without the found sentences' tokens lands on a new one.
    """
    anywhere = {t for s in found for t in s}
    tokens = []
    for j, options in enumerate(sets):
        here = {s[j] for s in found if j < len(s)}
        pool = [int(t) for t in options[:prefer] if int(t) not in anywhere] or \
            [int(t) for t in options if int(t) not in anywhere] or \
            [int(t) for t in options if int(t) not in here] or options.tolist()
        tokens.append(pool[int(torch.randint(len(pool), (1,), generator=generator))])
    return torch.tensor(tokens)


def _descend(objective: _Objective, sets: list[torch.Tensor], sentence: torch.Tensor,
             screen: int, threshold: float, found: Sequence[list[int]] = (),
             wide: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, float]:
    """Search locally from ``sentence`` until no screened move helps.

    Local search from ``sentence`` until no screened move helps (a sentence that passes
    ``threshold`` is still improved: a transposed pair may pass the median); the sentence reached
    and its certificate, the median span distance of its positions — or :data:`DUPLICATE` as soon as
    the sentence agrees with a ``found`` one of its length at :data:`SAME` of its positions (the
    descent is sliding onto a sentence already recovered: the rest of it would be wasted work).
    ``wide``: larger sets (every batch token where a set has a choice); when no move over
    ``sets`` helps a sentence within POLISH·τ₂ of its certificate, the moves over ``wide`` that
    put a token where ``sets`` do not allow it are tried the same way, in the screen's order.
    """
    distances = objective.distances(sentence[None])[0]
    value = float(distances.mean())
    while not objective.work.exhausted and float(distances.max()) >= threshold / 100:
        if _repeats(sentence, found):
            return sentence, DUPLICATE
        grad = objective.gradient(sentence)
        variants, gains = moves(sentence, sets, grad, objective.embeddings)
        order = torch.argsort(gains)
        stages = [order[:screen], order[screen:WIDEN * screen]]
        polish = threshold <= float(distances.median()) < POLISH * threshold
        if polish:
            stages += blocks(order[WIDEN * screen:], WIDEN * screen)
        step = _first_better(objective, variants, stages, value)
        if step is None and polish and wide is not None:
            variants, gains = moves(sentence, wide, grad, objective.embeddings)
            fresh = torch.nonzero(outside(variants, sentence, sets)).flatten()
            step = _first_better(objective, variants,
                                 blocks(fresh[torch.argsort(gains[fresh])], WIDEN * screen),
                                 value)
        improved = step is not None
        if step is not None:
            sentence, distances = step
            value = float(distances.mean())
        if not improved:
            break
    return sentence, float(distances.median())


def _first_better(objective: _Objective, variants: torch.Tensor, stages: list[torch.Tensor],
                  value: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Return the best variant of the first stage holding one below ``value``, and its d₂."""
    for chosen in stages:
        if chosen.numel() == 0:
            continue
        d = objective.distances(variants[chosen])
        values = d.mean(dim=1)
        best = int(torch.argmin(values))
        if float(values[best]) < value * (1 - 1e-9):
            return variants[chosen[best]], d[best]
    return None
