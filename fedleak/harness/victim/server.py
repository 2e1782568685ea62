"""The victim's gRPC service: translates ``fedleak.v1`` messages to :class:`Victim` calls.

Every RPC validates what it receives; a bad request is answered with a status code and a
message a person can act on, and the server keeps serving. Health checking and reflection are
enabled so generic gRPC tools (grpcurl, grpc_health_probe) work. ``Reveal`` requires the
victim's token in the ``x-fedleak-token`` metadata entry, compared in constant time.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable, Iterable
from typing import Any

import grpc
import torch

from fedleak.harness.shared.metrics import EXACT_PSNR
from fedleak.harness.shared.protocol import ProtocolChanges
from fedleak.harness.victim.release_rpc import release_stream, score_release
from fedleak.harness.victim.scoring import Submission
from fedleak.harness.victim.victim import Victim
from fedleak.harness.wire.channel import (
    DEFAULT_MAX_MESSAGE_BYTES,
    SCORE_TOKEN_METADATA_KEY,
    TOKEN_METADATA_KEY,
    message_options,
)
from fedleak.harness.wire.codec import (
    check_declared,
    decode_tensor,
    dtype_name,
    dtype_to_pb,
    encode_tensor,
)
from fedleak.harness.wire.errors import InvalidArgument, Unauthenticated, answer_errors, quoted
from fedleak.harness.wire.handlers import add_service
from fedleak.harness.wire.protocol import changes_from_pb, protocol_to_pb
from fedleak.harness.wire.quoting import name_mismatch
from fedleak.harness.wire.serving import Server, server_credentials, start_grpc_server
from fedleak.v1 import victim_pb2 as pb
from fedleak.v1 import victim_pb2_grpc as pb_grpc

SERVICE = pb.DESCRIPTOR.services_by_name["Victim"]
SERVICE_NAME = SERVICE.full_name


class VictimServicer(pb_grpc.VictimServicer):
    """``fedleak.v1.Victim`` backed by a :class:`Victim`."""

    def __init__(self, victim: Victim, token: str | None, max_message_bytes: int,
                 score_token: str | None = None,
                 stopping: threading.Event | None = None) -> None:
        self.victim = victim
        self.token = token
        self.score_token = score_token
        self.max_message_bytes = max_message_bytes
        self.stopping = stopping or threading.Event()

    def _cancelled(self, context: grpc.ServicerContext) -> Callable[[], bool]:
        """Whether a call's work should stop: its client went away or the victim is stopping."""
        return lambda: self.stopping.is_set() or not context.is_active()

    async def Describe(
        self, request: pb.DescribeRequest, context: Any
    ) -> pb.DescribeResponse:
        """Answered on the server's event loop, never queued behind workers (cheap, no lock
        held for long), so it answers while every worker computes or calls stall."""
        return self.describe(context)

    def describe(self, context: Any) -> pb.DescribeResponse:
        v = self.victim
        info = v.info
        return pb.DescribeResponse(
            victim_version=v.version(),
            model=pb.ModelSpec(name=v.config.model.name, options=dict(v.config.model.options)),
            data=pb.DataSpec(
                dataset=info.name,
                shape=list(info.shape),
                num_classes=info.num_classes,
                mean=list(info.mean),
                std=list(info.std),
                class_names=list(info.class_names),
                split=v.config.split,
            ),
            protocol=protocol_to_pb(v.config.protocol, v.config.num_images),
            defenses=[pb.DefenseSpec(name=name, params=params, stage=stage)
                      for name, params, stage in v.config.defenses.describe()],
            parameters=[_info(*i) for i in v.parameter_infos()],
            buffers=[_info(*i) for i in v.buffer_infos()],
            num_private_images=len(v.data.labels),
            reveal_enabled=v.config.reveal_enabled,
            max_message_bytes=self.max_message_bytes,
            num_users=v.config.num_users,
            score_budget=v.config.limits.score_budget,
            image_score_budget=v.score_budget.image_limit,
            image_scores_left=v.score_budget.image_scores_left(),
            images_score_exhausted=v.score_budget.images_exhausted(),
            buffers_returned=v.config.buffers_returned,
            score_token_required=bool(self.score_token),
            token_accepted=_matches(context, TOKEN_METADATA_KEY, self.token),
            score_token_accepted=_matches(context, SCORE_TOKEN_METADATA_KEY, self.score_token),
            limits=pb.VictimLimits(
                max_local_epochs=v.config.limits.max_local_epochs,
                max_local_steps=v.config.limits.max_local_steps,
                max_learning_rate=v.config.limits.max_learning_rate,
                max_release_epochs=v.config.release.max_epochs,
            ),
        )

    @answer_errors
    def GetGlobalModel(self, request: Any, context: Any) -> pb.GetGlobalModelResponse:
        params, buffers = self.victim.global_model()
        return pb.GetGlobalModelResponse(
            parameters=[encode_tensor(t, n) for n, t in params.items()],
            buffers=[encode_tensor(t, n) for n, t in buffers.items()],
        )

    @answer_errors
    def ComputeUpdate(
        self, request: pb.ComputeUpdateRequest, context: Any
    ) -> pb.ComputeUpdateResponse:
        params, buffers, changes = self._round_inputs(request)
        result = self.victim.compute_update(params, buffers, changes, self._cancelled(context))
        names = [name for name, *_ in self.victim.parameter_infos()]
        return pb.ComputeUpdateResponse(
            round_id=result.round_id,
            update=[encode_tensor(u, n) for n, u in zip(names, result.update, strict=True)],
            update_kind=result.update_kind,
            protocol=protocol_to_pb(result.protocol, result.num_images),
            num_images=result.num_images,
            local_steps=result.local_steps,
            metadata=result.metadata,
            buffers=[encode_tensor(b, n) for n, b in (result.buffers or {}).items()],
        )

    def _round_inputs(self, request: Any) -> tuple[dict, dict, ProtocolChanges]:
        """Decoded parameters, buffers and the server's protocol changes of a round request."""
        if not request.parameters:
            raise InvalidArgument("the request carries no parameters: send every parameter "
                                  "that Describe lists (the global model θ)")
        params = _decode_named(request.parameters, "parameter", self.victim.parameter_infos())
        buffers = _decode_named(request.buffers, "buffer", self.victim.buffer_infos())
        changes = ProtocolChanges()
        if request.HasField("protocol"):
            p = request.protocol
            if p.num_images not in (0, self.victim.config.num_images):
                fixed = self.victim.config.num_images
                raise InvalidArgument(f"num_images is fixed at {fixed} by the victim; leave it 0")
            changes = changes_from_pb(p)
        return params, buffers, changes

    @answer_errors
    def BeginSecAgg(self, request: pb.BeginSecAggRequest, context: Any) -> Any:
        params, buffers, changes = self._round_inputs(request)
        round_, result = self.victim.begin_secagg(params, buffers, changes,
                                                  self._cancelled(context))
        assert round_.secagg is not None
        config = round_.secagg.config
        return pb.BeginSecAggResponse(
            round_id=round_.round_id,
            user_ids=sorted(round_.user_indices),
            threshold=config.threshold,
            clip=config.clip,
            vector_length=config.vector_length,
            session=config.session,
            update_kind=result.update_kind,
            protocol=protocol_to_pb(result.protocol, result.num_images),
            images_per_user=result.num_images,
            local_steps=result.local_steps,
            metadata=result.metadata,
        )

    @answer_errors
    def SecAggStep(self, request: pb.SecAggStepRequest, context: Any) -> Any:
        phases = {pb.ADVERTISE_KEYS: "advertise-keys", pb.SHARE_KEYS: "share-keys",
                  pb.MASKED_INPUT: "masked-input", pb.UNMASKING: "unmasking"}
        if request.phase not in phases:
            raise InvalidArgument("phase is unset or unknown: use ADVERTISE_KEYS, SHARE_KEYS, "
                                  "MASKED_INPUT or UNMASKING")
        reply = self.victim.secagg_step(request.round_id, request.user_id,
                                        phases[request.phase], request.message)
        return pb.SecAggStepResponse(message=reply)

    @answer_errors
    def Score(self, request: pb.ScoreRequest, context: Any) -> pb.ScoreResponse:
        """Evaluation: validated, within the budget, at report precision (docs/security.md)."""
        if self.score_token:
            self._require(context, SCORE_TOKEN_METADATA_KEY, self.score_token, "--score-token")
        if not request.round_id:
            raise InvalidArgument("round_id is empty: pass the round_id ComputeUpdate or "
                                  "BeginSecAgg returned, or the release_id of Release")
        if self.victim.releaser.get(request.round_id) is not None:  # KKT candidates
            return score_release(self.victim.releaser, request)
        scorer = self.victim.scorer
        user_ids = list(request.user_ids)
        submission = Submission(labels=list(request.labels), user_ids=user_ids,
                                padding=list(request.padding))
        if request.HasField("images"):  # the round and the declared shape first, then decode
            shape = scorer.expected_shape(request.round_id, user_ids)
            check_declared(request.images, "reconstruction", shape,
                           wanted=f"{list(shape)} (n, C, H, W) on [0, 1], as this round had")
            submission.images = decode_tensor(request.images, "images")
        if request.HasField("features"):
            width = scorer.feature_width(request.round_id, request.feature_layer)
            check_declared(request.features, "features", (None, width))
            submission.features = decode_tensor(request.features, "features")
            submission.feature_layer = request.feature_layer
        score = scorer.score(request.round_id, submission)
        reply = pb.ScoreResponse()
        if score.images is not None:
            reply.images.extend(
                pb.ImageScore(index=s.index, matched_index=s.matched_index, psnr=s.psnr,
                              ssim=s.ssim, mse=s.mse, padding=s.padding,
                              exact=s.exact_index >= 0, exact_index=max(s.exact_index, 0))
                for s in score.images.images
            )
            reply.mean_psnr, reply.mean_ssim = score.images.mean_psnr, score.images.mean_ssim
            reply.mean_mse = score.images.mean_mse
            reply.exact, reply.exact_psnr = score.images.exact, EXACT_PSNR
            reply.best_scored = score.images.best_psnr is not None
            reply.best_psnr = score.images.best_psnr or 0.0
        reply.labels_scored = score.label_accuracy is not None
        reply.label_accuracy = score.label_accuracy or 0.0
        if score.features is not None:
            reply.features_scored = True
            reply.features.extend(
                pb.FeatureScore(index=f.index, matched_index=f.matched_index, cosine=f.cosine,
                                relative_error=f.relative_error)
                for f in score.features.features
            )
            reply.mean_feature_cosine = score.features.mean_cosine
            reply.mean_feature_relative_error = score.features.mean_relative_error
        return reply

    def Release(self, request: pb.ReleaseRequest, context: grpc.ServicerContext) -> Any:
        """Server-streaming model release; see :mod:`fedleak.harness.victim.release_rpc`."""
        yield from release_stream(self.victim.releaser, request, context)

    @answer_errors
    def Reveal(self, request: pb.RevealRequest, context: grpc.ServicerContext) -> Any:
        self._require_token(context)
        images, labels = self.victim.reveal(request.round_id)
        return pb.RevealResponse(images=encode_tensor(images, "images"), labels=labels.tolist())

    def _require_token(self, context: grpc.ServicerContext) -> None:
        if not self.token:
            raise Unauthenticated("this victim has no token, so token-guarded calls are off; "
                                  "start it with --token or --allow-reveal")
        self._require(context, TOKEN_METADATA_KEY, self.token, "--token")

    @staticmethod
    def _require(context: grpc.ServicerContext, key: str, token: str, flag: str) -> None:
        if not _matches(context, key, token):
            raise Unauthenticated(f"missing or wrong token: send the victim's token in the "
                                  f"{key!r} metadata entry ({flag})")


def _info(name: str, shape: Iterable[int], dtype: torch.dtype) -> pb.TensorInfo:
    return pb.TensorInfo(name=name, shape=list(shape), dtype=dtype_to_pb(dtype))


def _decode_named(
    messages: Iterable[pb.Tensor], what: str,
    expected: list[tuple[str, tuple[int, ...], torch.dtype]],
) -> dict[str, torch.Tensor]:
    """Tensors by name, each checked against ``expected`` (name, shape, dtype) before its bytes
    are decoded; a missing, unknown or repeated name is refused with the list to send."""
    infos = {name: (shape, dtype) for name, shape, dtype in expected}
    out: dict[str, torch.Tensor] = {}
    unknown: list[str] = []
    for message in messages:
        if not message.name:
            raise InvalidArgument(f"a {what} tensor has no name: name each tensor as Describe "
                                  "lists it")
        if message.name in out:
            raise InvalidArgument(f"{what} {quoted(message.name)} is sent twice")
        if message.name not in infos:
            unknown.append(message.name)
            continue
        shape, dtype = infos[message.name]
        check_declared(message, f"{what} {quoted(message.name)}", shape, floating=False,
                       wanted=f"{list(shape)}, the model's")
        if message.dtype != dtype_to_pb(dtype):
            raise InvalidArgument(f"{what} {quoted(message.name)} has dtype "
                                  f"{dtype_name(message.dtype)}, the model needs {dtype}")
        out[message.name] = decode_tensor(message, what)
    missing = [name for name in infos if name not in out]
    problem = name_mismatch(what, missing, unknown, len(infos))
    if problem:
        raise InvalidArgument(problem)
    return out


def _matches(context: grpc.ServicerContext, key: str, token: str | None) -> bool:
    """Whether the call's ``key`` metadata entry is ``token`` (constant-time comparison)."""
    if not token:
        return False
    sent = dict(context.invocation_metadata()).get(key, "")
    return hmac.compare_digest(str(sent).encode(), token.encode())


def start_server(
    victim: Victim,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    tls_cert: bytes | None = None,
    tls_key: bytes | None = None,
    workers: int = 8,
    score_token: str | None = None,
    stopping: threading.Event | None = None,
) -> tuple[Server, int]:
    """Start serving ``victim``; returns the server and the bound port (``port=0``: a free one).

    ``stopping``, once set, stops every running computation at its next local step (set it
    before stopping the server). ``workers`` threads leave room for Describe and the health
    check while the victim computes (at most 1 + ``max_queued_computations`` compute at once).
    """
    credentials = server_credentials(tls_cert, tls_key)
    servicer = VictimServicer(victim, token, max_message_bytes, score_token, stopping)
    return start_grpc_server(
        lambda server, pool: add_service(server, servicer, SERVICE, pool), SERVICE_NAME,
        host, port, options=message_options(max_message_bytes), credentials=credentials,
        workers=workers,
    )
