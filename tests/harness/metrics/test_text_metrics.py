"""Text scoring: ROUGE on decoded text, sentences matched one-to-one, exact counts, token sets."""

from __future__ import annotations

import pytest

from fedleak.harness.metrics.text_metrics import exact_count, score_sentences, token_set_score


def words(ids: list[int]) -> str:
    return " ".join(f"w{i}" for i in ids)


def test_sentences_are_matched_one_to_one_in_any_order() -> None:
    truth = [[1, 2, 3, 4], [5, 6, 7]]
    score = score_sentences(truth, [[5, 6, 7], [1, 2, 3, 4]], words)
    assert score.rouge1 == score.rouge2 == score.rougeL == 1.0 and score.exact == 2
    assert [s.matched_index for s in score.sentences] == [1, 0]


def test_rouge_of_a_partial_recovery() -> None:
    score = score_sentences([[1, 2, 3, 4]], [[1, 2, 3, 9]], words)
    s = score.sentences[0]
    assert s.rouge1 == pytest.approx(0.75) and s.rouge2 == pytest.approx(2 / 3)
    assert s.rougeL == pytest.approx(0.75) and not s.exact and score.exact == 0


def test_padding_and_missing_sentences_never_count() -> None:
    truth = [[1, 2], [3, 4]]
    score = score_sentences(truth, [[1, 2], [3, 4]], words, padding=[1])
    assert score.exact == 1 and score.rouge1 == pytest.approx(0.5)
    assert score.sentences[1].padding and score.sentences[1].rouge1 == 0.0
    fewer = score_sentences(truth, [[3, 4]], words)
    assert fewer.rouge1 == pytest.approx(0.5) and fewer.sentences[0].matched_index == -1


def test_exact_counts_are_a_multiset_matching() -> None:
    count, pairs = exact_count([[1], [1], [2]], [[1], [2], [2]])
    assert count == 2 and pairs == {0: 0, 2: 1}


def test_token_sets_and_multisets() -> None:
    truth = [[1, 2, 2], [3]]
    score = token_set_score(truth, [1, 2, 9])
    assert score.precision == pytest.approx(2 / 3) and score.recall == pytest.approx(2 / 3)
    counted = token_set_score(truth, [1, 2, 3], [1, 1, 2])
    assert counted.count_precision == pytest.approx(0.75)  # 3 of 4 stated occurrences true
    assert counted.count_recall == pytest.approx(0.75)  # 3 of the 4 true occurrences stated


def test_prior_guess_ranks_public_ids_by_frequency() -> None:
    from fedleak.harness.metrics.text_metrics import prior_guess
    public = [[5, 5, 5, 2], [2, 2, 9, 9, 9, 9]]
    assert prior_guess(public, [1, 3]) == [[9], [9, 2, 5]]


def test_shuffled_bag_keeps_the_token_set_and_lengths() -> None:
    from fedleak.harness.metrics.text_metrics import shuffled_bag
    truth = [[1, 2, 3], [4, 5]]
    guess = shuffled_bag(truth, seed=0)
    assert [len(g) for g in guess] == [3, 2]
    assert sorted(t for g in guess for t in g) == [1, 2, 3, 4, 5]
    assert shuffled_bag(truth, seed=0) == guess
    assert shuffled_bag([], seed=0) == []
