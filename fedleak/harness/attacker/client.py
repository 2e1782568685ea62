"""The server role's view of a victim: a thin typed client over ``fedleak.v1.Victim``.

Tensors come back as CPU torch tensors; RPC failures surface as :class:`VictimError` with the
victim's status code and message, or a hint when the victim cannot be reached.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
import torch

from fedleak.attacks.published import PublishedDefense
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.wire.channel import (
    DEFAULT_MAX_MESSAGE_BYTES,
    SCORE_TOKEN_METADATA_KEY,
    TOKEN_METADATA_KEY,
    message_options,
)
from fedleak.harness.wire.codec import decode_tensor, encode_tensor
from fedleak.harness.wire.protocol_spec import protocol_from_pb, protocol_to_pb
from fedleak.harness.wire.reachability import diagnose, split_address
from fedleak.v1 import victim_pb2 as pb
from fedleak.v1 import victim_pb2_grpc as pb_grpc


class VictimError(RuntimeError):
    """A failed call to the victim; ``code`` is the gRPC status."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.details = message


@dataclass
class ReceivedUpdate:
    """What the server receives for one round."""

    round_id: str
    names: list[str]
    update: list[torch.Tensor]
    update_kind: str
    protocol: Protocol
    num_images: int
    local_steps: int
    metadata: dict[str, str]
    user_ids: list[int] = field(default_factory=list)  # secure aggregation: whose data is in it
    #: the buffers (BatchNorm running statistics) local training left, when the victim sends them
    buffers: dict[str, torch.Tensor] | None = None
    #: the defense chain this update itself publishes (a Flower reply's; empty: published as
    #: none; None: not published); a victim publishes its chain once, in ``Describe``
    defenses: tuple[PublishedDefense, ...] | None = None


class VictimClient:
    """Connect to a victim at ``address`` (``host:port``)."""

    def __init__(
        self,
        address: str,
        token: str | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        tls_ca: bytes | None = None,
        timeout: float = 600.0,
        score_token: str | None = None,
    ) -> None:
        split_address(address)  # a clear error now rather than a timeout later
        options = message_options(max_message_bytes)
        if tls_ca is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=tls_ca)
            self.channel = grpc.secure_channel(address, creds, options=options)
        else:
            self.channel = grpc.insecure_channel(address, options=options)
        self.stub = pb_grpc.VictimStub(self.channel)
        self.address = address
        self.token = token
        self.score_token = score_token
        self.tls_ca = tls_ca
        self.timeout = timeout

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> VictimClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, request: object, guarded: bool = False,
              scored: bool = False) -> Any:
        """Call RPC ``method`` of the victim; failures become :class:`VictimError`.

        ``guarded`` sends the victim's token, ``scored`` the evaluator's (when held).
        """
        metadata = []
        if guarded and self.token:
            metadata.append((TOKEN_METADATA_KEY, self.token))
        if scored and self.score_token:
            metadata.append((SCORE_TOKEN_METADATA_KEY, self.score_token))
        try:
            return getattr(self.stub, method)(request, timeout=self.timeout,
                                              metadata=metadata or None)
        except grpc.RpcError as err:
            code, details = err.code(), err.details()
            if code == grpc.StatusCode.UNAVAILABLE and "dropped out" not in (details or ""):
                details = (f"cannot reach the victim at {self.address} ({details}); is "
                           "`fedleak victim serve` running there?")
            raise VictimError(code, details or "") from None

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until the channel is connected, or raise :class:`VictimError`."""
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise VictimError(grpc.StatusCode.UNAVAILABLE,
                              f"no victim answered at {self.address} within {timeout:.0f} s: "
                              f"{diagnose(self.address, self.tls_ca)}") from None

    def describe(self) -> pb.DescribeResponse:
        """The victim's public description; it also says whether the tokens held match."""
        return self._call("Describe", pb.DescribeRequest(), guarded=True, scored=True)

    def global_model(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        reply = self._call("GetGlobalModel", pb.GetGlobalModelRequest())
        return _named(reply.parameters), _named(reply.buffers)

    def compute_update(
        self,
        parameters: Mapping[str, torch.Tensor],
        buffers: Mapping[str, torch.Tensor],
        protocol: Protocol | None = None,
    ) -> ReceivedUpdate:
        request = pb.ComputeUpdateRequest(
            parameters=[encode_tensor(t, n) for n, t in parameters.items()],
            buffers=[encode_tensor(t, n) for n, t in buffers.items()],
            protocol=None if protocol is None else protocol_to_pb(protocol),
        )
        reply = self._call("ComputeUpdate", request)
        return ReceivedUpdate(
            round_id=reply.round_id,
            names=[t.name for t in reply.update],
            update=[decode_tensor(t, "update") for t in reply.update],
            update_kind=reply.update_kind,
            protocol=protocol_from_pb(reply.protocol),
            num_images=reply.num_images,
            local_steps=reply.local_steps,
            metadata=dict(reply.metadata),
            buffers={t.name: decode_tensor(t, "buffers") for t in reply.buffers} or None,
        )

    def begin_informed_trial(self, parameters: Mapping[str, torch.Tensor],
                             buffers: Mapping[str, torch.Tensor]) -> pb.InformedTrial:
        """One trial of the victim's informed-adversary game at ``parameters``."""
        request = pb.BeginInformedTrialRequest(
            parameters=[encode_tensor(t, n) for n, t in parameters.items()],
            buffers=[encode_tensor(t, n) for n, t in buffers.items()])
        return self._call("BeginInformedTrial", request)

    def score_informed_guess(self, trial_id: str, candidate: int) -> pb.InformedOutcome:
        """Submit the final guess of a trial; the victim says whether it was the target."""
        return self._call("ScoreInformedGuess",
                          pb.InformedGuess(trial_id=trial_id, candidate=candidate), scored=True)

    def score(
        self,
        round_id: str,
        images: torch.Tensor | None,
        labels: list[int] | None = None,
        user_ids: list[int] | None = None,
        features: torch.Tensor | None = None,
        feature_layer: str = "",
        padding: list[int] | None = None,
    ) -> pb.ScoreResponse:
        """Score images on [0, 1] and/or recovered inputs ``features`` of ``feature_layer``;
        ``padding``: the image slots that are placeholders, not reconstructions."""
        request = pb.ScoreRequest(
            round_id=round_id, labels=labels or [], user_ids=user_ids or [],
            feature_layer=feature_layer, padding=padding or [],
        )
        if images is not None:
            request.images.CopyFrom(encode_tensor(images.float(), "images"))
        if features is not None:
            request.features.CopyFrom(encode_tensor(features.float(), "features"))
        return self._call("Score", request, scored=True)

    def score_text(self, round_id: str, tokens: torch.Tensor | None,
                   token_set: list[int] | None = None, token_counts: list[int] | None = None,
                   padding: list[int] | None = None, user_ids: list[int] | None = None
                   ) -> pb.ScoreResponse:
        """Score recovered sentences (token ids ``[m, L]``, -1 after a sentence's end) and/or
        a recovered token set (with counts) of a text round; the answer's ``text``."""
        request = pb.ScoreRequest(round_id=round_id, token_set=token_set or [],
                                  token_counts=token_counts or [], padding=padding or [],
                                  user_ids=user_ids or [])
        if tokens is not None:
            request.tokens.CopyFrom(encode_tensor(tokens.to(torch.int64), "tokens"))
        return self._call("Score", request, scored=True)

    def begin_secagg(
        self,
        parameters: Mapping[str, torch.Tensor],
        buffers: Mapping[str, torch.Tensor],
        protocol: Protocol | None = None,
        audit_id: str = "",
    ) -> pb.BeginSecAggResponse:
        """Start a secure-aggregation round (``audit_id``: as that audit's next trial)."""
        request = pb.BeginSecAggRequest(
            parameters=[encode_tensor(t, n) for n, t in parameters.items()],
            buffers=[encode_tensor(t, n) for n, t in buffers.items()],
            protocol=None if protocol is None else protocol_to_pb(protocol),
            audit_id=audit_id,
        )
        return self._call("BeginSecAgg", request)

    def begin_audit(
        self,
        parameters: Mapping[str, torch.Tensor],
        buffers: Mapping[str, torch.Tensor],
        request: pb.BeginAuditRequest,
        protocol: Protocol | None = None,
    ) -> pb.BeginAuditResponse:
        """Open an audit at θ; ``request`` carries the canary and game settings. The
        evaluator's token goes with it when held: the victim then keeps the audit from being
        evicted by clients without it."""
        full = pb.BeginAuditRequest()
        full.CopyFrom(request)
        full.parameters.extend(encode_tensor(t, n) for n, t in parameters.items())
        full.buffers.extend(encode_tensor(t, n) for n, t in buffers.items())
        if protocol is not None:
            full.protocol.CopyFrom(protocol_to_pb(protocol))
        return self._call("BeginAudit", full, scored=True)

    def run_audit_trials(self, audit_id: str, count: int) -> pb.AuditTrialsResponse:
        """The next ``count`` trials of an audit (the victim may send fewer)."""
        return self._call("RunAuditTrials", pb.AuditTrialsRequest(audit_id=audit_id,
                                                                  count=count))

    def submit_audit_scores(self, audit_id: str, scores: list[float]) -> pb.AuditReport:
        """One score per trial run, once; the victim's bounds."""
        return self._call("SubmitAuditScores",
                          pb.AuditScoresRequest(audit_id=audit_id, scores=scores), scored=True)

    def secagg_step(self, round_id: str, user_id: int, phase: pb.SecAggPhase,
                    message: bytes = b"") -> bytes:
        request = pb.SecAggStepRequest(round_id=round_id, user_id=user_id, phase=phase,
                                       message=message)
        return self._call("SecAggStep", request).message

    def reveal(self, round_id: str) -> tuple[torch.Tensor, torch.Tensor]:
        reply = self._call("Reveal", pb.RevealRequest(round_id=round_id), guarded=True)
        return decode_tensor(reply.images, "images"), torch.tensor(list(reply.labels))

    def release(
        self,
        learning_rate: float = 0.0,
        max_epochs: int = 0,
        target_loss: float = 0.0,
        report_every: int = 0,
        *,
        show_progress: bool = True,
        on_progress: Callable[[pb.ReleaseProgress], bool | None] | None = None,
        timeout: float | None = None,
    ) -> ReceivedRelease:
        """Ask the victim to train and release its model (0 keeps the victim's defaults).

        Shows a tqdm bar over epochs. ``on_progress`` sees every progress message; returning
        True cancels the call (as does Ctrl-C), which stops the victim's training. ``timeout``
        None waits as long as training takes.
        """
        from tqdm import tqdm

        request = pb.ReleaseRequest(learning_rate=learning_rate, max_epochs=max_epochs,
                                    target_loss=target_loss, report_every=report_every)
        stream = self.stub.Release(request, timeout=timeout)
        bar: tqdm | None = None
        history: list[tuple[int, float, float]] = []
        try:
            for message in stream:
                if message.HasField("release"):
                    return _received_release(message.release, history)
                history.append((message.epoch, message.loss, message.train_accuracy))
                if show_progress:
                    if bar is None:
                        bar = tqdm(total=message.max_epochs, desc="victim training the release",
                                   unit="epoch", leave=False, dynamic_ncols=True)
                    bar.update(message.epoch - bar.n)
                    bar.set_postfix(loss=f"{message.loss:.2e}", acc=f"{message.train_accuracy:.0%}")
                if on_progress is not None and on_progress(message):
                    stream.cancel()
        except KeyboardInterrupt:
            stream.cancel()
            raise
        except grpc.RpcError as err:
            details = err.details() or ""
            if "Stream removed" in details or "Socket closed" in details:
                details = (f"the victim at {self.address} went away during the release "
                           f"({details}): its process ended or the connection broke; "
                           "restart it and ask again")
            raise VictimError(err.code(), details) from None
        finally:
            if bar is not None:
                bar.close()
        raise VictimError(grpc.StatusCode.INTERNAL, "the release stream ended without a model")

    def score_release(
        self, release_id: str, candidates01: torch.Tensor, recovered_ssim: float = 0.0
    ) -> pb.ScoreResponse:
        """Score KKT candidates (on [0, 1]) against a release's training set (App. B.3)."""
        request = pb.ScoreRequest(round_id=release_id, recovered_ssim=recovered_ssim,
                                  images=encode_tensor(candidates01.float(), "images"))
        return self._call("Score", request, scored=True)


@dataclass
class ReceivedRelease:
    """A released model as the server receives it (``ReleasedModel``) and the progress seen."""

    release_id: str
    parameters: dict[str, torch.Tensor]
    num_train: int
    input_shape: tuple[int, ...]
    value_range: tuple[float, float]
    binary_task: str
    epochs: int
    loss: float
    train_accuracy: float
    reached_target: bool
    metadata: dict[str, str]
    history: list[tuple[int, float, float]] = field(default_factory=list)


def _received_release(
    message: pb.ReleasedModel, history: list[tuple[int, float, float]]
) -> ReceivedRelease:
    return ReceivedRelease(
        release_id=message.release_id,
        parameters=_named(message.parameters),
        num_train=message.num_train,
        input_shape=tuple(message.input_shape),
        value_range=(message.value_low, message.value_high),
        binary_task=message.binary_task,
        epochs=message.epochs,
        loss=message.loss,
        train_accuracy=message.train_accuracy,
        reached_target=message.reached_target,
        metadata=dict(message.metadata),
        history=history,
    )


def _named(messages: Iterable[pb.Tensor]) -> dict[str, torch.Tensor]:
    return {m.name: decode_tensor(m, m.name) for m in messages}
