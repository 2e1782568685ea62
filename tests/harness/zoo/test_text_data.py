"""The text that ships: the corpus split by role, the tokenizer, sequences, labels, canaries."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from fedleak.harness.zoo.text.corpus import CorpusError, read_corpus
from fedleak.harness.zoo.text.secret_sharer import canary_texts, sampled_exposure, secrets_in
from fedleak.harness.zoo.text.text_datasets import (
    IGNORE_INDEX,
    content_mask,
    language_model_labels,
    load_text_dataset,
)
from fedleak.harness.zoo.text.tokenizer import TokenizerError, load_tokenizer
from fedleak.harness.zoo.text.tokenizer_training import BUNDLED_TOKENIZER_FILE, train_tokenizer


def test_held_out_roles_never_speak_in_the_train_split() -> None:
    train, test = read_corpus("shakespeare", "train"), read_corpus("shakespeare", "test")
    every = read_corpus("shakespeare", "all")
    assert len(train) + len(test) == len(every) > 7000
    assert not {s.user for s in train} & {s.user for s in test}
    assert all(s.user_index % 5 == 4 for s in test)
    assert len({s.user for s in test}) > 50  # roles, as LEAF splits users


def test_the_bundled_tokenizer_is_the_one_its_script_trains() -> None:
    shipped = BUNDLED_TOKENIZER_FILE.read_text(encoding="utf-8").strip()
    assert train_tokenizer() == shipped
    tok = load_tokenizer()
    assert tok.sha256 == hashlib.sha256(tok.json.encode()).hexdigest()
    assert tok.vocab_size == 4096 and (tok.pad_id, tok.start_id, tok.end_id) == (0, 2, 3)
    text = "Thanks. What's the matter, you dissentious rogues?"
    ids = tok.encode([text], 40)[0].tolist()
    assert ids[0] == tok.start_id and tok.decode(ids) == text


def test_sequences_are_start_text_end_then_padding() -> None:
    tok = load_tokenizer()
    ids = tok.encode(["Speak, speak.", "a " * 100], 12)
    short, long = ids.tolist()
    assert short[0] == tok.start_id and tok.end_id in short and short[-1] == tok.pad_id
    assert tok.pad_id not in long and tok.end_id not in long  # cut at T: no end token
    mask = content_mask(ids, tok.pad_id)
    assert mask[1].all() and int(mask[0].sum()) == short.index(tok.end_id) + 1
    labels = language_model_labels(ids, tok.pad_id)
    assert labels[0, 0] == short[1] and labels[0, short.index(tok.end_id)] == IGNORE_INDEX
    assert (labels[:, -1] == IGNORE_INDEX).all() and (labels[1, :-1] == ids[1, 1:]).all()


def test_text_data_sets_for_both_tasks() -> None:
    lm = load_text_dataset("shakespeare", "test", seq_len=16)
    assert lm.tokens.shape == (len(lm.texts), 16) and lm.labels.shape == lm.tokens.shape
    assert lm.info.num_classes == 4096 and lm.images is lm.tokens
    cls = load_text_dataset("shakespeare", "test", task="classify", seq_len=16)
    assert cls.labels.shape == (len(cls.texts),) and set(cls.labels.tolist()) == {0, 1, 2}
    assert cls.info.class_names == ("statement", "question", "exclamation")
    with pytest.raises(ValueError, match="lm, classify"):
        load_text_dataset("shakespeare", task="translate")


def test_canaries_follow_their_rows_through_a_selection() -> None:
    data = load_text_dataset("shakespeare", "test", canaries=3, canary_seed=7)
    assert len(data.secrets) == 3 and all(len(s) == 6 for s in data.secrets)
    for row, secret in zip(data.canary_rows, data.secrets, strict=True):
        assert secrets_in([data.texts[row]], [secret]) == 1
    shuffled = data.select(torch.randperm(len(data), generator=torch.Generator().manual_seed(0)))
    assert sorted(shuffled.secrets) == sorted(data.secrets)
    for row, secret in zip(shuffled.canary_rows, shuffled.secrets, strict=True):
        assert secret.replace("", " ").strip() in shuffled.texts[row]
    texts, secrets = canary_texts(2, 7)
    assert secrets == data.secrets[:2] and texts[0].startswith("my secret number is")


def test_exposure_ranks_the_secret_among_sampled_candidates() -> None:
    secret = "123456"
    memorised = sampled_exposure(lambda t: 0.0 if "1 2 3 4 5 6" in t else 1.0, secret, 200)
    forgotten = sampled_exposure(lambda t: 2.0 if "1 2 3 4 5 6" in t else 1.0, secret, 200)
    assert memorised == pytest.approx(6 * 3.3219, abs=1e-3)  # log2(10^6): ranked first
    assert forgotten == pytest.approx(0.0, abs=1e-5)  # ranked last: log2(10^6 / (10^6 + 1))


def test_a_users_own_text_files(tmp_path: Path) -> None:
    one = tmp_path / "mine.txt"
    one.write_text("first line\n\nsecond line\nthird\nfourth\nfifth\n", encoding="utf-8")
    assert [s.text for s in read_corpus("textfile", "test", one)] == ["fifth"]
    folder = tmp_path / "users"
    folder.mkdir()
    for k in range(5):
        (folder / f"user{k}.txt").write_text(f"hello from {k}\n", encoding="utf-8")
    test = read_corpus("textfile", "test", folder)
    assert [s.user for s in test] == ["user4"]
    data = load_text_dataset("textfile", "all", data_root=str(folder))
    assert len(data) == 5 and data.users[0] == "user0"
    with pytest.raises(CorpusError, match="--data-root"):
        read_corpus("textfile", "all")
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
