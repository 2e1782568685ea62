"""The ``Release`` RPC and the release branch of ``Score``: messages ↔ :class:`ModelReleaser`.

``Release`` is server-streaming. Training runs on a worker thread and reports through a queue;
the handler turns each report into a ``ReleaseProgress`` (epoch, loss, train accuracy) and the
last message carries the :class:`ReleasedModel` (θ in ``Describe``'s order, n, input shape and
box, the binary task, how training ended, ε when DP-trained). A cancelled call (client gone,
deadline passed) sets a stop flag that training checks at every report, so it ends within
``report_every`` epochs and frees the victim for the next release. Bad requests are answered
with ``INVALID_ARGUMENT`` / ``FAILED_PRECONDITION`` before training starts.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

import grpc

from fedleak.harness.federated.release_training import VALUE_RANGE
from fedleak.harness.victim.release.releaser import (
    MAX_CANDIDATES,
    ModelReleaser,
    ReleaseCancelled,
    ReleaseRecord,
)
from fedleak.harness.victim.scoring import precision
from fedleak.harness.wire.codec import (
    CodecError,
    check_declared,
    declared_shape,
    decode_tensor,
    encode_tensor,
)
from fedleak.harness.wire.request_errors import InvalidArgument, RequestError
from fedleak.v1 import victim_pb2 as pb

log = logging.getLogger(__name__)


def release_stream(
    releaser: ModelReleaser, request: pb.ReleaseRequest, context: grpc.ServicerContext
) -> Iterator[pb.ReleaseProgress]:
    """Validate, train on a worker thread, stream progress, then the released model."""
    try:
        config = releaser.training_config(request.learning_rate, request.max_epochs,
                                          request.target_loss, request.report_every)
        releaser.check_releasable()
    except RequestError as err:
        context.abort(err.code, str(err))
    events: queue.Queue[tuple[int, float, float] | None] = queue.Queue()
    stop = threading.Event()
    context.add_callback(stop.set)
    outcome: dict[str, Any] = {}

    def train() -> None:
        try:
            outcome["record"] = releaser.release(
                config, on_epoch=lambda e, loss, acc: events.put((e, loss, acc)), stop=stop
            )
        except ReleaseCancelled as err:
            log.warning("release training stopped: the client %s of %d", err, config.max_epochs)
            outcome["error"] = err
        except BaseException as err:  # noqa: BLE001 - handed to the handler thread
            outcome["error"] = err
        finally:
            events.put(None)

    threading.Thread(target=train, name="release-training", daemon=True).start()
    try:
        while (event := events.get()) is not None:
            epoch, loss, accuracy = event
            yield pb.ReleaseProgress(epoch=epoch, max_epochs=config.max_epochs, loss=loss,
                                     train_accuracy=accuracy)
    finally:
        stop.set()  # the generator is closed when the client goes away
    error = outcome.get("error")
    if isinstance(error, ReleaseCancelled):
        context.abort(grpc.StatusCode.CANCELLED, f"release training {error}")
    if isinstance(error, RequestError):
        context.abort(error.code, str(error))
    if error is not None:
        log.error("release training failed", exc_info=error)
        context.abort(grpc.StatusCode.INTERNAL, f"{type(error).__name__}: {error}")
    record: ReleaseRecord = outcome["record"]
    result = record.result
    yield pb.ReleaseProgress(
        epoch=result.epochs, max_epochs=config.max_epochs, loss=result.loss,
        train_accuracy=result.train_accuracy,
        release=pb.ReleasedModel(
            release_id=record.release_id,
            parameters=[encode_tensor(p.detach(), n) for n, p in record.model.named_parameters()],
            num_train=len(record.indices),
            input_shape=list(releaser.data.info.shape),
            value_low=VALUE_RANGE[0],
            value_high=VALUE_RANGE[1],
            binary_task=releaser.task(),
            epochs=result.epochs,
            loss=result.loss,
            train_accuracy=result.train_accuracy,
            reached_target=result.reached_target,
            metadata=record.metadata,
        ),
    )


def score_release(releaser: ModelReleaser, request: pb.ScoreRequest) -> pb.ScoreResponse:
    """Score KKT candidates against a release's training set (App. B.3) with margins, each
    sample beside its floors (``successes``: recovered at ``recovered_ssim`` *and* ≥ 3 dB of
    PSNR above the floor).

    The declared shape and dtype are checked before the candidates are decoded; the release's
    budget is spent only by a valid submission; scores go out at report precision.
    """
    if not request.HasField("images"):
        raise InvalidArgument("no candidates: submit them as images [M, C, H, W] on [0, 1]")
    if request.padding:
        raise InvalidArgument("padding applies to a round's reconstruction, not to KKT "
                              "candidates: leave it empty for a release")
    shape = tuple(releaser.data.info.shape)
    try:
        check_declared(request.images, "candidates", (None, *shape),
                       wanted=f"[M, {', '.join(map(str, shape))}] on [0, 1]")
        if declared_shape(request.images)[0] > MAX_CANDIDATES:
            raise InvalidArgument(f"{declared_shape(request.images)[0]} candidates; submit at "
                                  f"most {MAX_CANDIDATES} (post-process them first)")
        candidates = decode_tensor(request.images, "images")
    except CodecError as err:
        raise InvalidArgument(str(err)) from err
    score = releaser.score(request.round_id, candidates, request.recovered_ssim)
    match, floors = score.match, score.floors
    best, best_ssim = floors.scores.best_psnr, floors.scores.best_ssim
    guess, summary = floors.scores.best_guess, floors.summary
    return pb.ScoreResponse(
        images=[
            pb.ImageScore(index=i, matched_index=int(match.nearest[i]),
                          psnr=precision.psnr(float(match.psnr[i])),
                          ssim=precision.unit(float(match.ssim[i])),
                          mse=precision.significant(float(match.mse[i])),
                          margin=precision.significant(float(score.margins[i]), 5),
                          voters=int(match.voters[i]),
                          floor_psnr=precision.psnr(float(best[i])),
                          floor_ssim=precision.unit(float(best_ssim[i])), floor_guess=guess[i])
            for i in range(len(match.ssim))
        ],
        mean_psnr=precision.psnr(float(match.psnr.mean())),
        mean_ssim=precision.unit(float(match.ssim.mean())),
        mean_mse=precision.significant(float(match.mse.mean())),
        recovered=score.recovered,
        recovered_ssim=score.threshold,
        floors_scored=True,
        floors=[pb.FloorScore(guess=g, mean_psnr=precision.psnr(p), mean_ssim=precision.unit(q))
                for g, (p, q) in summary.guesses.items()],
        mean_floor_psnr=precision.psnr(summary.mean_psnr),
        mean_floor_ssim=precision.unit(summary.mean_ssim),
        mean_floor_margin=precision.psnr(summary.mean_margin),
        above_floor=summary.above, floor_margin_db=summary.margin_db,
        successes=floors.recovered_above,
    )
