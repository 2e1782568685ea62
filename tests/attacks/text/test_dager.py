"""DAGER in process: exact sentences from a random decoder's and encoder's gradient at small
size (hidden 64, two layers, B·T well below the hidden size), the span check's maths, where
the attack stops (B·T ≥ d), and clear refusals. Span distances are compared with tolerances
(a float32 gradient's rounding noise leaves the inputs at 10⁻⁸–10⁻⁵, everything else near 0.1
or above), never bit for bit.
"""

from __future__ import annotations

import math

import pytest
import torch

from fedleak.attacks.text.dager.layer_search import DagerConfig, dager
from fedleak.attacks.text.dager.span_check import SpanError, input_span, numerical_rank
from fedleak.attacks.text.transformer_layout import LayoutError, layout_of
from tests import text_attack_models as tm

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_span_of_a_linear_layer_gradient_holds_its_inputs_and_nothing_else() -> None:
    """∇W = Xᵀ δ (eq. 2): rank b, the inputs at distance ~0, random vectors near √(1 − b/n)."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(10, 48, generator=generator)
    delta = torch.randn(10, 96, generator=generator)
    span = input_span([inputs.T @ delta])
    assert span.rank == 10 and not span.full
    assert float(span.distance(inputs).max()) < 1e-5
    others = span.distance(torch.randn(200, 48, generator=generator))
    assert float(others.min()) > 0.5
    assert abs(float(others.pow(2).mean()) - (1 - 10 / 48)) < 0.1


def test_the_span_is_full_once_the_batch_has_as_many_vectors_as_the_width() -> None:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(60, 48, generator=generator)
    span = input_span([inputs.T @ torch.randn(60, 96, generator=generator)])
    assert span.full and span.rank == 48
    assert input_span([inputs[:47].T @ torch.randn(47, 96, generator=generator)]).full


def test_the_rank_stops_at_the_rounding_noise() -> None:
    s = torch.tensor([1.0, 1e-2, 1e-5, 3e-7, 5e-8, 1e-8], dtype=torch.float64)
    assert numerical_rank(s, torch.float32) == 3
    assert numerical_rank(s, torch.float64) == 6


@pytest.mark.parametrize("count,length", [(2, 8), (3, 10)])
def test_dager_recovers_a_decoder_batch_exactly(count: int, length: int) -> None:
    """GPT-2 language model: the greedy search finds every prefix, the final LayerNorm's
    gradient every last token."""
    model = tm.gpt2(hidden=64)
    ids = tm.sentences(count, length)
    result = dager(model, tm.gradients(model, ids), count)
    assert sorted(result.sentences) == sorted(ids.tolist())
    assert all(result.certified) and not result.truncated and not result.warnings
    assert result.ranks[0] <= count * length < 64
    assert result.evaluations > 0


def test_dager_recovers_a_padded_decoder_batch_of_several_lengths() -> None:
    """Padding has no δ: each sentence ends where no extension passes; the last tokens of
    sentences of different lengths come from the final LayerNorm's gradient together."""
    model = tm.gpt2(hidden=64)
    rows = [tm.sentences(1, length, start=5 + 11 * k)[0].tolist() + [tm.PAD] * (9 - length)
            for k, length in enumerate((9, 7, 5, 7))]
    ids = torch.tensor(rows)
    result = dager(model, tm.gradients(model, ids, mask=(ids != tm.PAD).long()), 4)
    assert sorted(result.sentences) == sorted([t for t in r if t != tm.PAD] for r in rows)
    assert all(result.certified)


def test_dager_reads_one_local_step_as_a_gradient() -> None:
    """A FedAvg delta of one step is −τ∇L: the spans are the same; the last tokens' fit finds
    the scale τ."""
    model = tm.gpt2(hidden=64)
    ids = tm.sentences(3, 8, start=30)
    step = {k: 0.05 * v for k, v in tm.gradients(model, ids).items()}
    result = dager(model, step, 3)
    assert sorted(result.sentences) == sorted(ids.tolist()) and all(result.certified)


def test_dager_recovers_a_decoder_classifier_batch_exactly() -> None:
    """A pooled classifier's last token has a δ: it is found by the span check itself."""
    model = tm.gpt2(hidden=64, classifier=True)
    ids = tm.sentences(2, 8, start=20)
    result = dager(model, tm.gradients(model, ids, torch.tensor([0, 1])), 2)
    assert sorted(result.sentences) == sorted(ids.tolist())


@pytest.mark.parametrize("count,length", [(2, 8), (3, 10)])
def test_dager_recovers_an_encoder_batch_exactly(count: int, length: int) -> None:
    model = tm.bert(hidden=64)
    ids = tm.with_markers(tm.sentences(count, length - 2, start=3))
    labels = torch.arange(count) % 2
    result = dager(model, tm.gradients(model, ids, labels), count,
                   DagerConfig(end_token=tm.SEP))
    assert sorted(result.sentences) == sorted(ids.tolist())
    assert all(result.certified)
    assert all(score < 1e-4 for score in result.scores)


def test_dager_recovers_an_encoder_batch_of_several_lengths() -> None:
    """Sentences ending with [SEP] at different places, padded: the lengths are searched."""
    model = tm.bert(hidden=64)
    rows = []
    for k, length in enumerate((8, 6, 4)):
        row = tm.with_markers(tm.sentences(1, length, start=10 + 9 * k))[0].tolist()
        rows.append(row + [tm.PAD] * (10 - len(row)))
    ids = torch.tensor(rows)
    mask = (ids != tm.PAD).long()
    grads = tm.gradients(model, ids, torch.tensor([0, 1, 0]), mask)
    result = dager(model, grads, 3, DagerConfig(end_token=tm.SEP, max_length=10))
    truth = [[t for t in row if t != tm.PAD] for row in rows]
    assert sorted(result.sentences) == sorted(truth)


def test_dager_stops_where_the_batch_fills_the_hidden_size() -> None:
    """B·T ≥ d: the span is all of ℝᵈ, every token would pass; nothing is claimed."""
    model = tm.gpt2(hidden=64)
    ids = tm.sentences(6, 14, step=20)
    result = dager(model, tm.gradients(model, ids), 6)
    assert result.sentences == [] and result.ranks[0] >= 63
    assert any("B·T ≥ d" in w for w in result.warnings)


def test_the_layout_reads_the_first_attention_and_a_second_span() -> None:
    layout = layout_of(tm.bert(hidden=64), second="attention")
    assert layout.kind == "encoder" and len(layout.layers[1].weights) == 3
    assert layout.layers[1].weights[0] == "bert.encoder.layer.1.attention.self.query.weight"
    decoder = layout_of(tm.gpt2(hidden=64))
    assert decoder.kind == "decoder" and decoder.next_token
    assert decoder.layers[1].weights == ("transformer.h.0.mlp.c_fc.weight",)


def test_dager_refuses_what_it_cannot_read() -> None:
    model = tm.gpt2(hidden=64)
    grads = tm.gradients(model, tm.sentences(2, 6))
    with pytest.raises(ValueError, match="batch_size"):
        dager(model, grads, 0)
    missing = {k: v for k, v in grads.items() if "c_attn" not in k}
    with pytest.raises(LayoutError, match="c_attn.weight"):
        dager(model, missing, 2)
    broken = dict(grads)
    broken["transformer.h.0.attn.c_attn.weight"] = torch.full_like(
        grads["transformer.h.0.attn.c_attn.weight"], math.nan)
    with pytest.raises(SpanError, match="NaN"):
        dager(model, broken, 2)
    zero = {k: torch.zeros_like(v) for k, v in grads.items()}
    with pytest.raises(SpanError, match="zero"):
        dager(model, zero, 2)
    with pytest.raises(LayoutError, match="neither a GPT-2"):
        dager(torch.nn.Linear(3, 3), grads, 2)
    with pytest.raises(ValueError, match="l2_threshold"):
        DagerConfig(l2_threshold=2.0)
    with pytest.raises(ValueError, match="restarts"):
        DagerConfig(restarts=0)


def test_an_encoder_batch_of_cut_and_closed_texts_is_recovered() -> None:
    """A text cut at the batch length (no [SEP]) beside one closed by [SEP] at the last
    position and a shorter one: the full shape's last position holds either."""
    model = tm.bert(hidden=64)
    cut = [tm.CLS, *tm.sentences(1, 9, start=40)[0].tolist()]
    closed = tm.with_markers(tm.sentences(1, 8, start=60))[0].tolist()
    short = tm.with_markers(tm.sentences(1, 5, start=80))[0].tolist()
    rows = [cut, closed, short + [tm.PAD] * (10 - len(short))]
    ids = torch.tensor(rows)
    grads = tm.gradients(model, ids, torch.tensor([0, 1, 0]), (ids != tm.PAD).long())
    result = dager(model, grads, 3, DagerConfig(end_token=tm.SEP, max_length=10))
    assert sorted(result.sentences) == sorted([cut, closed, short])


def test_the_full_shape_is_open_at_its_end_and_a_slide_onto_a_found_text_is_seen() -> None:
    from fedleak.attacks.text.dager.encoder import _repeats
    from fedleak.attacks.text.dager.encoder_shapes import Shapes as _Shapes

    end = 3
    candidates = [torch.tensor([2]), torch.tensor([5, 6, end]), torch.tensor([7, end])]
    shapes = _Shapes(candidates, end, full=True)
    assert shapes.open_end
    assert shapes.options == [(3, False), (2, True)]  # no separate (3, closed) shape
    assert sorted(shapes.sets(3, False)[-1].tolist()) == [end, 7]
    assert shapes.sets(2, True)[-1].tolist() == [end]
    assert not _Shapes(candidates, end, full=False).open_end
    found = [[2, 10, 11, 12, 13, 3]]
    assert _repeats(torch.tensor([2, 10, 11, 12, 99, 3]), found)  # 3 of 4 inner positions
    assert not _repeats(torch.tensor([2, 10, 11, 98, 99, 3]), found)
    assert _repeats(torch.tensor([2, 10, 11, 12, 13]), found)  # a length away: sliding onto it
    assert _repeats(torch.tensor([2, 10, 11, 12, 99, 13, 3]), found)  # one longer, 3 of 4
    assert not _repeats(torch.tensor([2, 10, 97, 98, 99, 13, 3]), found)
    assert not _repeats(torch.tensor([2, 10, 11, 3]), found)  # two shorter: another text
    assert not _repeats(torch.tensor([2, 5, 3]), [[2, 6, 3]])  # short texts one word apart


def test_a_run_shifts_by_one_with_its_first_order_gain() -> None:
    """Every cyclic shift by one of a run of three or more tokens, each allowed where it lands;
    the screen's gain is the exact change of the linearised objective."""
    from fedleak.attacks.text.dager.encoder_moves import rotations as _rotations

    generator = torch.Generator().manual_seed(0)
    embeddings = torch.randn(20, 5, dtype=torch.float64, generator=generator)
    sentence = torch.tensor([1, 2, 3, 4, 5, 6])
    grad = torch.randn(6, 5, dtype=torch.float64, generator=generator)
    anywhere = [set(range(20))] * 6
    rotated = _rotations(sentence, anywhere, embeddings[sentence], grad)
    assert rotated is not None
    block, gains = rotated
    assert block.shape == (2 * 10, 6)  # runs j..k with k >= j + 2, both directions
    assert [2, 3, 1, 4, 5, 6] in block.tolist() and [3, 1, 2, 4, 5, 6] in block.tolist()
    exact = ((embeddings[block] - embeddings[sentence]) * grad).sum((1, 2))
    assert torch.allclose(gains, exact, atol=1e-12)
    pinned = [set(range(20))] * 6
    pinned[0] = {1}  # token 1 may stand at position 0 only
    block, _ = _rotations(sentence, pinned, embeddings[sentence], grad) or (None, None)
    assert block is not None and bool((block[:, 0] == 1).all())
    assert _rotations(torch.tensor([7, 7, 7]), anywhere[:3], embeddings[[7, 7, 7]],
                      grad[:3]) is None  # a run of one token shifts onto itself


def test_a_closed_text_grows_or_shrinks_by_one_token_with_its_tokens() -> None:
    from fedleak.attacks.text.dager.encoder_moves import indels as _indels
    from fedleak.attacks.text.dager.encoder_shapes import Shapes as _Shapes

    end = 3
    candidates = [torch.tensor([2]), torch.tensor([5, 6, end]), torch.tensor([7, 8, end]),
                  torch.tensor([9, end])]
    shapes = _Shapes(candidates, end, full=True)
    variants = [v.tolist() for v in _indels(shapes, torch.tensor([2, 5, end]))]
    assert sorted(variants) == [[2, end], [2, 5, 7, end], [2, 5, 8, end]]
    variants = [v.tolist() for v in _indels(shapes, torch.tensor([2, 5, 7, end]))]
    assert [2, 7, end] in variants and [2, 5, end] in variants  # either inner token deleted
    assert _indels(shapes, torch.tensor([2, 5, 7, 9])) == []  # not closed: a cut text


def test_the_search_reports_its_work_as_it_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedleak.attacks.text.dager import configuration as dager_settings
    from fedleak.attacks.text.dager.configuration import Work

    calls: list[tuple[int, int, float]] = []
    work = Work(5000, lambda *a: calls.append(a))
    work.add(1500)
    assert calls == []
    work.found = 2
    work.add(600)
    assert calls == [(2100, 5000, 2.0)]
    monkeypatch.setattr(dager_settings, "REPORT_EVERY", 1)
    model = tm.bert(hidden=64)
    ids = tm.with_markers(tm.sentences(2, 6, start=3))
    calls.clear()
    result = dager(model, tm.gradients(model, ids, torch.tensor([0, 1])), 2,
                   DagerConfig(end_token=tm.SEP), progress=lambda *a: calls.append(a))
    assert calls and calls[-1][0] <= result.evaluations
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)
    assert calls[-1][2] <= 2


def test_outside_marks_only_the_moves_the_narrow_sets_do_not_allow() -> None:
    """A replacement by a token outside its position's set, or a swap moving a token to a
    position whose set lacks it, is marked; a move within the sets, or none, is not."""
    from fedleak.attacks.text.dager.encoder_moves import outside

    sentence = torch.tensor([1, 5, 6, 2])
    sets = [torch.tensor([1]), torch.tensor([5, 7]), torch.tensor([6, 5]), torch.tensor([2])]
    variants = torch.tensor([[1, 7, 6, 2],   # 7 ∈ S_1: inside
                             [1, 9, 6, 2],   # 9 ∉ S_1: outside
                             [1, 6, 5, 2],   # 6 ∉ S_1 (5 ∈ S_2): outside
                             [1, 5, 6, 2]])  # unchanged: inside
    assert outside(variants, sentence, sets).tolist() == [False, True, True, False]
