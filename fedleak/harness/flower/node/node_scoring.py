"""Scoring a reconstruction on the node that trained on the batch: ground truth stays there.

The audit sends the node a query message (``query.fedleak_score``) with its reconstruction of
the node's update of round r (images on [0, 1]) and recovered labels; the node scores it
against the batch it trained on in round r — the one :func:`~fedleak.harness.flower.node.train.
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

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedleak.harness.flower.arrays import record_of
from fedleak.harness.flower.node.batches import (  # noqa: F401  (SPENT re-exported)
    KEEP_ROUNDS,
    SPENT,
    held_batch,
    held_rounds,
)
from fedleak.harness.flower.node.query_fields import (  # noqa: F401  (re-exported)
    CLIPPING_NORM_KEY,
    ECHO,
    SUBMISSION_CONFIG,
    SUBMISSION_IMAGES,
    QueryRefused,
    ScoreQuery,
    read_query,
)

if TYPE_CHECKING:
    from fedleak.harness.victim.scoring.round import RoundScorer
    from fedleak.harness.zoo.datasets import DatasetInfo

SCORE_ACTION = "fedleak_score"
SCORE_MESSAGE_TYPE = f"query.{SCORE_ACTION}"
SCORE_METRICS = "fedleak.score"
REVEALED = "fedleak.revealed"
#: Flower error code of a refused submission
SCORE_ERROR = 121
#: the constant guesses of the floors, in the order a node's metrics list them
FLOOR_GUESSES = ("grey", "data-set mean", "own mean colour")


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
    for the comparison picture; only the node's operator may set it.

    Every malformed field is answered with an error reply that names it
    (:mod:`~fedleak.harness.flower.node.query_fields`); whatever else the scorer cannot score is
    answered with the reason, never a traceback out of the node's handler."""
    from fedleak.harness.wire.request_errors import RequestError

    try:
        return Message(_score(msg, context, info, allow_reveal), reply_to=msg)
    except (QueryRefused, RequestError) as err:
        return Message(Error(SCORE_ERROR, str(err)), reply_to=msg)
    except (ValueError, TypeError, OverflowError, IndexError, KeyError, RuntimeError) as err:
        return Message(Error(SCORE_ERROR, f"the node could not score this query "
                                          f"({type(err).__name__}: {err}); send the "
                                          "reconstruction the audit sends"), reply_to=msg)


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
    from fedleak.harness.wire.request_errors import FailedPrecondition, NotFound

    query = read_query(msg.content)
    kept = held_rounds(context)
    if not kept:
        raise FailedPrecondition("this node keeps no training batch: its ClientApp must train "
                                 "with fedleak.flower.train(..., context=context), or, with "
                                 "its own loop, call fedleak.flower.remember_batch(context, "
                                 "server_round, images, labels) with "
                                 "the images (on [0, 1]) it trained on")
    truth = held_batch(context, query.server_round)
    if truth is None:
        raise NotFound(f"this node keeps the batches of rounds {kept[0]}-{kept[-1]}, not round "
                       f"{query.server_round}: raise its node config fedleak-keep-rounds "
                       f"(default {KEEP_ROUNDS}) to keep more rounds for the audit")
    images, labels, padding, chosen = query.images, query.labels, query.padding, None
    if query.aggregate and images is not None:
        chosen = _own_images(images, labels, padding, truth["images"])
        images = images[chosen]
        labels = [labels[i] for i in chosen.tolist()] if labels else []
        padding = [k for k, j in enumerate(chosen.tolist()) if j in set(padding)]
    from fedleak.harness.victim.scoring.round import Submission

    scored = _scorer(context, info, truth, query.server_round).score(
        str(query.server_round), Submission(images=images, labels=labels,
                                            padding=padding if images is not None else []))
    metrics = _score_metrics(scored, chosen)
    partition = context.node_config.get("partition-id")
    if isinstance(partition, int) and not isinstance(partition, bool):
        metrics["partition-id"] = partition
    # the submitted ArrayRecord echoed, its ECHO entry zeroed: Flower's DP mods find the one
    # ArrayRecord they expect, with the keys they sent and a nonzero "update" (their clipping
    # divides by its norm), and clip or noise the echo, which the audit ignores
    out = RecordDict({SCORE_METRICS: MetricRecord(metrics),
                      SUBMISSION_IMAGES: record_of({**query.arrays, ECHO: torch.zeros(1)})})
    reveal = context.node_config.get("fedleak-allow-reveal") is True \
        if allow_reveal is None else allow_reveal
    if reveal:
        shown = truth["images"].float().contiguous()
        out[REVEALED] = ConfigRecord({"images": shown.numpy().tobytes(),
                                      "shape": list(shown.shape)})
    return out


def _score_metrics(scored: Any, chosen: torch.Tensor | None) -> dict[str, Any]:
    """A :class:`~fedleak.harness.victim.scoring.round.SubmissionScore` as the answer's
    metrics (``matched`` and ``exact-index`` index the whole submission), floors included."""
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
        if s.floors is not None:
            f = s.floors
            metrics.update({
                "floor-psnr": [float(i.floor_psnr or 0.0) for i in s.images],
                "floor-ssim": [float(i.floor_ssim or 0.0) for i in s.images],
                "floor-guess": [FLOOR_GUESSES.index(i.floor_guess)
                                if i.floor_guess in FLOOR_GUESSES else -1 for i in s.images],
                "floor-guesses": [FLOOR_GUESSES.index(g) for g in f.guesses],
                "floor-guess-psnr": [p for p, _ in f.guesses.values()],
                "floor-guess-ssim": [q for _, q in f.guesses.values()],
                "mean-floor-psnr": f.mean_psnr, "mean-floor-ssim": f.mean_ssim,
                "mean-floor-margin": f.mean_margin, "above-floor": f.above,
                "floor-margin-db": f.margin_db})
    if scored.label_accuracy is not None:
        metrics["label-accuracy"] = scored.label_accuracy
    return metrics


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


def _own_images(images: torch.Tensor, labels: list[int], padding: list[int],
                truth: torch.Tensor) -> torch.Tensor:
    """Which of an aggregate's reconstructed images are this node's: each of its images
    matched to its own reconstructed image (Hungarian on MSE, :func:`~fedleak.harness.metrics.
    image_metrics.match_among`), the rest belonging to other nodes. Checked first, so a bad
    submission spends no budget."""
    from fedleak.harness.metrics.image_metrics import match_among
    from fedleak.harness.wire.request_errors import InvalidArgument

    if images.dim() != 4 or tuple(images.shape[1:]) != tuple(truth.shape[1:]):
        raise InvalidArgument(f"reconstruction has shape {list(images.shape)}; an aggregate's "
                              f"is [N, {', '.join(map(str, truth.shape[1:]))}] on [0, 1]")
    if images.shape[0] < truth.shape[0]:
        raise InvalidArgument(f"the aggregate's reconstruction has {images.shape[0]} images, "
                              f"fewer than the {truth.shape[0]} this node trained on")
    if labels and len(labels) != images.shape[0]:
        raise InvalidArgument(f"{len(labels)} labels submitted for {images.shape[0]} images")
    bad = sorted({j for j in padding if j >= images.shape[0]})
    if bad:
        raise InvalidArgument(f"padding indices {bad[:8]} lie outside the {images.shape[0]} "
                              "submitted images")
    return match_among(images.float().clamp(0, 1), truth.float())


def _scorer(context: Context, info: DatasetInfo, truth: dict[str, torch.Tensor],
            server_round: int) -> RoundScorer:
    """The victim's scorer over this node's batch, its budget already spent as often as the
    node's state records (and the record moved on by one when the submission is accepted)."""
    from torch import nn

    from fedleak.harness.federated.protocol import Protocol
    from fedleak.harness.flower.node.score_budget import NodeBudget
    from fedleak.harness.victim.rounds import Round, RoundBook
    from fedleak.harness.victim.scoring.budget import ScoreBudget
    from fedleak.harness.victim.scoring.round import RoundScorer
    from fedleak.harness.zoo.datasets import ImageDataset

    limit = context.node_config.get("fedleak-score-budget", 1)
    budget = NodeBudget(context, int(limit) if isinstance(limit, int)
                        and not isinstance(limit, bool) else 1)
    target = ("round", str(server_round), ())
    for _ in range(budget.recorded(server_round)):
        ScoreBudget.spend(budget, target, "")
    data = ImageDataset(truth["images"].float(), truth["labels"].long(), info)
    rounds = RoundBook()
    rounds.remember(Round(str(server_round), torch.arange(len(data)), Protocol()))
    return RoundScorer(data, nn.Identity(), rounds, budget)
