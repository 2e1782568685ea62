"""The audit's side of node scoring: score queries sent, answers read.

:mod:`~fedleak.harness.flower.node.node_scoring` answers on the node; this module builds the
queries (:func:`score_query`), sends many at once (:func:`ask_nodes`: one
``send_and_receive`` for every node and round, answers matched by node and round) and turns an
answer into the victim's ``ScoreResponse`` (:func:`read_answer`), or one readable line saying
why the node did not score (:func:`score_error`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
from flwr.app import Message
from flwr.serverapp import Grid

from fedleak.harness.flower.arrays import tensors
from fedleak.harness.flower.node.node_scoring import (
    FLOOR_GUESSES,
    REVEALED,
    SCORE_ACTION,
    SCORE_MESSAGE_TYPE,
    SCORE_METRICS,
    revealed_images,
    submission_content,
)
from fedleak.harness.metrics.image_metrics import EXACT_PSNR, SUCCESS_PSNR
from fedleak.v1 import victim_pb2 as pb

#: a node's (or the nodes') answer to a score query: (scores, revealed truth, why unscored);
#: ``partition`` beside it when the node said its partition-id
ScoreAnswer = tuple[pb.ScoreResponse | None, torch.Tensor | None, str | None]
#: ANSI escape sequences (colours) in a Flower error reason
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def score_query(server_round: int, node: int, images: torch.Tensor | None, labels: list[int],
                *, aggregate: bool = False, padding: list[int] | None = None,
                clipping_norm: float | None = None) -> Message:
    """The query asking ``node`` to score round ``server_round``'s reconstruction."""
    return Message(submission_content(server_round, images, labels, aggregate=aggregate,
                                      padding=padding, clipping_norm=clipping_norm),
                   dst_node_id=node, message_type=SCORE_MESSAGE_TYPE,
                   group_id=str(server_round))


def ask_nodes(grid: Grid, queries: Sequence[Message], timeout: float
              ) -> dict[tuple[int, str], Message]:
    """Send every query at once; the answers by (node, round as sent in ``group_id``)."""
    answers = grid.send_and_receive(list(queries), timeout=timeout)
    return {(a.metadata.src_node_id, a.metadata.group_id): a for a in answers}


def read_answer(answer: Message | None, timeout: float) -> tuple[ScoreAnswer, int | None]:
    """The node's scores, the truth it revealed and why it did not score (module doc), and the
    partition-id it said; ``None`` answer: it did not answer within ``timeout``."""
    if answer is None:
        return (None, None, f"the node did not answer the score query in {timeout:g} s "
                            "(LeakageAudit(score_timeout=...); `fedleak flower simulate "
                            "--score-timeout`)"), None
    if answer.has_error():
        return (None, None, score_error(answer.error.reason or "")), None
    record = answer.content.metric_records.get(SCORE_METRICS)
    if record is None:
        return (None, None, f"the node's answer carries no {SCORE_METRICS} metrics"), None
    metrics: dict[str, Any] = dict(record)
    try:
        score = _scores(metrics)
        truth = revealed_images(answer.content)
        if truth is None and REVEALED in answer.content.array_records:  # a node before 0.3
            truth = tensors(answer.content.array_records[REVEALED])["images"]
    except (KeyError, TypeError, ValueError, IndexError, OverflowError) as err:
        return (None, None, f"the node's score answer is malformed ({type(err).__name__}: "
                            f"{err}): is its fedleak the audit's version?"), None
    partition = metrics.get("partition-id")
    return (score, truth, None), partition if isinstance(partition, int) else None


def _scores(metrics: dict[str, Any]) -> pb.ScoreResponse:
    """A node's score metrics as the victim's ``ScoreResponse``."""
    score = pb.ScoreResponse()
    if "psnr" in metrics:
        _image_scores(score, metrics)
    if "label-accuracy" in metrics:
        score.labels_scored = True
        score.label_accuracy = float(metrics["label-accuracy"])
    return score


def _image_scores(score: pb.ScoreResponse, metrics: dict[str, Any]) -> None:
    """A node's image metrics into ``score`` (per image, means, counts, floors)."""
    for i, m, p, s, e in zip(metrics["index"], metrics["matched"], metrics["psnr"],
                             metrics["ssim"], metrics["mse"], strict=True):
        score.images.add(index=i, matched_index=m, psnr=p, ssim=s, mse=e)
    for image, padded, exact in zip(score.images, metrics.get("padding", []),
                                    metrics.get("exact-index", []), strict=False):
        image.padding, image.exact = bool(padded), int(exact) >= 0
        image.exact_index = max(int(exact), 0)
    score.exact, score.exact_psnr = int(metrics.get("exact", 0)), EXACT_PSNR
    if "successes" in metrics:
        score.successes = int(metrics["successes"])
        score.success_psnr = SUCCESS_PSNR
    if "best-psnr" in metrics:
        score.best_scored, score.best_psnr = True, float(metrics["best-psnr"])
    score.mean_psnr = float(metrics["mean-psnr"])
    score.mean_ssim = float(metrics["mean-ssim"])
    score.mean_mse = float(metrics["mean-mse"])
    if "mean-floor-psnr" in metrics:
        _floors(score, metrics)


def _floors(score: pb.ScoreResponse, metrics: dict[str, Any]) -> None:
    """A node's floors (:mod:`~fedleak.harness.metrics.floors`) into ``score``."""
    for image, p, s, g in zip(score.images, metrics["floor-psnr"], metrics["floor-ssim"],
                              metrics["floor-guess"], strict=True):
        image.floor_psnr, image.floor_ssim = float(p), float(s)
        image.floor_guess = FLOOR_GUESSES[int(g)] if 0 <= int(g) < len(FLOOR_GUESSES) else ""
    made = [FLOOR_GUESSES[int(i)] for i in metrics["floor-guesses"]]
    score.floors.extend(pb.FloorScore(guess=g, mean_psnr=float(p), mean_ssim=float(q))
                        for g, p, q in zip(made, metrics["floor-guess-psnr"],
                                           metrics["floor-guess-ssim"], strict=True))
    score.mean_floor_psnr = float(metrics["mean-floor-psnr"])
    score.mean_floor_ssim = float(metrics["mean-floor-ssim"])
    score.mean_floor_margin = float(metrics["mean-floor-margin"])
    score.above_floor = int(metrics["above-floor"])
    score.floor_margin_db = float(metrics["floor-margin-db"])
    score.floors_scored = True


def score_error(reason: str) -> str:
    """One readable line for a node's error answer to a score query: what to add when it has
    no score handler, what to change when a client mod refused the query, else the reason's
    last line, colours removed."""
    text = ANSI.sub("", reason or "")
    if f"No query function registered with name '{SCORE_ACTION}'" in text:
        return (f"the node's ClientApp has no {SCORE_ACTION!r} query handler: add "
                "`answer_score_queries(app, info)` (fedleak.harness.flower.node.node_scoring: it "
                "answers outside the app's mods), or `@app.query(\"fedleak_score\")` returning "
                "`score_reply(msg, context, info)`, and call `remember_batch` (or fedleak's "
                "`train(..., context=context)`) when training (docs/flower.md)")
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else "no reason given"
    mod = re.search(r"\b(\w+(?:_mod|Mod))\b", last)
    if mod and "expects" in last:
        return (f"a client mod ({mod.group(1)}) refused the score query: {last} — answer it "
                "outside the mod chain with answer_score_queries(app, info) "
                "(fedleak.harness.flower.node.node_scoring)")
    return "the node refused to score: " + last
