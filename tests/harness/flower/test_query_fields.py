"""The Flower score query's fields (fedleak.harness.flower.node.query_fields) on a node: every
malformed field answered with an error reply naming it, never a ValueError or OverflowError
out of ``score_reply``; a well-formed query answered with the scores and their floors."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("flwr", reason="needs fedleak[flower]")

from flwr.app import ConfigRecord, Context, Message, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedleak.harness.flower.arrays import record_of  # noqa: E402
from fedleak.harness.flower.node.batches import remember_batch  # noqa: E402
from fedleak.harness.flower.node.node_scoring import (  # noqa: E402
    ECHO,
    SCORE_MESSAGE_TYPE,
    SUBMISSION_CONFIG,
    SUBMISSION_IMAGES,
    score_reply,
    submission_content,
)
from fedleak.harness.flower.score_answers import read_answer  # noqa: E402
from fedleak.harness.zoo.datasets import DatasetInfo  # noqa: E402

INFO = DatasetInfo("tiny", (1, 4, 4), 3, (0.5,), (0.5,), ("a", "b", "c"))


@pytest.fixture(autouse=True)
def _identity() -> None:
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0


def node() -> tuple[Context, torch.Tensor]:
    truth = torch.rand(2, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    context = Context(run_id=1, node_id=7, node_config={"fedleak-score-budget": 50},
                      state=RecordDict(), run_config={})
    remember_batch(context, 1, truth, torch.tensor([0, 2]))
    return context, truth


def query(config: dict[str, Any], images: Any = None) -> Message:
    arrays = record_of({"images": images, ECHO: torch.ones(1)}) if isinstance(
        images, torch.Tensor) else images
    content = RecordDict({SUBMISSION_CONFIG: ConfigRecord(config)})
    if arrays is not None:
        content[SUBMISSION_IMAGES] = arrays
    return Message(content, dst_node_id=7, message_type=SCORE_MESSAGE_TYPE)


GOOD = torch.rand(2, 1, 4, 4)


@pytest.mark.parametrize(("config", "images", "named"), [
    ({"round": 1, "labels": ["x", "y"]}, GOOD, "labels[0] is 'x'"),
    ({"round": 1, "labels": [0.0, float("nan")]}, GOOD, "labels[0] is 0.0"),
    ({"round": 1, "labels": [float("inf"), 1.0]}, GOOD, "labels[0] is inf"),
    ({"round": 1, "labels": [1, -2]}, GOOD, "labels[1] is -2"),
    ({"round": 1, "labels": [0, 1, 2]}, GOOD, "3 labels submitted for 2 images"),
    ({"round": 1, "labels": [0, 7]}, GOOD, "labels must lie in [0, 3)"),
    ({"round": 1, "labels": "x"}, GOOD, "labels must be a list"),
    ({"round": 1, "padding": ["x"]}, GOOD, "padding[0] is 'x'"),
    ({"round": 1, "padding": [float("nan")]}, GOOD, "padding[0] is nan"),
    ({"round": 1, "padding": [5]}, GOOD, "padding indices [5] lie outside"),
    ({"round": 1, "padding": [0, 0]}, GOOD, "padding lists an index twice"),
    ({"round": "x"}, GOOD, "round must be the server round"),
    ({"round": float("inf")}, GOOD, "got inf"),
    ({"round": True}, GOOD, "round must be the server round"),
    ({"round": -1}, GOOD, "round must be the server round"),
    ({"round": 1, "aggregate": "yes"}, GOOD, "aggregate must be true or false"),
    ({"round": 1}, torch.full((2, 1, 4, 4), float("nan")), "NaN or infinite"),
    ({"round": 1}, torch.zeros(2, 1, 4, 4, dtype=torch.int32), "dtype torch.int32"),
    ({"round": 1}, torch.rand(2, 16), "shape [2, 16]"),
    ({"round": 1}, torch.rand(3, 1, 4, 4), "reconstruction has shape [3, 1, 4, 4]"),
    ({"round": 1, "aggregate": True}, torch.rand(1, 1, 4, 4), "fewer than the 2"),
    ({"round": 1, "aggregate": True, "padding": [9]}, torch.rand(3, 1, 4, 4),
     "padding indices [9] lie outside"),
    ({"round": 4}, GOOD, "not round 4"),
    ({"round": 1}, None, "no images"),
])
def test_every_malformed_field_is_answered_by_name(config: dict[str, Any], images: Any,
                                                   named: str) -> None:
    context, _ = node()
    answer = score_reply(query(config, images), context, INFO)
    assert answer.has_error(), answer.content
    assert named in answer.error.reason


def test_a_list_longer_than_any_batch_is_refused_by_length() -> None:
    context, _ = node()
    answer = score_reply(query({"round": 1, "labels": [0] * ((1 << 20) + 1)}, GOOD), context,
                         INFO)
    assert answer.has_error() and "at most" in answer.error.reason


def test_a_query_without_its_config_or_with_unreadable_arrays_is_named() -> None:
    context, _ = node()
    bare = Message(RecordDict({}), dst_node_id=7, message_type=SCORE_MESSAGE_TYPE)
    assert "ConfigRecord 'fedleak.submission'" in score_reply(bare, context, INFO).error.reason
    wrong = query({"round": 1}, ConfigRecord({"images": 1}))
    wrong.content[SUBMISSION_IMAGES] = ConfigRecord({"images": 1})
    answer = score_reply(wrong, context, INFO)
    assert answer.has_error() and "no images" in answer.error.reason


def test_a_good_query_is_scored_beside_its_floors_and_read_back_by_the_audit() -> None:
    context, truth = node()
    answer = score_reply(Message(submission_content(1, truth.clone(), [0, 2]), dst_node_id=7,
                                 message_type=SCORE_MESSAGE_TYPE), context, INFO)
    assert not answer.has_error(), answer.error.reason
    (score, _, unscored), _ = read_answer(answer, 10.0)
    assert unscored is None and score is not None
    assert score.floors_scored and [f.guess for f in score.floors] == [
        "grey", "data-set mean", "own mean colour"]
    assert score.above_floor == 2 and score.successes == 2
    assert all(i.floor_psnr < i.psnr for i in score.images)
    assert score.mean_floor_margin == pytest.approx(
        score.mean_psnr - score.mean_floor_psnr, abs=0.02)
    grey = score_reply(Message(submission_content(1, torch.full_like(truth, 0.5), [0, 2]),
                               dst_node_id=7, message_type=SCORE_MESSAGE_TYPE), context, INFO)
    (flat, _, _), _ = read_answer(grey, 10.0)
    assert flat is not None and flat.above_floor == 0 and flat.successes == 0


def test_a_malformed_answer_is_read_as_unscored_with_the_reason() -> None:
    context, truth = node()
    answer = score_reply(Message(submission_content(1, truth.clone(), [0, 2]), dst_node_id=7,
                                 message_type=SCORE_MESSAGE_TYPE), context, INFO)
    answer.content.metric_records["fedleak.score"]["psnr"] = [1.0]  # one for two images
    (score, _, unscored), _ = read_answer(answer, 10.0)
    assert score is None and unscored is not None and "malformed" in unscored
