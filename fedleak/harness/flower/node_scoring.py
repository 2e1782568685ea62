"""Scoring a reconstruction on the node that trained on the batch: ground truth stays there.

The audit sends the node a query message (``query.fedleak_score``) with its reconstruction of
the node's update of round r (images on [0, 1]) and recovered labels; the node scores it
against the batch it trained on in round r — the one :func:`~fedleak.harness.flower.train.
remember_batch` kept in its Flower state — with the victim's own scorer
(:class:`~fedleak.harness.victim.scoring.round.RoundScorer`: Hungarian matching on MSE, then PSNR,
SSIM, MSE per image and label accuracy, at report precision) under the same budget rule as
``Score``: at most ``fedleak-score-budget`` (node config, default 1) accepted submissions per
round, counted in the node's state, so scoring is never an oracle to climb. Only the scores
go back; the truth images go back only where the node's operator set ``fedleak-allow-reveal``
in its node config, for the comparison picture.

Under SecAgg+ the audit reconstructs the aggregate of several nodes as one batch of all their
images, and sends every surviving node the whole reconstruction (``aggregate`` in the query):
the node first finds its own images in it — each of its images matched to a distinct
reconstructed image, Hungarian on MSE (:func:`~fedleak.harness.metrics.image_metrics.match_among`) —
and scores those as above; ``matched`` indexes the whole reconstruction.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.flower.arrays import record_of, tensors
from fedleak.harness.flower.published_defenses import CLIPPING_NORM_KEY
from fedleak.harness.flower.train import KEEP_ROUNDS, held_batch, held_rounds
from fedleak.harness.metrics.image_metrics import match_among
from fedleak.harness.victim.rounds import Round, RoundBook
from fedleak.harness.victim.scoring.budget import ScoreBudget
from fedleak.harness.victim.scoring.round import RoundScorer, Submission
from fedleak.harness.wire.request_errors import FailedPrecondition, InvalidArgument, NotFound
from fedleak.harness.zoo.datasets import DatasetInfo, ImageDataset

SCORE_ACTION = "fedleak_score"
SCORE_MESSAGE_TYPE = f"query.{SCORE_ACTION}"
SUBMISSION_IMAGES = "fedleak.reconstruction"
#: an entry of the submitted ArrayRecord that the answer echoes as 0 (for Flower's DP mods)
ECHO = "fedleak-echo"
SUBMISSION_CONFIG = "fedleak.submission"
SCORE_METRICS = "fedleak.score"
REVEALED = "fedleak.revealed"
SPENT = "fedleak.scored"
#: Flower error code of a refused submission
SCORE_ERROR = 121


def submission_content(server_round: int, images: torch.Tensor | None, labels: list[int],
                       *, aggregate: bool = False, padding: list[int] | None = None,
                       clipping_norm: float | None = None) -> RecordDict:
    """What the audit sends to a node to have round ``server_round``'s reconstruction scored;
    ``aggregate``: the reconstruction of several nodes' pooled batches (SecAgg+), among which
    the node finds its own images; ``padding``: the reconstruction's placeholder slots.

    Shaped to pass Flower's client mods (module docstring): exactly one ArrayRecord (the
    images; empty without) and one ConfigRecord, which carries ``clipping_norm`` when the
    round's train config did (``fixedclipping_mod`` / ``adaptiveclipping_mod`` read it)."""
    config: dict[str, Any] = {"round": server_round, "labels": list(labels),
                              "aggregate": aggregate, "padding": list(padding or [])}
    if clipping_norm is not None:
        config[CLIPPING_NORM_KEY] = float(clipping_norm)
    arrays = {"images": images.float()} if images is not None else {}
    return RecordDict({SUBMISSION_CONFIG: ConfigRecord(config),
                       SUBMISSION_IMAGES: record_of({**arrays, ECHO: torch.ones(1)})})


def score_reply(msg: Message, context: Context, info: DatasetInfo, *,
                allow_reveal: bool | None = None) -> Message:
    """The node's answer to a score query: its scores, or an error naming what to change.
    ``allow_reveal`` (None: the node config's ``fedleak-allow-reveal``) sends the truth back
    for the comparison picture; only the node's operator may set it."""
    try:
        return Message(_score(msg, context, info, allow_reveal), reply_to=msg)
    except (InvalidArgument, FailedPrecondition, NotFound) as err:
        return Message(Error(SCORE_ERROR, str(err)), reply_to=msg)


def answer_score_queries(app: ClientApp, info: DatasetInfo) -> None:
    """Answer the audit's score queries on ``app`` outside its mod chain: the handler is
    registered as ``@app.query("fedleak_score")`` would, then unwrapped from the app's mods,
    so no client mod (a user's own, Flower's DP mods, ...) ever sees a score query. Call it
    after building the ``ClientApp``, instead of writing the query handler."""
    def score(msg: Message, context: Context) -> Message:
        return score_reply(msg, context, info)

    app.query(SCORE_ACTION)(score)
    registered = getattr(app, "_registered_funcs", None)
    if isinstance(registered, dict) and f"query.{SCORE_ACTION}" in registered:
        registered[f"query.{SCORE_ACTION}"] = score  # outside the chain (flwr >= 1.41)


def _score(msg: Message, context: Context, info: DatasetInfo,
           allow_reveal: bool | None = None) -> RecordDict:
    record = msg.content.config_records.get(SUBMISSION_CONFIG)
    config: dict[str, Any] = dict(record) if record is not None else {}
    if record is None or not isinstance(config.get("round"), int):
        raise InvalidArgument(f"a score query carries a ConfigRecord {SUBMISSION_CONFIG!r} with "
                              "the round and the recovered labels")
    server_round = int(config["round"])
    kept = held_rounds(context)
    if not kept:
        raise FailedPrecondition("this node keeps no training batch: its ClientApp must train "
                                 "with fedleak.harness.flower.train.train(..., context=context), "
                                 "or, with its own loop, call fedleak.harness.flower.train."
                                 "remember_batch(context, server_round, images, labels) with "
                                 "the images (on [0, 1]) it trained on")
    truth = held_batch(context, server_round)
    if truth is None:
        raise NotFound(f"this node keeps the batches of rounds {kept[0]}-{kept[-1]}, not round "
                       f"{server_round}: raise its node config fedleak-keep-rounds (default "
                       f"{KEEP_ROUNDS}) to keep more rounds for the audit")
    images_record = msg.content.array_records.get(SUBMISSION_IMAGES)
    images = tensors(images_record).get("images") if images_record is not None else None
    submitted_labels = config.get("labels", [])
    labels = [int(y) for y in submitted_labels] if isinstance(submitted_labels, list) else []
    submitted_padding = config.get("padding", [])
    padding = [int(j) for j in submitted_padding] if isinstance(submitted_padding, list) else []
    chosen = None
    if config.get("aggregate") is True and images is not None:
        chosen = _own_images(images, labels, truth["images"])
        images = images[chosen]
        labels = [labels[i] for i in chosen.tolist()] if labels else []
        padding = [k for k, j in enumerate(chosen.tolist()) if j in set(padding)]
    scored = _scorer(context, info, truth, server_round).score(
        str(server_round), Submission(images=images, labels=labels,
                                      padding=padding if images is not None else []))
    metrics: dict[str, Any] = {}
    if scored.images is not None:
        s = scored.images
        matched = [i.matched_index for i in s.images]
        metrics.update({"mean-psnr": s.mean_psnr, "mean-ssim": s.mean_ssim,
                        "mean-mse": s.mean_mse,
                        "index": [i.index for i in s.images],
                        "matched": matched if chosen is None else
                        [int(chosen[m]) for m in matched],
                        "psnr": [i.psnr for i in s.images], "ssim": [i.ssim for i in s.images],
                        "mse": [i.mse for i in s.images],
                        "padding": [int(i.padding) for i in s.images],
                        "exact-index": [i.exact_index if chosen is None or i.exact_index < 0
                                        else int(chosen[i.exact_index])
                                        for i in s.images],
                        "exact": s.exact, "successes": s.successes})
        if s.best_psnr is not None:
            metrics["best-psnr"] = s.best_psnr
    if scored.label_accuracy is not None:
        metrics["label-accuracy"] = scored.label_accuracy
    partition = context.node_config.get("partition-id")
    if isinstance(partition, int) and not isinstance(partition, bool):
        metrics["partition-id"] = partition
    # the submitted ArrayRecord echoed, its ECHO entry zeroed: Flower's DP mods find the one
    # ArrayRecord they expect, with the keys they sent and a nonzero "update" (their clipping
    # divides by its norm), and clip or noise the echo, which the audit ignores
    echo = tensors(images_record) if images_record is not None else {}
    out = RecordDict({SCORE_METRICS: MetricRecord(metrics),
                      SUBMISSION_IMAGES: record_of({**echo, ECHO: torch.zeros(1)})})
    reveal = context.node_config.get("fedleak-allow-reveal") is True \
        if allow_reveal is None else allow_reveal
    if reveal:
        shown = truth["images"].float().contiguous()
        out[REVEALED] = ConfigRecord({"images": shown.numpy().tobytes(),
                                      "shape": list(shown.shape)})
    return out


def revealed_images(content: RecordDict) -> torch.Tensor | None:
    """The truth a node revealed in its score answer (float32 [n, C, H, W]), or None."""
    record = content.config_records.get(REVEALED)
    if record is None:
        return None
    data, shape = record.get("images"), record.get("shape")
    if not isinstance(data, bytes) or not isinstance(shape, list):
        return None
    values = np.frombuffer(data, dtype="<f4").copy()
    if values.size != int(np.prod([int(x) for x in shape])):
        return None
    return torch.from_numpy(values).view(*[int(x) for x in shape])


def _own_images(images: torch.Tensor, labels: list[int], truth: torch.Tensor) -> torch.Tensor:
    """Which of an aggregate's reconstructed images are this node's: each of its images
    matched to its own reconstructed image (Hungarian on MSE, :func:`match_among`), the rest
    belonging to other nodes. Checked first, so a bad submission spends no budget."""
    if images.dim() != 4 or tuple(images.shape[1:]) != tuple(truth.shape[1:]):
        raise InvalidArgument(f"reconstruction has shape {list(images.shape)}; an aggregate's "
                              f"is [N, {', '.join(map(str, truth.shape[1:]))}] on [0, 1]")
    if images.shape[0] < truth.shape[0]:
        raise InvalidArgument(f"the aggregate's reconstruction has {images.shape[0]} images, "
                              f"fewer than the {truth.shape[0]} this node trained on")
    if labels and len(labels) != images.shape[0]:
        raise InvalidArgument(f"{len(labels)} labels submitted for {images.shape[0]} images")
    if not images.is_floating_point() or not torch.isfinite(images).all():
        raise InvalidArgument("reconstruction must hold finite floating-point values")
    return match_among(images.float().clamp(0, 1), truth.float())


def _scorer(context: Context, info: DatasetInfo, truth: dict[str, torch.Tensor],
            server_round: int) -> RoundScorer:
    """The victim's scorer over this node's batch, its budget already spent as often as the
    node's state records (and the record moved on by one when the submission is accepted)."""
    limit = context.node_config.get("fedleak-score-budget", 1)
    budget = _CountingBudget(context, int(limit) if isinstance(limit, int) else 1)
    target = ("round", str(server_round), ())
    for _ in range(budget.recorded(server_round)):
        ScoreBudget.spend(budget, target, "")
    data = ImageDataset(truth["images"].float(), truth["labels"].long(), info)
    rounds = RoundBook()
    rounds.remember(Round(str(server_round), torch.arange(len(data)), Protocol()))
    return RoundScorer(data, nn.Identity(), rounds, budget)


class _CountingBudget(ScoreBudget):
    """:class:`ScoreBudget` whose accepted spends are also counted in the node's Flower state,
    which outlives the ClientApp object (a new one may serve every message)."""

    def __init__(self, context: Context, limit: int) -> None:
        super().__init__(max(1, limit))
        self.context = context

    def recorded(self, server_round: int) -> int:
        spent = self.context.state.get(SPENT)
        if not isinstance(spent, ConfigRecord):
            return 0
        count = spent.get(str(server_round), 0)
        return count if isinstance(count, int) else 0

    def spend(self, target: Any, what: str, images: Iterable[int] = ()) -> None:
        super().spend(target, f"round {target[1]} of this node", images)
        server_round = int(target[1])
        self.context.state[SPENT] = ConfigRecord({str(server_round):
                                                  self.recorded(server_round) + 1})
