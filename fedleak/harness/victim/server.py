"""The victim's gRPC service: translates ``fedleak.v1`` messages to :class:`Victim` calls.

Every RPC validates what it receives; a bad request is answered with a status code and a
message a person can act on, and the server keeps serving. Health checking and reflection are
enabled so generic gRPC tools (grpcurl, grpc_health_probe) work. ``Reveal`` requires the
victim's token in the ``x-fedleak-token`` metadata entry, compared in constant time.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import Any

import grpc
import torch

from fedleak.harness.shared.protocol import ProtocolChanges
from fedleak.harness.victim.release_rpc import release_stream, score_release
from fedleak.harness.victim.victim import Victim
from fedleak.harness.wire.channel import (
    DEFAULT_MAX_MESSAGE_BYTES,
    TOKEN_METADATA_KEY,
    message_options,
)
from fedleak.harness.wire.codec import decode_tensor, dtype_to_pb, encode_tensor
from fedleak.harness.wire.errors import InvalidArgument, Unauthenticated, answer_errors
from fedleak.harness.wire.protocol import changes_from_pb, protocol_to_pb
from fedleak.harness.wire.serving import start_grpc_server
from fedleak.v1 import victim_pb2 as pb
from fedleak.v1 import victim_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Victim"].full_name


class VictimServicer(pb_grpc.VictimServicer):
    """``fedleak.v1.Victim`` backed by a :class:`Victim`."""

    def __init__(self, victim: Victim, token: str | None, max_message_bytes: int) -> None:
        self.victim = victim
        self.token = token
        self.max_message_bytes = max_message_bytes

    @answer_errors
    def Describe(self, request: pb.DescribeRequest, context: Any) -> pb.DescribeResponse:
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
        result = self.victim.compute_update(params, buffers, changes)
        names = [name for name, *_ in self.victim.parameter_infos()]
        return pb.ComputeUpdateResponse(
            round_id=result.round_id,
            update=[encode_tensor(u, n) for n, u in zip(names, result.update, strict=True)],
            update_kind=result.update_kind,
            protocol=protocol_to_pb(result.protocol, result.num_images),
            num_images=result.num_images,
            local_steps=result.local_steps,
            metadata=result.metadata,
        )

    def _round_inputs(self, request: Any) -> tuple[dict, dict, ProtocolChanges]:
        """Decoded parameters, buffers and the server's protocol changes of a round request."""
        if not request.parameters:
            raise InvalidArgument("the request carries no parameters: send every parameter "
                                  "that Describe lists (the global model θ)")
        params = _decode_named(request.parameters, "parameter")
        buffers = _decode_named(request.buffers, "buffer")
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
        round_, result = self.victim.begin_secagg(params, buffers, changes)
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
        if not request.round_id:
            raise InvalidArgument("round_id is empty: pass the round_id ComputeUpdate returned")
        if self.victim.releaser.get(request.round_id) is not None:  # KKT candidates
            return score_release(self.victim.releaser, request)
        if not request.HasField("images") and not request.HasField("features"):
            raise InvalidArgument("no images: submit the reconstruction as a [n, C, H, W] tensor "
                                  "(or recovered layer inputs as features with feature_layer)")
        reply = pb.ScoreResponse()
        labels = list(request.labels)
        if request.HasField("images"):
            images = decode_tensor(request.images, "images")
            score = self.victim.score(request.round_id, images, labels, list(request.user_ids))
            reply.images.extend(
                pb.ImageScore(index=s.index, matched_index=s.matched_index, psnr=s.psnr,
                              ssim=s.ssim, mse=s.mse)
                for s in score.images
            )
            reply.mean_psnr, reply.mean_ssim = score.mean_psnr, score.mean_ssim
            reply.mean_mse, accuracy = score.mean_mse, score.label_accuracy
        else:
            accuracy = self.victim.score_labels(request.round_id, labels, list(request.user_ids))
        reply.labels_scored = accuracy is not None
        reply.label_accuracy = accuracy or 0.0
        if request.HasField("features"):
            features = decode_tensor(request.features, "features")
            scored = self.victim.score_features(request.round_id, features,
                                                request.feature_layer)
            reply.features_scored = True
            reply.features.extend(
                pb.FeatureScore(index=f.index, matched_index=f.matched_index, cosine=f.cosine,
                                relative_error=f.relative_error)
                for f in scored.features
            )
            reply.mean_feature_cosine = scored.mean_cosine
            reply.mean_feature_relative_error = scored.mean_relative_error
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
        sent = dict(context.invocation_metadata()).get(TOKEN_METADATA_KEY, "")
        if not self.token:
            raise Unauthenticated("this victim has no token, so token-guarded calls are off; "
                                  "start it with --token or --allow-reveal")
        if not hmac.compare_digest(str(sent).encode(), self.token.encode()):
            raise Unauthenticated(f"missing or wrong token: send the victim's token in the "
                                  f"{TOKEN_METADATA_KEY!r} metadata entry (--token)")


def _info(name: str, shape: Iterable[int], dtype: torch.dtype) -> pb.TensorInfo:
    return pb.TensorInfo(name=name, shape=list(shape), dtype=dtype_to_pb(dtype))


def _decode_named(messages: Iterable[pb.Tensor], what: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for message in messages:
        if not message.name:
            raise InvalidArgument(f"a {what} tensor has no name: name each tensor as Describe "
                                  "lists it")
        if message.name in out:
            raise InvalidArgument(f"{what} {message.name!r} is sent twice")
        out[message.name] = decode_tensor(message, what)
    return out


def start_server(
    victim: Victim,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    tls_cert: bytes | None = None,
    tls_key: bytes | None = None,
    workers: int = 4,
) -> tuple[grpc.Server, int]:
    """Start serving ``victim``; returns the server and the bound port (``port=0``: a free one)."""
    credentials = None
    if tls_cert and tls_key:
        credentials = grpc.ssl_server_credentials([(tls_key, tls_cert)])
    servicer = VictimServicer(victim, token, max_message_bytes)
    return start_grpc_server(
        lambda server: pb_grpc.add_VictimServicer_to_server(servicer, server), SERVICE_NAME,
        host, port, options=message_options(max_message_bytes), credentials=credentials,
        workers=workers,
    )
